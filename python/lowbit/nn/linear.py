"""The low-precision linear layers: one autograd Function driven by a :class:`LinearRecipe`, the
module that holds it (a drop-in nn.Linear), SwitchBackLinear and convert().

The quantized matmuls run lowbit's kernels through the custom ops of lowbit._torch_ops (CPU
tensors: the CPU twin; CUDA tensors: the CUDA kernels on the current stream), so that
torch.compile traces the layer without graph breaks; the high-precision matmuls are torch's own
(cuBLAS on CUDA). The equations are in docs/techniques/switchback.md.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from lowbit import _torch_ops as ops
from lowbit.nn._autograd import differentiable_once
from lowbit.nn._modules import replace_modules
from lowbit.nn.recipe import (
    IDENTITY,
    LinearRecipe,
    Operand,
    named_recipes,
    switchback_recipe,
)

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# The largest finite value of each fp8 format (the delayed scale is fp8_max / amax).
_FP8_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}
# The rows of a layer's amax_history buffer.
_HISTORY_ROW = {"X": 0, "W": 1, "G": 2}


def _quantize(t: torch.Tensor, op: Operand,
              q: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of a 2-d tensor as the matmul reads it (K its last dimension): rows,
    the whole tensor (with a delayed multiplier q: encode(t * q), scale 1/q), or blocks along K
    (1 x k, k x k tiles, MX)."""
    if op.granularity == "rows":
        return ops.eager_or_op("quantize_rows")(t, op.fmt)
    if op.granularity in ("blocks", "tiles"):
        r, k = op.block_shape
        return ops.eager_or_op("quantize_blocks")(t, op.fmt, r, k)
    if op.granularity == "mx":
        return ops.eager_or_op("quantize_mx")(t, op.fmt, op.block)
    if op.scaling == "delayed" and q is not None:
        return ops.eager_or_op("quantize_scaled")(t, q, op.fmt), torch.reciprocal(q)
    return ops.eager_or_op("quantize_tensor")(t, op.fmt)


