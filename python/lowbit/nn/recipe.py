"""Recipes of the low-precision linear layers: which operands of the three matmuls of a linear
layer are quantized, to which format, with which scale granularity.

A linear layer Y = X W^T + b (X: tokens x in, W: out x in, G = dL/dY: tokens x out) runs three
matmuls: the forward (X, W), the input gradient dX = G W (G, W) and the weight gradient
dW = G^T X (G, X). A :class:`LinearRecipe` says, for each, whether it runs in the input's own
dtype or as a scaled matmul of quantized operands; SwitchBack, its variants, the tensor-wise fp8
baseline and the plain layer (for gradcheck) are recipes of the one autograd Function in
lowbit.nn.linear. Granularities are named on the tensors as the layer holds them (X, W and G
in the shapes above), whatever transposes the matmul needs:

    forward       X: "rows" (per token) or "tensor";  W: "tensor" or "rows" (per out feature)
    grad_input    G: "rows" (per token) or "tensor";  W: "tensor" or "columns" (per in feature)
    grad_weight   G: "tensor" or "columns" (per out feature); X: "tensor" or "columns"

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

# The formats the layers quantize to: int8 symmetric absmax (127 * x / amax) and the two OCP
# fp8 formats (scale fp8_max / amax).
FORMATS = ("int8_sym", "e4m3fn", "e5m2")

_SLOTS = {
    "forward": (("X", ("rows", "tensor")), ("W", ("tensor", "rows"))),
    "grad_input": (("G", ("rows", "tensor")), ("W", ("tensor", "columns"))),
    "grad_weight": (("G", ("tensor", "columns")), ("X", ("tensor", "columns"))),
}


@dataclass(frozen=True)
class Operand:
    """One operand of a matmul: its format (one of :data:`FORMATS`) and scale granularity;
    ``Operand()`` (fmt None) is an operand left in the input's dtype."""

    fmt: Optional[str] = None
    granularity: str = "tensor"


@dataclass(frozen=True)
class Matmul:
    """The two operands of one matmul of the layer; both quantized or neither."""

    a: Operand = field(default_factory=Operand)
    b: Operand = field(default_factory=Operand)

    @property
    def quantized(self) -> bool:
        return self.a.fmt is not None


HIGH_PRECISION = Matmul()


@dataclass(frozen=True)
class LinearRecipe:
    """How a low-precision linear layer computes its three matmuls (module docstring).

    name: shown in the module's repr.
    forward, grad_input, grad_weight: the matmuls (:class:`Matmul`); :data:`HIGH_PRECISION`
        runs one with torch in the input's dtype.
    save_quantized_input: keep X for the backward as the forward's codes and scales instead of
        X itself, dequantized for a high-precision weight gradient (SwitchBackM); needs a
        forward whose X is quantized per row and a high-precision grad_weight.
    backend: the scaled matmul's backend for CUDA tensors (:func:`lowbit.scaled_matmul`).
    """

    name: str
    forward: Matmul = HIGH_PRECISION
    grad_input: Matmul = HIGH_PRECISION
    grad_weight: Matmul = HIGH_PRECISION
    save_quantized_input: bool = False
    backend: str = "automatic"

    def __post_init__(self) -> None:
        for slot, specs in _SLOTS.items():
            mm = getattr(self, slot)
            if not isinstance(mm, Matmul):
                raise TypeError(f"{slot}: expected a lowbit.nn.Matmul, got {type(mm).__name__}")
            if (mm.a.fmt is None) != (mm.b.fmt is None):
                raise ValueError(f"{slot}: quantize both operands or neither (got "
                                 f"{mm.a.fmt!r} and {mm.b.fmt!r})")
            if not mm.quantized:
                continue
            for op, (tensor, grains) in zip((mm.a, mm.b), specs):
                if op.fmt not in FORMATS:
                    raise ValueError(f"{slot}: {tensor}'s format {op.fmt!r}: expected one of "
                                     f"{', '.join(FORMATS)}")
                if op.granularity not in grains:
                    raise ValueError(f"{slot}: {tensor}'s granularity {op.granularity!r}: "
                                     f"expected {' or '.join(map(repr, grains))}")
            if (mm.a.fmt == "int8_sym") != (mm.b.fmt == "int8_sym"):
                raise ValueError(f"{slot}: int8 operands multiply int8 operands only (got "
                                 f"{mm.a.fmt} and {mm.b.fmt})")
        if self.save_quantized_input:
            if self.forward.a.granularity != "rows" or not self.forward.quantized or \
                    self.grad_weight.quantized:
                raise ValueError("save_quantized_input: needs a forward whose X is quantized "
                                 "per row and a high-precision grad_weight (SwitchBackM)")
        if not isinstance(self.backend, str):
            raise TypeError(f"backend: expected a name (str), got {type(self.backend).__name__}")

    def with_backend(self, backend: str) -> LinearRecipe:
        return replace(self, backend=backend)


IDENTITY = LinearRecipe("identity")

VARIANTS = ("switchback", "switchback_m", "switchback_q", "tensorwise")


def switchback_recipe(variant: str = "switchback", fmt: str = "int8",
                      backend: str = "automatic") -> LinearRecipe:
    """The recipe of a SwitchBack variant (Wortsman et al., 2023) or of the tensor-wise baseline.

    variant: "switchback" (row-wise X and G, tensor-wise W, 16-bit weight gradient),
        "switchback_m" (the same, X kept for the backward as its int8/fp8 codes),
        "switchback_q" (W row-wise in the forward, column-wise for the input gradient) or
        "tensorwise" (every operand of all three matmuls tensor-wise: the paper's baseline).
    fmt: "int8" (symmetric absmax int8 for every operand) or "fp8" (E4M3 for X and W, E5M2 for
        G).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: expected one of {', '.join(VARIANTS)}")
    if fmt == "int8":
        xw, g = "int8_sym", "int8_sym"
    elif fmt == "fp8":
        xw, g = "e4m3fn", "e5m2"
    else:
        raise ValueError(f"fmt {fmt!r}: expected 'int8' or 'fp8'")
    if variant == "tensorwise":
        return LinearRecipe(
            f"tensorwise_{fmt}",
            forward=Matmul(Operand(xw), Operand(xw)),
            grad_input=Matmul(Operand(g), Operand(xw)),
            grad_weight=Matmul(Operand(g), Operand(xw)),
            backend=backend,
        )
    q = variant == "switchback_q"
    return LinearRecipe(
        f"{variant}_{fmt}",
        forward=Matmul(Operand(xw, "rows"), Operand(xw, "rows" if q else "tensor")),
        grad_input=Matmul(Operand(g, "rows"), Operand(xw, "columns" if q else "tensor")),
        grad_weight=HIGH_PRECISION,
        save_quantized_input=variant == "switchback_m",
        backend=backend,
    )


def named_recipes() -> dict[str, LinearRecipe]:
    """Every named recipe: "identity" and ``<variant>_<fmt>`` for each variant and format."""
    out = {"identity": IDENTITY}
    for v in VARIANTS:
        for f in ("int8", "fp8"):
            r = switchback_recipe(v, f)
            out[r.name] = r
    return out
