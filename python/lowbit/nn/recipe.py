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

Block granularities are named on the matmul's operand instead (its K is the contraction axis:
in for the forward, out for the input gradient, tokens for the weight gradient), in every slot:

    "blocks"   1 x ``block`` blocks along K (DeepSeek-V3's 1 x 128 activations and gradients)
    "tiles"    ``block`` x ``block`` tiles of the K-major operand (its 128 x 128 weights)
    "mx"       OCP MX blocks of ``block`` (32) along K with E8M0 scales (MXFP8)

Scaling is "current" (each matmul's operand scaled by its own amax) or "delayed" (tensor-wise
only: the scale comes from the amax history of earlier steps, held by the module; see
:class:`LinearRecipe`). The recipe's ``accumulation`` names how the fp8 matmuls sum
(:class:`lowbit.Accumulation`; the CPU twin and simt run it, the tensor cores refuse one).

This module does not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional, Union

from lowbit._gemm import Accumulation

# The formats the layers quantize to: int8 symmetric absmax (127 * x / amax) and the two OCP
# fp8 formats (scale fp8_max / amax).
FORMATS = ("int8_sym", "e4m3fn", "e5m2")

# Block granularities (along the matmul's K), allowed in every slot.
BLOCK_GRANULARITIES = ("blocks", "tiles", "mx")
SCALINGS = ("current", "delayed")

_SLOTS = {
    "forward": (("X", ("rows", "tensor") + BLOCK_GRANULARITIES),
                ("W", ("tensor", "rows") + BLOCK_GRANULARITIES)),
    "grad_input": (("G", ("rows", "tensor") + BLOCK_GRANULARITIES),
                   ("W", ("tensor", "columns") + BLOCK_GRANULARITIES)),
    "grad_weight": (("G", ("tensor", "columns") + BLOCK_GRANULARITIES),
                    ("X", ("tensor", "columns") + BLOCK_GRANULARITIES)),
}


@dataclass(frozen=True)
class Operand:
    """One operand of a matmul: its format (one of :data:`FORMATS`), scale granularity, block
    length (for the block granularities; 0: 128, or 32 for "mx") and scaling ("current", or
    "delayed" for a tensor-wise fp8 operand); ``Operand()`` (fmt None) is an operand left in the
    input's dtype."""

    fmt: Optional[str] = None
    granularity: str = "tensor"
    block: int = 0
    scaling: str = "current"

    def __post_init__(self) -> None:
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 0:
            raise ValueError(f"block: expected a block length >= 1 (0 for the default), got "
                             f"{self.block!r}")
        if self.block == 0 and self.granularity in BLOCK_GRANULARITIES:
            object.__setattr__(self, "block", 32 if self.granularity == "mx" else 128)
        if self.scaling not in SCALINGS:
            raise ValueError(f"scaling {self.scaling!r}: expected one of {', '.join(SCALINGS)}")
        if self.scaling == "delayed" and self.granularity != "tensor":
            raise ValueError(f"scaling 'delayed': tensor-wise operands only (got granularity "
                             f"{self.granularity!r})")

    @property
    def block_shape(self) -> Optional[tuple[int, int]]:
        """(block_rows, block_k) of the matmul's block scales, None for the others."""
        if self.granularity in ("blocks", "mx"):
            return (1, self.block)
        if self.granularity == "tiles":
            return (self.block, self.block)
        return None


@dataclass(frozen=True)
class Matmul:
    """The two operands of one matmul of the layer; both quantized or neither."""

    a: Operand = field(default_factory=Operand)
    b: Operand = field(default_factory=Operand)

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            op = getattr(self, name)
            if not isinstance(op, Operand):
                raise TypeError(f"{name}: expected a lowbit.nn.Operand (e.g. "
                                f"Operand('e4m3fn', 'rows')), got {type(op).__name__}")

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
    accumulation: None (each backend's own sum) or a :class:`lowbit.Accumulation` (or its spec
        string): how the quantized fp8 matmuls sum; the CPU twin and simt run it (the backend
        must be "automatic" or "simt" on CUDA). 16-bit and int8 matmuls ignore it.
    amax_history: the length of the amax history of each delayed-scaled tensor (X, W, G).
    amax_reduce: how the delayed scale reads the history: "max" (the largest amax of the
        history) or "most_recent" (the previous step's).
    reduce_amax: all-reduce (max) each delayed-scaled amax over the default process group of
        torch.distributed (when it is initialized) before it enters the history, so that every
        rank keeps the same history; without it each rank records its own (and DDP's
        broadcast_buffers, on by default, copies rank 0's histories to the others at each
        forward).
    """

    name: str
    forward: Matmul = HIGH_PRECISION
    grad_input: Matmul = HIGH_PRECISION
    grad_weight: Matmul = HIGH_PRECISION
    save_quantized_input: bool = False
    backend: str = "automatic"
    accumulation: Optional[Union[Accumulation, str]] = None
    amax_history: int = 16
    amax_reduce: str = "max"
    reduce_amax: bool = False

    def __post_init__(self) -> None:
        if self.accumulation is not None:
            object.__setattr__(self, "accumulation", Accumulation.of(self.accumulation))
        if isinstance(self.amax_history, bool) or not isinstance(self.amax_history, int) or \
                self.amax_history < 1:
            raise ValueError(f"amax_history: expected a length >= 1, got {self.amax_history!r}")
        if self.amax_reduce not in ("max", "most_recent"):
            raise ValueError(f"amax_reduce {self.amax_reduce!r}: expected 'max' or 'most_recent'")
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
            for op, (tensor, _) in zip((mm.a, mm.b), specs):
                if op.scaling == "delayed" and op.fmt == "int8_sym":
                    raise ValueError(f"{slot}: {tensor}: delayed scaling is for fp8 operands")
                if op.granularity == "mx" and op.fmt == "int8_sym":
                    raise ValueError(f"{slot}: {tensor}: MX blocks are for fp8 operands")
            ka = mm.a.block_shape[1] if mm.a.block_shape else None
            kb = mm.b.block_shape[1] if mm.b.block_shape else None
            if ka is not None and kb is not None and ka != kb:
                raise ValueError(f"{slot}: the operands' K blocks differ ({ka} and {kb})")
            if (mm.a.granularity == "mx") != (mm.b.granularity == "mx") and (ka and kb):
                raise ValueError(f"{slot}: MX (E8M0) blocks multiply MX blocks or unblocked "
                                 "operands only")
        delayed_fmt: dict[str, str] = {}
        for slot, specs in _SLOTS.items():
            mm = getattr(self, slot)
            for op, (tensor, _) in zip((mm.a, mm.b), specs):
                if mm.quantized and op.scaling == "delayed":
                    if delayed_fmt.setdefault(tensor, op.fmt) != op.fmt:
                        raise ValueError(f"{slot}: {tensor} is delayed-scaled to "
                                         f"{delayed_fmt[tensor]} elsewhere; one delayed scale "
                                         f"per tensor (got {op.fmt})")
        # Asked by every step of the layer (delayed, delayed_format): computed once here.
        object.__setattr__(self, "_delayed", delayed_fmt)
        if self.save_quantized_input:
            if self.forward.a.granularity != "rows" or not self.forward.quantized or \
                    self.grad_weight.quantized:
                raise ValueError("save_quantized_input: needs a forward whose X is quantized "
                                 "per row and a high-precision grad_weight (SwitchBackM)")
        if not isinstance(self.backend, str):
            raise TypeError(f"backend: expected a name (str), got {type(self.backend).__name__}")

    def with_backend(self, backend: str) -> LinearRecipe:
        return replace(self, backend=backend)

    def with_accumulation(self, accumulation: Any, name: Optional[str] = None) -> LinearRecipe:
        """The same recipe summing its fp8 matmuls with ``accumulation`` (and the backend that
        runs a model: "simt" where this recipe's was "automatic" or a tensor-core one)."""
        backend = self.backend if self.backend == "simt" or accumulation is None else "automatic"
        return replace(self, accumulation=accumulation, backend=backend,
                       name=name or self.name)

    @property
    def quantized(self) -> bool:
        return self.forward.quantized or self.grad_input.quantized or self.grad_weight.quantized

    def delayed_format(self, tensor: str) -> Optional[str]:
        """The format that tensor "X", "W" or "G" is delayed-scaled to (None if it is not)."""
        return self._delayed.get(tensor)

    def delayed(self, tensor: str) -> bool:
        """Whether tensor "X", "W" or "G" is delayed-scaled in any matmul."""
        return tensor in self._delayed


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


# The accumulation of Hopper's fp8 tensor cores as the H200 probes pinned it
# (docs/techniques/fp8-training.md, "Hopper's parameters"): slow accumulation (cuBLASLt with fast
# accumulation off, lowbit's CUTLASS kernels); HOPPER_FAST never promotes. Fitted on e4m3 x e4m3.
HOPPER = Accumulation.hopper()
HOPPER_FAST = Accumulation.hopper(fast=True)

FP8_GRANULARITIES = ("tensorwise", "rowwise", "blockwise", "mx")


def fp8_recipe(granularity: str = "tensorwise", scaling: str = "current", *,
               accumulation: Any = None, amax_history: int = 16, amax_reduce: str = "max",
               reduce_amax: bool = False, backend: str = "automatic",
               name: Optional[str] = None) -> LinearRecipe:
    """An fp8 training recipe: all three matmuls in fp8, E4M3 for X and W, E5M2 for G.

    granularity:
        "tensorwise": one scale per tensor for every operand;
        "rowwise": per row of each matmul operand along its K (X and G per token in the
            forward and input gradient, W per out feature / per in feature, G and X per
            feature in the weight gradient);
        "blockwise": DeepSeek-V3's 1 x 128 blocks for X and G (along each matmul's K) and
            128 x 128 tiles for W;
        "mx": OCP MX blocks of 32 along K with E8M0 scales (MXFP8) for every operand.
    scaling: "current" (each operand's own amax) or "delayed" (tensorwise only: X, W and G
        scaled from the module's amax histories of amax_history steps).
    accumulation: how the fp8 matmuls sum (None: each backend's own; a
        :class:`lowbit.Accumulation`, e.g. :data:`HOPPER`, runs on the CPU twin and
        simt, so backend "automatic" picks simt on CUDA).
    """
    if granularity not in FP8_GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}: expected one of "
                         f"{', '.join(FP8_GRANULARITIES)}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling {scaling!r}: expected one of {', '.join(SCALINGS)}")
    if scaling == "delayed" and granularity != "tensorwise":
        raise ValueError("scaling 'delayed': the tensorwise granularity only")
    xw, g = "e4m3fn", "e5m2"

    def op(fmt: str, grain: str) -> Operand:
        return Operand(fmt, grain, scaling=scaling if grain == "tensor" else "current")

    if granularity == "tensorwise":
        t = "tensor"
        fwd, gi, gw = (op(xw, t), op(xw, t)), (op(g, t), op(xw, t)), (op(g, t), op(xw, t))
    elif granularity == "rowwise":
        fwd = (op(xw, "rows"), op(xw, "rows"))
        gi = (op(g, "rows"), op(xw, "columns"))
        gw = (op(g, "columns"), op(xw, "columns"))
    elif granularity == "blockwise":
        fwd = (op(xw, "blocks"), op(xw, "tiles"))
        gi = (op(g, "blocks"), op(xw, "tiles"))
        gw = (op(g, "blocks"), op(xw, "blocks"))
    else:
        fwd, gi, gw = (op(xw, "mx"), op(xw, "mx")), (op(g, "mx"), op(xw, "mx")), \
            (op(g, "mx"), op(xw, "mx"))
    default = {"tensorwise": "fp8_tensorwise", "rowwise": "fp8_rowwise",
               "blockwise": "fp8_blockwise_1x128", "mx": "mxfp8"}[granularity]
    if scaling == "delayed":
        default += "_delayed"
    return LinearRecipe(name or default, forward=Matmul(*fwd), grad_input=Matmul(*gi),
                        grad_weight=Matmul(*gw), backend=backend, accumulation=accumulation,
                        amax_history=amax_history, amax_reduce=amax_reduce,
                        reduce_amax=reduce_amax)


def hopper_recipe(accumulation: Any = HOPPER, granularity: str = "tensorwise",
                  scaling: str = "delayed", **kwargs: Any) -> LinearRecipe:
    """The recipe that native fp8 training on Hopper runs (tensor-wise delayed scaling by
    default), with its matmuls emulated under ``accumulation``, the model of Hopper's fp8
    tensor cores (the default :data:`HOPPER`, fitted to the H200's probes). Runs on the CPU
    twin and simt."""
    kwargs.setdefault("name", "hopper_emulated")
    return fp8_recipe(granularity, scaling, accumulation=accumulation, **kwargs)


def named_recipes() -> dict[str, LinearRecipe]:
    """Every named recipe: "identity", ``<variant>_<fmt>`` for each SwitchBack variant and
    format, and the fp8 training recipes: "fp8_tensorwise", "fp8_tensorwise_delayed",
    "fp8_rowwise", "fp8_blockwise_1x128", "mxfp8" and "hopper_emulated" (the tensor-wise
    delayed recipe under :data:`HOPPER`'s accumulation)."""
    out = {"identity": IDENTITY}
    for v in VARIANTS:
        for f in ("int8", "fp8"):
            r = switchback_recipe(v, f)
            out[r.name] = r
    for r in (fp8_recipe("tensorwise"), fp8_recipe("tensorwise", "delayed"),
              fp8_recipe("rowwise"), fp8_recipe("blockwise"), fp8_recipe("mx"),
              hopper_recipe()):
        out[r.name] = r
    return out