def _quantize_t(t: torch.Tensor, op: Operand,
                q: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scales of the transpose of a 2-d tensor: per column of t (the column
    quantization writes the transposed codes), the whole tensor (codes transposed after) or
    blocks along t's rows (the transpose's K)."""
    if op.granularity == "columns":
        return ops.eager_or_op("quantize_columns_t")(t, op.fmt)
    if op.block_shape is not None:
        return _quantize(t.t().contiguous(), op)
    codes, scale = _quantize(t, op, q)
    return codes.t().contiguous(), scale


def _mm(a: tuple[torch.Tensor, torch.Tensor], a_op: Operand, b: tuple[torch.Tensor, torch.Tensor],
        b_op: Operand, bias: Optional[torch.Tensor], dtype: torch.dtype,
        backend: str, accumulation: str = "") -> torch.Tensor:
    ab, bb = a_op.block_shape, b_op.block_shape
    return ops.eager_or_op("scaled_mm")(a[0], a[1], a_op.fmt, b[0], b[1], b_op.fmt, bias, dtype,
                                         backend, accumulation, None if ab is None else list(ab),
                                         None if bb is None else list(bb))


def _accumulation(recipe: LinearRecipe, op: Operand) -> str:
    """The recipe's accumulation spec for a matmul of op's format ("" for none, int8)."""
    if recipe.accumulation is None or op.fmt == "int8_sym":
        return ""
    return str(recipe.accumulation)


_FLT_MAX = float(torch.finfo(torch.float32).max)


def _delayed_scale(recipe: LinearRecipe, history: torch.Tensor, tensor: str,
                   t: torch.Tensor) -> Optional[torch.Tensor]:
    """Delayed scaling of `tensor` (X, W or G): the multiplier q = fp8_max / amax from the
    history of earlier steps, then t's own amax pushed into the history (row 0 newest;
    all-reduced first with recipe.reduce_amax). amax is the largest entry (or the newest, with
    amax_reduce="most_recent") that is finite and positive: zeros (no step yet, or an all-zero
    or empty tensor), NaN and Inf are recorded but never set a scale, and q is 1 while no entry
    qualifies; q is capped at float32's largest value (an amax below fp8_max / FLT_MAX would
    overflow it). None if `tensor` is not delayed-scaled."""
    if history is None or not recipe.delayed(tensor):
        return None
    fmt = recipe.delayed_format(tensor)
    row = history[_HISTORY_ROW[tensor]]
    usable = torch.isfinite(row) & (row > 0)
    if recipe.amax_reduce == "max":
        amax = torch.where(usable, row, torch.zeros_like(row)).amax()
    else:  # the newest usable entry (argmax gives the first of equal maxima)
        newest = usable.to(torch.int8).argmax().reshape(1)
        amax = torch.where(usable.gather(0, newest), row.gather(0, newest),
                           torch.zeros_like(row[:1])).reshape(())
    q = torch.where(amax > 0, torch.clamp(torch.full_like(amax, _FP8_MAX[fmt]) / amax,
                                          max=_FLT_MAX), torch.ones_like(amax))
    now = t.detach().abs().amax().to(torch.float32) if t.numel() else \
        torch.zeros((), dtype=torch.float32, device=row.device)
    if recipe.reduce_amax and torch.distributed.is_available() and \
            torch.distributed.is_initialized():
        torch.distributed.all_reduce(now, op=torch.distributed.ReduceOp.MAX)
    with torch.no_grad():
        row.copy_(torch.cat([now.reshape(1), row[:-1]]))
    return q


class LinearFunction(torch.autograd.Function):
    """Y = X W^T + b with the matmuls of ``recipe``; X is 2-d (tokens x in), contiguous, and X,
    W and b share one dtype, which is Y's and every gradient's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                recipe: LinearRecipe,
                amax_history: Optional[torch.Tensor] = None) -> torch.Tensor:
        ctx.recipe = recipe
        ctx.has_bias = bias is not None
        ctx.history = amax_history
        f = recipe.forward
        # Delayed scaling: X's and W's multipliers from their histories (then this step's amax
        # pushed), kept for the backward's uses of the same tensors.
        qx = _delayed_scale(recipe, amax_history, "X", x)
        qw = _delayed_scale(recipe, amax_history, "W", weight)
        qs = tuple(q for q in (qx, qw) if q is not None)
        ctx.q_of = (qx is not None, qw is not None)
        if not f.quantized:
            ctx.save_for_backward(x, weight, *qs)
            return torch.nn.functional.linear(x, weight, bias)
        xq = _quantize(x, f.a, qx)
        wq = _quantize(weight, f.b, qw)
        y = _mm(xq, f.a, wq, f.b, bias, x.dtype, recipe.backend, _accumulation(recipe, f.a))
        # The backward reuses the forward's codes of W where its input gradient takes the same
        # tensor-wise codes (transposed there); X is kept as it is, or as its codes (SwitchBackM).
        gi = recipe.grad_input
        reuse_w = (gi.quantized and f.b.granularity == "tensor" and gi.b.granularity == "tensor"
                   and gi.b.fmt == f.b.fmt and gi.b.scaling == f.b.scaling)
        ctx.reuse_w = reuse_w
        saved_x = xq if recipe.save_quantized_input else (x,)
        saved_w = wq if reuse_w else (weight,)
        ctx.n_x = len(saved_x)
        ctx.save_for_backward(*saved_x, *saved_w, *qs)
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Optional[torch.Tensor], ...]:
        recipe: LinearRecipe = ctx.recipe
        n_q = sum(ctx.q_of)
        saved = ctx.saved_tensors
        saved, q_saved = saved[:len(saved) - n_q], list(saved[len(saved) - n_q:])
        qx = q_saved.pop(0) if ctx.q_of[0] else None
        qw = q_saved.pop(0) if ctx.q_of[1] else None
        g = grad.contiguous()
        dtype = g.dtype
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        qg = _delayed_scale(recipe, ctx.history, "G", g)
        if not recipe.forward.quantized:
            x, weight = saved
            w_codes = None
        else:
            x_saved, w_saved = saved[:ctx.n_x], saved[ctx.n_x:]
            x = x_saved[0] if len(x_saved) == 1 else None
            w_codes = w_saved if ctx.reuse_w else None
            weight = None if ctx.reuse_w else w_saved[0]
            if x is None and need_w:
                # SwitchBackM: X from its codes, value(code) * d in float32, then X's dtype.
                codes, scales = x_saved
                x = ops.eager_or_op("dequantize_rows")(codes, scales,
                                                     recipe.forward.a.fmt).to(dtype)

        dx = dw = db = None
        if need_x:
            gi = recipe.grad_input
            if not gi.quantized:
                dx = g.matmul(weight)
            else:
                if w_codes is not None:
                    wt = (w_codes[0].t().contiguous(), w_codes[1])
                else:
                    wt = _quantize_t(weight, gi.b, qw)
                dx = _mm(_quantize(g, gi.a, qg), gi.a, wt, gi.b, None, dtype, recipe.backend,
                         _accumulation(recipe, gi.a))
        if need_w:
            gw = recipe.grad_weight
            if not gw.quantized:
                dw = g.t().matmul(x)
            else:
                dw = _mm(_quantize_t(g, gw.a, qg), gw.a, _quantize_t(x, gw.b, qx), gw.b, None,
                         dtype, recipe.backend, _accumulation(recipe, gw.a))
        if need_b and ctx.has_bias:
            db = g.sum(0)
        return dx, dw, db, None, None


RecipeLike = Union[LinearRecipe, str]


def _recipe(recipe: Optional[RecipeLike], kwargs: dict[str, Any],
            keywords: bool = False) -> LinearRecipe:
    """The recipe a layer or convert() asked for; with ``keywords`` (convert), None means
    SwitchBack's recipe of the keyword arguments."""
    if recipe is None:
        if keywords:
            return switchback_recipe(**kwargs)
        raise TypeError("recipe: expected a lowbit.nn.LinearRecipe or a recipe name, got None")
    if kwargs:
        raise TypeError(f"recipe: given, so the keywords {sorted(kwargs)} have nothing to "
                        "configure; pass one or the other")
    if isinstance(recipe, LinearRecipe):
        return recipe
    if isinstance(recipe, str):
        known = named_recipes()
        if recipe not in known:
            raise ValueError(f"recipe {recipe!r}: expected one of {', '.join(known)} or a "
                             "lowbit.nn.LinearRecipe")
        return known[recipe]
    raise TypeError(f"recipe: expected a lowbit.nn.LinearRecipe or a name, got "
                    f"{type(recipe).__name__}")


class LowPrecisionLinear(nn.Linear):
    """nn.Linear whose matmuls follow a :class:`LinearRecipe`: same constructor arguments, same
    parameters and state_dict keys (weight, bias), any leading dimensions, float32, bfloat16 or
    float16 (float64 only with the identity recipe), CPU and CUDA, under torch.autocast (the
    input, weight and bias are cast to the autocast dtype, as nn.Linear's matmul is).

    >>> layer = lowbit.nn.LowPrecisionLinear(8, 4, recipe="switchback_int8")
    >>> layer(torch.randn(2, 3, 8)).shape
    torch.Size([2, 3, 4])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *,
                 recipe: RecipeLike = IDENTITY) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = _recipe(recipe, {})
        self._add_history(device)

    def _add_history(self, device: Any) -> None:
        """Delayed scaling's state: buffer amax_history, float32 (3, amax_history), the rows
        X, W and G, column 0 the newest amax (zeros: no step yet), updated by each forward
        (X, W) and backward (G) in training mode and read but left as it is in eval mode. In
        the state_dict, so a checkpoint resumes the scales; only recipes with delayed scaling
        have it."""
        r = self.recipe
        if any(r.delayed(t) for t in _HISTORY_ROW):
            self.register_buffer("amax_history",
                                 torch.zeros(3, r.amax_history, dtype=torch.float32,
                                             device=device))
        else:
            self.amax_history = None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}"

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # .to(dtype), .half(), .bfloat16() cast floating buffers: amax_history stays float32
        # (the scales are float32), moved to wherever the others went.
        history = self.amax_history
        out = super()._apply(fn, recurse)
        if history is not None and self.amax_history is not None and \
                self.amax_history.dtype != torch.float32:
            self.amax_history = history.to(device=self.amax_history.device, dtype=torch.float32)
        return out

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.shape[-1:] != (self.in_features,):
            raise ValueError(f"input: expected a last dimension of in_features="
                             f"{self.in_features}, got shape {tuple(input.shape)}")
        weight, bias = self.weight, self.bias
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.device != input.device:
                raise ValueError(f"input: on {input.device}, but the layer's {name} is on "
                                 f"{t.device}; move one of them")
        if input.device.type == "meta" or self.in_features == 0:
            # Shapes only (meta tensors), or sums of no products: what nn.Linear gives, which
            # no quantization changes.
            return torch.nn.functional.linear(input, weight, bias)
        device = input.device.type
        if torch.is_autocast_enabled(device) and input.is_floating_point() and \
                input.dtype != torch.float64:
            # autocast's own rule for linear: floating tensors other than float64 are cast
            dtype = torch.get_autocast_dtype(device)
            input = input.to(dtype)
            if weight.dtype != torch.float64:
                weight = weight.to(dtype)
            if bias is not None and bias.dtype != torch.float64:
                bias = bias.to(dtype)
        dtype = input.dtype
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None and t.dtype != dtype:
                raise TypeError(f"input: dtype {dtype}, but the layer's {name} is {t.dtype}; "
                                "convert one of them (or use torch.autocast)")
        quantized = self.recipe.forward.quantized or self.recipe.grad_input.quantized or \
            self.recipe.grad_weight.quantized
        if quantized and dtype not in _DTYPES:
            raise TypeError(f"input: dtype {dtype} is not supported by recipe "
                            f"{self.recipe.name}; expected float32, bfloat16 or float16")
        lead = input.shape[:-1]
        x = input.reshape(-1, self.in_features).contiguous()
        weight = weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        history = self.amax_history
        if history is None and any(self.recipe.delayed(t) for t in _HISTORY_ROW):
            raise RuntimeError(f"recipe {self.recipe.name} scales with delayed scaling but the "
                               "layer has no amax_history buffer (build the layer with the "
                               "recipe, or use from_linear / convert)")
        if history is not None and not self.training:
            history = history.clone()  # eval: the scales read the history, which stays as it is
        y = LinearFunction.apply(x, weight, bias, self.recipe, history)
        return y.reshape(*lead, self.out_features)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe: RecipeLike) -> LowPrecisionLinear:
        """A layer of ``recipe`` holding ``linear``'s own parameters (the same Parameter
        objects: optimizers and tied weights keep pointing at them)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  device="meta", recipe=recipe)
        new.weight = linear.weight
        new.bias = linear.bias
        if new.amax_history is not None:
            new.amax_history = torch.zeros_like(new.amax_history, device=linear.weight.device)
        new.train(linear.training)
        return new


class SwitchBackLinear(LowPrecisionLinear):
    """SwitchBack (Wortsman et al., "Stable and low-precision training for large-scale
    vision-language models", NeurIPS 2023): the forward and the input gradient as 8-bit matmuls
    of row-wise quantized inputs/gradients and tensor-wise quantized weights, the weight
    gradient in the input's 16-bit dtype. A drop-in nn.Linear.

    >>> layer = lowbit.nn.SwitchBackLinear(8, 4, variant="switchback_q", fmt="fp8")
    >>> layer(torch.randn(5, 8)).dtype
    torch.float32

    variant: "switchback", "switchback_m" (X saved as its codes for the backward),
        "switchback_q" (W row-wise for the forward, column-wise for the input gradient) or
        "tensorwise" (the tensor-wise baseline: every operand of all three matmuls
        quantized per tensor).
    fmt: "int8" (symmetric absmax int8) or "fp8" (E4M3 for X and W, E5M2 for G; scale
        fp8_max / amax).
    backend: the scaled matmul's backend for CUDA tensors (:func:`lowbit.scaled_matmul`).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, variant: str = "switchback",
                 fmt: str = "int8", backend: str = "automatic") -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype,
                         recipe=switchback_recipe(variant, fmt, backend))


class Float8Linear(LowPrecisionLinear):
    """fp8 training's linear layer: :class:`LowPrecisionLinear` with an fp8 recipe (the same
    Function, parameters and state_dict keys, plus the amax_history buffer of delayed scaling).
    The default recipe is "fp8_tensorwise_delayed" (E4M3 X and W, E5M2 G, tensor-wise scales
    from a 16-step amax history); :func:`lowbit.nn.fp8_recipe` and :func:`named_recipes` give
    the others: row-wise, 1 x 128 / 128 x 128 blocks, MXFP8, and "hopper_emulated" (Hopper's
    accumulation model, run on the CPU twin or simt on any CUDA GPU). On CUDA the matmuls run
    on the recipe's backend ("automatic": native fp8 tensor cores on sm_89+ through cuBLASLt or
    CUTLASS, fp8 widened to 16-bit tensor cores before that, simt for block scales or an
    accumulation model).

    >>> layer = lowbit.nn.Float8Linear(32, 16, recipe="fp8_rowwise")
    >>> layer(torch.randn(4, 32)).shape
    torch.Size([4, 16])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *,
                 recipe: RecipeLike = "fp8_tensorwise_delayed") -> None:
        rec = _recipe(recipe, {})
        fmts = {op.fmt for mm in (rec.forward, rec.grad_input, rec.grad_weight)
                if mm.quantized for op in (mm.a, mm.b)}
        if not fmts or not fmts <= {"e4m3fn", "e5m2"}:
            raise ValueError(f"recipe {rec.name}: Float8Linear needs an fp8 recipe (quantized "
                             f"matmuls of e4m3fn / e5m2 operands), got formats "
                             f"{sorted(fmts) or 'none'}; LowPrecisionLinear takes any recipe")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype,
                         recipe=rec)


def convert(model: nn.Module, recipe: Optional[RecipeLike] = None, *,
            filter: Optional[Callable[[str, nn.Module], bool]] = None,
            **kwargs: Any) -> nn.Module:
    """Replaces, in place, every nn.Linear of ``model`` (exactly nn.Linear, not its subclasses)
    for which ``filter(name, module)`` is true (all of them without a filter) by a
    :class:`LowPrecisionLinear` of ``recipe`` holding the same parameters, so that the
    state_dict keeps its keys and loads into the original model. Returns ``model`` (or the new
    layer when ``model`` is itself an nn.Linear, which cannot be replaced in place).

    >>> net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> net = lowbit.nn.convert(net, variant="switchback", fmt="int8",
    ...                         filter=lambda name, m: m.out_features > 2)
    >>> [type(m).__name__ for m in net]
    ['LowPrecisionLinear', 'ReLU', 'Linear']

    recipe: a :class:`LinearRecipe` or a name of :func:`named_recipes`; or leave it out and pass
        SwitchBackLinear's keywords (variant, fmt, backend).
    filter: called with each candidate's qualified name ("encoder.0.fc1") and module.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    rec = _recipe(recipe, kwargs, keywords=True)
    if filter is not None and not callable(filter):
        raise TypeError(f"filter: expected a callable (name, module) -> bool, got "
                        f"{type(filter).__name__}")

    def wanted(name: str, m: nn.Module) -> bool:
        return type(m) is nn.Linear and (filter is None or bool(filter(name, m)))

    if wanted("", model):
        return LowPrecisionLinear.from_linear(model, rec)  # type: ignore[arg-type]
    return replace_modules(
        model, lambda name, m: LowPrecisionLinear.from_linear(m, rec) if wanted(name, m) else None)
