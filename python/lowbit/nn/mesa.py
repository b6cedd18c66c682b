"""Mesa (Pan et al., "Mesa: A Memory-saving Training Framework for Transformers"): modules whose
forward pass is exact and whose backward pass reads 8-bit copies of what it needs, each channel
group (an attention head) quantized with its own step ``alpha`` and offset ``beta``, running
estimates updated in training mode (docs/techniques/mesa.md has the equations and the memory
accounting).

Each module is a drop-in for its PyTorch counterpart (same parameters and state_dict keys, plus
the ``alpha``/``beta`` buffers of its quantizers):

====================  ===============================================================
module                saves for backward (8-bit codes + G floats of alpha, beta)
====================  ===============================================================
MesaLinear            its input
MesaGELU, MesaSiLU    their input
MesaReLU              its input (the sign is all the backward needs: code > code of 0)
MesaLayerNorm         its input; the statistics are recomputed from it in backward
MesaSoftmax           its output
MesaMatMul            both operands of a @ b (or a @ b^T)
MesaSoftmaxMatMul     softmax(s) @ v: the softmax output once (both backwards read it) and v
MesaMlp               timm's Mlp: its input and the hidden h = fc1(x) (fc2's input act(h) is
                      recomputed from h in backward)
MesaAttention         timm's Attention: qkv and proj inputs, the attention core as above
                      (``core="explicit"``, the paper's) or the qkv projection's output (q, k,
                      v as one tensor, a group per head of each) for a fused
                      scaled_dot_product_attention recomputed in backward (``core="sdpa"``)
====================  ===============================================================

Training mode with gradients enabled quantizes (and updates the estimates); eval mode, or no
input needing a gradient, runs the plain PyTorch op: nothing is quantized, no estimate moves.
CPU tensors run the CPU twin, CUDA tensors the CUDA kernels on the current stream. Under
torch.autocast each op computes in the dtype autocast would give it (linear and matmul in the
autocast dtype; layer_norm and softmax in float32 on CUDA, in their input's dtype on the CPU;
GELU/SiLU/ReLU in their input's dtype; float64 left alone), and its backward in the same
dtype.

:func:`convert` swaps the modules of a timm-style ViT (and of lowbit._tiny's ViT) in place.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from lowbit import _torch_ops as _ops
from lowbit.nn._autograd import differentiable_once
from lowbit.nn._modules import replace_modules

__all__ = [
    "ActQuantizer",
    "DEFAULT_LAYERS",
    "MesaAttention",
    "MesaGELU",
    "MesaLayerNorm",
    "MesaLinear",
    "MesaMatMul",
    "MesaMlp",
    "MesaReLU",
    "MesaSiLU",
    "MesaSoftmax",
    "MesaSoftmaxMatMul",
    "MesaTinyBlock",
    "convert",
    "saved_bytes",
]

_ROUNDINGS = ("nearest_even", "stochastic")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_quant_args(groups, dim, momentum, rounding, random_bits, seed) -> None:
    """ActQuantizer's arguments (convert() checks them before it changes anything)."""
    if not _is_int(groups) or groups < 1:
        raise ValueError(f"groups: expected a positive int, got {groups!r}")
    if not _is_int(dim):
        raise ValueError(f"dim: expected an int, got {dim!r}")
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or \
            not 0.0 <= float(momentum) <= 1.0:
        raise ValueError(f"momentum: expected a value in [0, 1], got {momentum!r}")
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding: expected one of {', '.join(_ROUNDINGS)}, got "
                         f"{rounding!r}")
    if not _is_int(random_bits) or not 1 <= random_bits <= 32:
        raise ValueError(f"random_bits: expected an int in 1..32, got {random_bits!r}")
    if not _is_int(seed) or not 0 <= seed < 2 ** 64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {seed!r}")


class ActQuantizer(nn.Module):
    """The running estimates of one saved activation: ``groups`` groups of consecutive indices
    along ``dim`` (``x.shape[dim]`` must be a multiple of ``groups``), buffers ``alpha`` (the
    step; negative until the first training batch sets it) and ``beta`` (the offset, the running
    minimum). ``momentum`` m: alpha = m alpha + (1 - m) (max - min) / 255, beta = m beta +
    (1 - m) min per batch, before the batch is quantized (every batch is encoded by estimates
    that have seen it); ``lagged=True`` encodes a batch with the estimates of the batches before
    it and updates them from the same read of x (one pass over memory instead of two; the first
    call after construction or load_state_dict updates first). ``enabled=False`` keeps the
    activation itself instead of its codes (the exact-backward baseline of the tests; saves no
    memory)."""

    def __init__(self, groups: int = 1, dim: int = -1, momentum: float = 0.9,
                 rounding: str = "nearest_even", random_bits: int = 16, seed: int = 0,
                 enabled: bool = True, lagged: bool = False) -> None:
        super().__init__()
        _check_quant_args(groups, dim, momentum, rounding, random_bits, seed)
        self.groups, self.dim, self.momentum = groups, dim, float(momentum)
        self.rounding, self.random_bits, self.seed = rounding, random_bits, seed
        self.enabled, self.lagged = enabled, lagged
        self.calls = 0  # the offset of the next stochastic-rounding stream (stochastic only)
        self._estimated = False  # whether alpha, beta hold estimates (lagged mode)
        self.register_buffer("alpha", torch.full((groups,), -1.0))
        self.register_buffer("beta", torch.zeros(groups))

    def extra_repr(self) -> str:
        return (f"groups={self.groups}, dim={self.dim}, momentum={self.momentum}, "
                f"rounding={self.rounding}" + (", lagged=True" if self.lagged else "")
                + ("" if self.enabled else ", enabled=False"))

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._estimated = False  # the loaded estimates may be unset: update before the next use

    def _apply(self, fn, recurse: bool = True):
        # .half() / .to(dtype) cast floating buffers: the estimates stay float32 (a float16
        # copy would round them, or overflow to Inf for an offset beyond 65504), moved to
        # wherever the cast put them.
        alpha, beta = self.alpha, self.beta
        out = super()._apply(fn, recurse)
        if self.alpha.dtype != torch.float32:
            self.alpha = alpha.to(device=self.alpha.device, dtype=torch.float32)
            self.beta = beta.to(device=self.beta.device, dtype=torch.float32)
        return out

    def _state_on(self, x: torch.Tensor) -> None:
        # model.half() / .to(device) move buffers too: the kernels keep them float32.
        if self.alpha.dtype != torch.float32 or self.alpha.device != x.device:
            self.alpha = self.alpha.to(device=x.device, dtype=torch.float32).contiguous()
            self.beta = self.beta.to(device=x.device, dtype=torch.float32).contiguous()

    def group_size(self, x: torch.Tensor) -> int:
        if not -x.dim() <= self.dim < x.dim():
            raise ValueError(f"{type(self).__name__}: dim {self.dim} is out of range for an "
                             f"input of {x.dim()} dimension(s), shape {tuple(x.shape)}")
        c = x.shape[self.dim]
        if c == 0:
            raise ValueError(f"{type(self).__name__}: x.shape[{self.dim}] = 0: the grouped "
                             f"dimension must hold the {self.groups} group(s)")
        if c % self.groups:
            raise ValueError(f"{type(self).__name__}: x.shape[{self.dim}] = {c} is not a "
                             f"multiple of groups = {self.groups}")
        return c // self.groups

    def pack(self, x: torch.Tensor, update: bool = True) -> tuple:
        """What the backward pass keeps of x: (codes, alpha, beta) with the estimates that
        encoded it (copies, so that later batches do not change them), or (x,) when not
        enabled."""
        if not self.enabled:
            return (x.detach(),)
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"{type(self).__name__}: a {x.dtype} activation; 8-bit saving takes "
                            "float32, bfloat16 or float16 (eval mode, or no gradient, runs the "
                            "plain op in any dtype)")
        self._state_on(x)
        gs = self.group_size(x)
        stochastic = self.rounding == "stochastic"
        lagged = self.lagged and self._estimated and update
        if lagged:  # the estimates as they are encode x; the call then updates them
            alpha, beta = self.alpha.clone(), self.beta.clone()
        codes = _ops.eager_or_op("actquant_quantize")(
            x.detach().contiguous(), self.alpha, self.beta, self.dim, gs, update, lagged,
            self.momentum, stochastic, self.random_bits, self.seed,
            self.calls if stochastic else 0)
        if stochastic:
            # Nearest rounding draws no random bits and moves no counter: an int attribute
            # that changed every call would make torch.compile guard on it and recompile at
            # every step. Stochastic rounding does (docs/techniques/mesa.md, torch.compile).
            self.calls += 1
        self._estimated = self._estimated or update
        if not lagged:
            alpha, beta = self.alpha.clone(), self.beta.clone()
        return (codes, alpha, beta)

    def unpack(self, packed: tuple, dtype: torch.dtype) -> torch.Tensor:
        if len(packed) == 1:
            return packed[0].to(dtype)
        codes, alpha, beta = packed
        gs = codes.shape[self.dim] // self.groups
        return _ops.eager_or_op("actquant_dequantize")(codes, alpha, beta, self.dim, gs, dtype)


def _needs_saving(module: nn.Module, *tensors: Optional[torch.Tensor]) -> bool:
    return (module.training and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in tensors))


def _autocast_dtype(x: torch.Tensor) -> Optional[torch.dtype]:
    """The autocast dtype where autocast casts x (a floating tensor other than float64)."""
    dev = x.device.type
    if torch.is_autocast_enabled(dev) and x.is_floating_point() and x.dtype != torch.float64:
        return torch.get_autocast_dtype(dev)
    return None


def _low(x: torch.Tensor, *tensors: Optional[torch.Tensor]) -> torch.dtype:
    """The dtype of an op autocast runs in lower precision (linear, matmul)."""
    d = _autocast_dtype(x)
    if d is not None:
        return d
    out = x.dtype
    for t in tensors:
        if t is not None:
            out = torch.promote_types(out, t.dtype)
    return out


def _fp32(x: torch.Tensor) -> torch.dtype:
    """The dtype of layer_norm and softmax: float32 under CUDA's autocast (its float32 list), the
    input's under the CPU's (which leaves them alone) and without autocast."""
    return torch.float32 if x.device.type == "cuda" and _autocast_dtype(x) is not None \
        else x.dtype


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return None if t is None else t.to(dtype)


def _stash(ctx, tensors: list) -> None:
    """save_for_backward of a flat list that may hold None."""
    ctx.n_saved = len(tensors)
    ctx.none = [t is None for t in tensors]
    ctx.save_for_backward(*[t for t in tensors if t is not None])


def _unstash(ctx) -> list:
    it = iter(ctx.saved_tensors)
    return [None if n else next(it) for n in ctx.none]


# ---- Linear --------------------------------------------------------------------------------


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, quant, dtype):
        xc = x.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            y = F.linear(xc, weight.to(dtype), _cast(bias, dtype))
        packed = quant.pack(xc) if ctx.needs_input_grad[1] else ()
        ctx.quant, ctx.dtype, ctx.x_dtype, ctx.has_bias = quant, dtype, x.dtype, bias is not None
        ctx.n_packed = len(packed)
        _stash(ctx, [*packed, weight, bias])
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        saved = _unstash(ctx)
        packed, weight, bias = saved[:ctx.n_packed], saved[-2], saved[-1]
        gy = gy.to(ctx.dtype)
        gx = gw = gb = None
        with torch.autocast(gy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                gx = (gy @ weight.to(ctx.dtype)).to(ctx.x_dtype)
            if ctx.needs_input_grad[1]:
                xd = ctx.quant.unpack(tuple(packed), ctx.dtype)
                gw = (gy.reshape(-1, gy.shape[-1]).t() @ xd.reshape(-1, xd.shape[-1])
                      ).to(weight.dtype)
            if bias is not None and ctx.needs_input_grad[2]:
                gb = gy.reshape(-1, gy.shape[-1]).sum(0).to(bias.dtype)
        return gx, gw, gb, None, None


class MesaLinear(nn.Linear):
    """nn.Linear whose backward reads an 8-bit copy of its input (groups along the last
    dimension: ``groups`` blocks of in_features / groups channels)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device=None, dtype=None, *, groups: int = 1, **quant) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.quant = ActQuantizer(groups, -1, **quant)

    @classmethod
    def from_linear(cls, m: nn.Linear, groups: int = 1, **quant) -> "MesaLinear":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.in_features, new.out_features = m.in_features, m.out_features
        new.weight, new.bias = m.weight, m.bias
        new.quant = ActQuantizer(groups, -1, **quant).to(m.weight.device)
        new.train(m.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, x, self.weight, self.bias):
            return F.linear(x, self.weight, self.bias)
        return _LinearFn.apply(x, self.weight, self.bias, self.quant,
                               _low(x, self.weight, self.bias))


# ---- element-wise activations ---------------------------------------------------------------


# Whether the activations' backward passes (MesaGELU, MesaSiLU, MesaReLU, MesaMlp) run lowbit's
# fused kernel (actquant_activation_backward: the gradient, and for the MLP the recomputed
# activation, from one read of the codes) where the input was saved as codes; False dequantizes
# and runs torch's derivative kernels instead (the benchmark compares the two).
_FUSED_ACTIVATION_BACKWARD = True


def _fused_activation(act: "_Pointwise", packed: tuple) -> Optional[str]:
    """The fused kernel's name for act's backward from `packed`, or None where it does not run."""
    if len(packed) != 3 or not _FUSED_ACTIVATION_BACKWARD:
        return None
    return act._fused


def _activation_backward(quant: "ActQuantizer", packed: tuple, name: str, dy: torch.Tensor,
                         want_value: bool) -> tuple:
    codes, alpha, beta = packed
    return _ops.eager_or_op("actquant_activation_backward")(
        codes, alpha, beta, quant.dim, codes.shape[quant.dim] // quant.groups, name, dy,
        want_value)


class _PointwiseFn(torch.autograd.Function):
    """y = fn(x) with x saved in 8 bits; the backward is the exact backward of fn at the
    dequantized x: lowbit's fused kernel (torch's derivative formula in lowbit's float32
    arithmetic, within a few float32 ulps of torch's) or `grad(gy, xd)`, the derivative kernel
    autograd itself runs (without evaluating fn again)."""

    @staticmethod
    def forward(ctx, x, module, fn, grad):
        with torch.autocast(x.device.type, enabled=False):
            y = fn(x)
        packed = module.quant.pack(x)
        ctx.module, ctx.fn, ctx.grad, ctx.dtype = module, fn, grad, x.dtype
        ctx.save_for_backward(*packed)
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        packed = ctx.saved_tensors
        name = _fused_activation(ctx.module, packed)
        if name is not None:
            gx, _ = _activation_backward(ctx.module.quant, packed, name, gy.to(ctx.dtype), False)
            return gx, None, None, None
        xd = ctx.module.quant.unpack(packed, ctx.dtype)
        with torch.autocast(gy.device.type, enabled=False):
            return ctx.grad(gy, xd), None, None, None


class _Pointwise(nn.Module):
    _fused: Optional[str] = None  # actquant_activation_backward's name for the function

    def __init__(self, *, groups: int = 1, dim: int = -1, **quant) -> None:
        super().__init__()
        self.quant = ActQuantizer(groups, dim, **quant)

    def _fn(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _grad(self, gy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """gy times _fn's derivative at x, as autograd computes it."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, x):
            return self._fn(x)
        return _PointwiseFn.apply(x, self, self._fn, self._grad)


class MesaGELU(_Pointwise):
    """nn.GELU (``approximate`` "none" or "tanh") saving its input in 8 bits."""

    def __init__(self, approximate: str = "none", **kw) -> None:
        super().__init__(**kw)
        self.approximate = approximate

    @property
    def _fused(self) -> Optional[str]:
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(self.approximate)

    def _fn(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)

    def _grad(self, gy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.gelu_backward(gy, x, approximate=self.approximate)


class MesaSiLU(_Pointwise):
    """nn.SiLU saving its input in 8 bits."""

    _fused = "silu"

    def _fn(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)

    def _grad(self, gy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.silu_backward(gy, x)


def _relu_grad(gy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.threshold_backward(gy, x, 0)  # relu's own backward kernel


class MesaReLU(_Pointwise):
    """nn.ReLU saving its input in 8 bits (its backward needs only x > 0)."""

    _fused = "relu"

    def _fn(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x)

    def _grad(self, gy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return _relu_grad(gy, x)


# ---- the MLP: fc2(act(fc1(x))) -----------------------------------------------------------------


class _MlpFn(torch.autograd.Function):
    """fc2(act(fc1(x))) keeping two tensors in 8 bits, x (fc1.quant) and h = fc1(x)
    (act.quant): fc2's input act(h) is not saved but recomputed in backward from the
    dequantized h, the tensor act's own backward reads. The backward equals autograd's exact
    backward of the MLP with x and h replaced by their dequantized values."""

    @staticmethod
    def forward(ctx, x, w1, b1, w2, b2, qx, qh, act, dtype):
        xc = x.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            h = F.linear(xc, w1.to(dtype), _cast(b1, dtype))
            y = F.linear(act._fn(h), w2.to(dtype), _cast(b2, dtype))
        px = qx.pack(xc) if ctx.needs_input_grad[1] else ()
        ph = qh.pack(h)
        ctx.qx, ctx.qh, ctx.act, ctx.dtype, ctx.x_dtype = qx, qh, act, dtype, x.dtype
        ctx.n_x, ctx.n_h = len(px), len(ph)
        _stash(ctx, [*px, *ph, w1, b1, w2, b2])
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        saved = _unstash(ctx)
        px, ph = tuple(saved[:ctx.n_x]), tuple(saved[ctx.n_x:ctx.n_x + ctx.n_h])
        w1, b1, w2, b2 = saved[-4:]
        need = ctx.needs_input_grad
        dt = ctx.dtype
        gy = gy.to(dt)
        gx = gw1 = gb1 = gw2 = gb2 = None
        with torch.autocast(gy.device.type, enabled=False):
            gy2 = gy.reshape(-1, gy.shape[-1])
            name = _fused_activation(ctx.act, ph)
            if name is not None and (need[0] or need[1] or need[2]):
                # One read of h's codes and fc2's input gradient: the hidden gradient and, for
                # fc2's weight gradient, act(h).
                gh, a = _activation_backward(ctx.qh, ph, name, gy @ w2.to(dt), need[3])
                if need[3]:
                    gw2 = (gy2.t() @ a.reshape(-1, a.shape[-1])).to(w2.dtype)
                    del a
                if b2 is not None and need[4]:
                    gb2 = gy2.sum(0).to(b2.dtype)
                return (*_mlp_input_grads(ctx, px, gh, w1, b1, need), gw2, gb2,
                        None, None, None, None)
            hd = ctx.qh.unpack(ph, dt)
            if need[3]:
                a = ctx.act._fn(hd)
                gw2 = (gy2.t() @ a.reshape(-1, a.shape[-1])).to(w2.dtype)
                del a
            if b2 is not None and need[4]:
                gb2 = gy2.sum(0).to(b2.dtype)
            if need[0] or need[1] or need[2]:
                gh = ctx.act._grad(gy @ w2.to(dt), hd)
                del hd
                gx, gw1, gb1 = _mlp_input_grads(ctx, px, gh, w1, b1, need)
        return gx, gw1, gb1, gw2, gb2, None, None, None, None


def _mlp_input_grads(ctx, px: tuple, gh: torch.Tensor, w1, b1, need) -> tuple:
    """fc1's gradients (input, weight, bias) from the hidden gradient gh."""
    dt = ctx.dtype
    gx = gw1 = gb1 = None
    gh2 = gh.reshape(-1, gh.shape[-1])
    if need[0]:
        gx = (gh @ w1.to(dt)).to(ctx.x_dtype)
    if need[1]:
        xd = ctx.qx.unpack(px, dt)
        gw1 = (gh2.t() @ xd.reshape(-1, xd.shape[-1])).to(w1.dtype)
    if b1 is not None and need[2]:
        gb1 = gh2.sum(0).to(b1.dtype)
    return gx, gw1, gb1


def _mlp(x: torch.Tensor, fc1: "MesaLinear", act: "_Pointwise", fc2: nn.Linear) -> torch.Tensor:
    if not _needs_saving(fc1, x, fc1.weight, fc1.bias, fc2.weight, fc2.bias):
        return fc2(act._fn(fc1(x)))
    return _MlpFn.apply(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias, fc1.quant, act.quant,
                        act, _low(x, fc1.weight, fc1.bias, fc2.weight, fc2.bias))


def _drop_fc2_quant(state_dict: dict, prefix: str) -> None:
    """A module-by-module conversion's third quantizer (fc2's input), which the fused MLP does
    not keep: its estimates are left out on loading."""
    for key in ("alpha", "beta"):
        state_dict.pop(f"{prefix}fc2.quant.{key}", None)


# The Mesa counterpart of an MLP's activation module, with its quantizer's settings.
_ACTS = {nn.GELU: lambda m, **q: MesaGELU(m.approximate, **q),
         nn.SiLU: lambda m, **q: MesaSiLU(**q), nn.ReLU: lambda m, **q: MesaReLU(**q)}


class MesaMlp(nn.Module):
    """timm's Mlp (fc1, act, fc2; GELU, SiLU or ReLU; no dropout, no norm) keeping two 8-bit
    tensors for backward where MesaLinear, MesaGELU and MesaLinear keep three: x (``fc1.quant``,
    ``groups`` along channels) and the hidden h = fc1(x) (``act.quant``, one group); fc2's input
    act(h) is recomputed from the dequantized h in backward. The state_dict has fc1's and fc2's
    keys and the two quantizers'; fc2.quant.alpha/beta of a module-by-module conversion are
    ignored on loading."""

    def __init__(self, in_features: int, hidden_features: int, out_features: Optional[int] = None,
                 act: str = "gelu", bias: bool = True, *, groups: int = 1, **quant) -> None:
        super().__init__()
        acts = {"gelu": nn.GELU(), "gelu_tanh": nn.GELU("tanh"), "silu": nn.SiLU(),
                "relu": nn.ReLU()}
        if act not in acts:
            raise ValueError(f"act: expected one of {sorted(acts)}, got {act!r}")
        self.fc1 = MesaLinear(in_features, hidden_features, bias, groups=groups, **quant)
        self.act = _ACTS[type(acts[act])](acts[act], **quant)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features, bias)

    @staticmethod
    def supports(m: nn.Module) -> bool:
        """Whether ``m`` is an Mlp from_mlp takes: Linear fc1 and fc2, GELU/SiLU/ReLU act, no
        dropout, no norm between them."""
        if type(m).__name__ != "Mlp" or type(getattr(m, "act", None)) not in _ACTS:
            return False
        if type(getattr(m, "fc1", None)) is not nn.Linear or \
                type(getattr(m, "fc2", None)) is not nn.Linear:
            return False
        for name in ("drop", "drop1", "drop2"):
            if getattr(getattr(m, name, None), "p", 0.0):
                return False
        return isinstance(getattr(m, "norm", nn.Identity()), nn.Identity)

    @classmethod
    def from_mlp(cls, m: nn.Module, groups: int = 1, **quant) -> "MesaMlp":
        if not cls.supports(m):
            raise ValueError("MesaMlp.from_mlp: expected an Mlp of Linear fc1 and fc2 with a "
                             "GELU, SiLU or ReLU act, no dropout and no norm")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.fc1 = MesaLinear.from_linear(m.fc1, groups, **quant)
        new.act = _ACTS[type(m.act)](m.act, **quant).to(m.fc1.weight.device)
        new.fc2 = m.fc2
        new.train(m.training)
        return new

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        _drop_fc2_quant(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _mlp(x, self.fc1, self.act, self.fc2)


# ---- LayerNorm ------------------------------------------------------------------------------


class _LayerNormFn(torch.autograd.Function):
    """layer_norm with its input saved in 8 bits; the backward recomputes the statistics (mean,
    1 / std) from the dequantized input (var_mean: they round as a reduction's order gives, not
    necessarily as native_layer_norm's) and runs the backward kernel autograd runs for layer_norm
    (aten's native_layer_norm_backward, called directly: no autograd inside the backward, so
    torch.compile traces it)."""

    @staticmethod
    def forward(ctx, x, weight, bias, shape, eps, quant, dtype):
        xc = x.to(dtype)
        with torch.autocast(x.device.type, enabled=False):
            y = F.layer_norm(xc, shape, _cast(weight, dtype), _cast(bias, dtype), eps)
        packed = quant.pack(xc)
        ctx.quant, ctx.dtype, ctx.x_dtype, ctx.shape, ctx.eps = quant, dtype, x.dtype, shape, eps
        ctx.n_packed = len(packed)
        _stash(ctx, [*packed, weight, bias])
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        saved = _unstash(ctx)
        packed, weight, bias = saved[:ctx.n_packed], saved[-2], saved[-1]
        if len(packed) == 3 and len(ctx.shape) == 1 and _FUSED_LAYER_NORM_BACKWARD:
            return _layer_norm_backward_from_codes(ctx, tuple(packed), weight, bias, gy)
        # The dequantized input as the module's dtype reads it; the backward in float32 (16-bit
        # statistics, which aten's CPU kernel would take with a 16-bit input, move every
        # normalized value by up to 2^-9 of the row's mean), as the fused kernel computes it.
        xd = ctx.quant.unpack(tuple(packed), ctx.dtype).float()
        w = None if weight is None else weight.to(ctx.dtype).float()
        b = None if bias is None else bias.to(ctx.dtype).float()
        shape = list(ctx.shape)
        with torch.autocast(gy.device.type, enabled=False):
            # The statistics alone (one read of xd; native_layer_norm would write its output
            # too), as native_layer_norm returns them: biased variance, shaped to keep the
            # normalized dimensions.
            dims = tuple(range(xd.dim() - len(shape), xd.dim()))
            var, mean = torch.var_mean(xd, dims, correction=0, keepdim=True)
            rstd = torch.rsqrt(var + ctx.eps)
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(
                gy.to(ctx.dtype).float(), xd, shape, mean, rstd, w, b,
                [ctx.needs_input_grad[0], w is not None and ctx.needs_input_grad[1],
                 b is not None and ctx.needs_input_grad[2]])
        gx = None if gx is None else gx.to(ctx.dtype).to(ctx.x_dtype)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = None if gb is None else gb.to(bias.dtype)
        return gx, gw, gb, None, None, None, None


# Whether MesaLayerNorm's backward runs the fused kernel (lowbit's actquant_layer_norm_backward:
# one read of the codes and the gradient) where it applies (codes saved, normalized over the last
# dimension alone); False runs the dequantize, var_mean and aten's backward kernel instead (the
# benchmark compares the two).
_FUSED_LAYER_NORM_BACKWARD = True


def _layer_norm_backward_from_codes(ctx, packed: tuple, weight, bias, gy) -> tuple:
    codes, alpha, beta = packed
    w = None if weight is None else weight.to(ctx.dtype).float()
    gx, gw, gb = _ops.eager_or_op("actquant_layer_norm_backward")(
        codes, alpha, beta, codes.shape[-1] // ctx.quant.groups, gy.to(ctx.dtype), w, ctx.eps)
    need = ctx.needs_input_grad
    return (gx.to(ctx.x_dtype) if need[0] else None,
            gw.to(weight.dtype) if weight is not None and need[1] else None,
            gb.to(bias.dtype) if bias is not None and need[2] else None,
            None, None, None, None)


class MesaLayerNorm(nn.LayerNorm):
    """nn.LayerNorm saving its input in 8 bits (groups along the last dimension); the backward
    recomputes mean and variance from the dequantized input. The forward's statistics (8 bytes
    a row) are not kept: with them the normalized input (dequantized - mean) / std would carry
    the quantization error over std, unbounded for rows of small variance (padding tokens,
    constant rows), where recomputed statistics normalize what the backward reads."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None, *, groups: int = 1,
                 **quant) -> None:
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self.quant = ActQuantizer(groups, -1, **quant)

    @classmethod
    def from_layernorm(cls, m: nn.LayerNorm, groups: int = 1, **quant) -> "MesaLayerNorm":
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.normalized_shape, new.eps = m.normalized_shape, m.eps
        new.elementwise_affine = m.elementwise_affine
        new.weight, new.bias = m.weight, m.bias
        dev = m.weight.device if m.weight is not None else None
        new.quant = ActQuantizer(groups, -1, **quant).to(dev)
        new.train(m.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, x, self.weight, self.bias):
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return _LayerNormFn.apply(x, self.weight, self.bias, tuple(self.normalized_shape),
                                  self.eps, self.quant, _fp32(x))


# ---- Softmax, MatMul, the attention core ------------------------------------------------------


def _softmax_backward(y: torch.Tensor, gy: torch.Tensor, dim: int) -> torch.Tensor:
    return y * (gy - (gy * y).sum(dim, keepdim=True))


class _SoftmaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, quant, dtype):
        with torch.autocast(x.device.type, enabled=False):
            y = torch.softmax(x.to(dtype), dim)
        packed = quant.pack(y)
        ctx.quant, ctx.dim, ctx.dtype, ctx.x_dtype = quant, dim, dtype, x.dtype
        ctx.save_for_backward(*packed)
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        yd = ctx.quant.unpack(ctx.saved_tensors, ctx.dtype)
        with torch.autocast(gy.device.type, enabled=False):
            gx = _softmax_backward(yd, gy.to(ctx.dtype), ctx.dim)
        return gx.to(ctx.x_dtype), None, None, None


class MesaSoftmax(nn.Module):
    """nn.Softmax saving its output in 8 bits (``groups`` along ``group_dim``: heads of an
    attention map [batch, heads, tokens, tokens] with group_dim=1)."""

    def __init__(self, dim: int = -1, *, groups: int = 1, group_dim: int = 1, **quant) -> None:
        super().__init__()
        self.dim = dim
        self.quant = ActQuantizer(groups, group_dim, **quant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, x):
            return torch.softmax(x, self.dim)
        return _SoftmaxFn.apply(x, self.dim, self.quant, _fp32(x))


def _mT(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(-2, -1)


def _sum_to(g: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """g reduced over the broadcast dimensions of an operand of `shape`."""
    while g.dim() > len(shape):
        g = g.sum(0)
    for d, s in enumerate(shape):
        if s == 1 and g.shape[d] != 1:
            g = g.sum(d, keepdim=True)
    return g


class _MatMulFn(torch.autograd.Function):
    """a @ b (b^T with transpose_b), both operands saved in 8 bits."""

    @staticmethod
    def forward(ctx, a, b, transpose_b, qa, qb, dtype):
        with torch.autocast(a.device.type, enabled=False):
            ac, bc = a.to(dtype), b.to(dtype)
            y = ac @ (_mT(bc) if transpose_b else bc)
        pa = qa.pack(ac) if ctx.needs_input_grad[1] else ()
        pb = qb.pack(bc) if ctx.needs_input_grad[0] else ()
        ctx.qa, ctx.qb, ctx.t, ctx.dtype, ctx.na = qa, qb, transpose_b, dtype, len(pa)
        ctx.a_meta, ctx.b_meta = (a.dtype, a.shape), (b.dtype, b.shape)
        ctx.save_for_backward(*pa, *pb)
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        saved = ctx.saved_tensors
        pa, pb = saved[:ctx.na], saved[ctx.na:]
        gy = gy.to(ctx.dtype)
        ga = gb = None
        with torch.autocast(gy.device.type, enabled=False):
            if ctx.needs_input_grad[0]:
                bd = ctx.qb.unpack(pb, ctx.dtype)
                ga = _sum_to(gy @ (bd if ctx.t else _mT(bd)), ctx.a_meta[1]).to(ctx.a_meta[0])
            if ctx.needs_input_grad[1]:
                ad = ctx.qa.unpack(pa, ctx.dtype)
                g = _mT(gy) @ ad if ctx.t else _mT(ad) @ gy
                gb = _sum_to(g, ctx.b_meta[1]).to(ctx.b_meta[0])
        return ga, gb, None, None, None, None


class MesaMatMul(nn.Module):
    """torch.matmul(a, b) (a @ b^T with ``transpose_b``) saving both operands in 8 bits, each
    with ``groups`` groups along ``dim`` (heads: dim 1 of [batch, heads, tokens, head_dim])."""

    def __init__(self, transpose_b: bool = False, *, groups: int = 1, dim: int = 1,
                 **quant) -> None:
        super().__init__()
        self.transpose_b = transpose_b
        self.quant_a = ActQuantizer(groups, dim, **quant)
        self.quant_b = ActQuantizer(groups, dim, **quant)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, a, b):
            return a @ (_mT(b) if self.transpose_b else b)
        return _MatMulFn.apply(a, b, self.transpose_b, self.quant_a, self.quant_b, _low(a, b))


class _SoftmaxMatMulFn(torch.autograd.Function):
    """softmax(s) @ v (softmax in float32 under autocast, the product in the autocast dtype):
    the softmax output is saved once in 8 bits and read by both backwards, v in 8 bits."""

    @staticmethod
    def forward(ctx, s, v, qp, qv, sm_dtype, mm_dtype):
        with torch.autocast(s.device.type, enabled=False):
            p = torch.softmax(s.to(sm_dtype), -1)
            vc = v.to(mm_dtype)
            y = p.to(mm_dtype) @ vc
        pp = qp.pack(p)
        pv = qv.pack(vc) if ctx.needs_input_grad[0] else ()
        ctx.qp, ctx.qv, ctx.np = qp, qv, len(pp)
        ctx.sm, ctx.mm, ctx.s_dtype, ctx.v_meta = sm_dtype, mm_dtype, s.dtype, (v.dtype, v.shape)
        ctx.save_for_backward(*pp, *pv)
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        saved = ctx.saved_tensors
        pp, pv = saved[:ctx.np], saved[ctx.np:]
        gy = gy.to(ctx.mm)
        pd = ctx.qp.unpack(pp, ctx.sm)
        gs = gv = None
        with torch.autocast(gy.device.type, enabled=False):
            if ctx.needs_input_grad[1]:
                gv = _sum_to(_mT(pd.to(ctx.mm)) @ gy, ctx.v_meta[1]).to(ctx.v_meta[0])
            if ctx.needs_input_grad[0]:
                vd = ctx.qv.unpack(pv, ctx.mm)
                gp = (gy @ _mT(vd)).to(ctx.sm)
                gs = _softmax_backward(pd, gp, -1).to(ctx.s_dtype)
        return gs, gv, None, None, None, None


class MesaSoftmaxMatMul(nn.Module):
    """softmax(s, -1) @ v for attention maps s [batch, heads, tokens, tokens]: one 8-bit copy of
    the softmax output (groups per head) serves the softmax's and the matmul's backward."""

    def __init__(self, *, groups: int = 1, dim: int = 1, **quant) -> None:
        super().__init__()
        self.quant_p = ActQuantizer(groups, dim, **quant)
        self.quant_v = ActQuantizer(groups, dim, **quant)

    def forward(self, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not _needs_saving(self, s, v):
            return torch.softmax(s, -1).to(v.dtype) @ v
        return _SoftmaxMatMulFn.apply(s, v, self.quant_p, self.quant_v, _fp32(s), _low(v))


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple:
    """q, k, v as [batch, heads, tokens, head_dim] views of the qkv projection's output
    [batch, tokens, 3 C] (timm's layout: [batch, tokens, 3, heads, head_dim])."""
    b, n, c3 = qkv.shape
    return qkv.reshape(b, n, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)


class _SdpaFn(torch.autograd.Function):
    """scaled_dot_product_attention of the q, k, v packed in qkv (the projection's output, see
    _split_heads), qkv saved in 8 bits as it lies: 3 heads groups of head_dim consecutive
    channels, a head of q, k or v each, so no layout copy is made; the backward recomputes the
    fused attention on views of the dequantized qkv and takes its exact backward, the gradient of
    the packed tensor."""

    @staticmethod
    def forward(ctx, qkv, heads, scale, quant, dtype):
        qc = qkv.to(dtype)
        with torch.autocast(qkv.device.type, enabled=False):
            y = F.scaled_dot_product_attention(*_split_heads(qc, heads), scale=scale)
        ctx.quant, ctx.heads, ctx.scale, ctx.dtype = quant, heads, scale, dtype
        ctx.meta = qkv.dtype
        ctx.save_for_backward(*quant.pack(qc))
        return y

    @staticmethod
    @differentiable_once
    def backward(ctx, gy):
        qd = ctx.quant.unpack(ctx.saved_tensors, ctx.dtype)
        heads, scale = ctx.heads, ctx.scale
        with torch.autocast(gy.device.type, enabled=False):
            _, vjp = torch.func.vjp(lambda t: F.scaled_dot_product_attention(
                *_split_heads(t, heads), scale=scale), qd)
            (g,) = vjp(gy.to(qd.dtype))
        return g.to(ctx.meta), None, None, None, None


class MesaAttention(nn.Module):
    """timm's Attention (qkv, proj, num_heads; no attention dropout) with every tensor its
    backward reads kept in 8 bits, head-wise: the qkv input (``groups`` along channels), the
    proj input (one group per head's channels), and the attention core: ``core="explicit"``
    (the paper's): q and k of q k^T (per head), the softmax output and v (per head);
    ``core="sdpa"``: the qkv projection's output (a group per head of q, k and v) of a fused
    scaled_dot_product_attention, recomputed in backward."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, *,
                 core: str = "explicit", groups: int = 1, scale: Optional[float] = None,
                 **quant) -> None:
        super().__init__()
        if not _is_int(num_heads) or num_heads < 1 or not _is_int(dim) or dim < 1:
            raise ValueError(f"dim = {dim!r}, num_heads = {num_heads!r}: expected positive ints")
        if dim % num_heads:
            raise ValueError(f"dim = {dim} is not a multiple of num_heads = {num_heads}")
        if core not in ("explicit", "sdpa"):
            raise ValueError(f"core: expected 'explicit' or 'sdpa', got {core!r}")
        self.num_heads, self.head_dim, self.core = num_heads, dim // num_heads, core
        self.scale = scale if scale is not None else self.head_dim ** -0.5
        self.qkv = MesaLinear(dim, 3 * dim, bias=qkv_bias, groups=groups, **quant)
        self.proj = MesaLinear(dim, dim, groups=num_heads, **quant)
        self._core_modules(quant)

    def _core_modules(self, quant: dict) -> None:
        h = self.num_heads
        if self.core == "explicit":
            self.qk = MesaMatMul(transpose_b=True, groups=h, dim=1, **quant)
            self.pv = MesaSoftmaxMatMul(groups=h, dim=1, **quant)
        else:
            self.quant_qkv = ActQuantizer(3 * h, -1, **quant)

    @classmethod
    def from_timm(cls, attn: nn.Module, core: str = "explicit", groups: int = 1,
                  **quant) -> "MesaAttention":
        drop = getattr(getattr(attn, "attn_drop", None), "p", 0.0)
        if drop:
            raise ValueError(f"MesaAttention: attention dropout ({drop}) is not supported")
        for name in ("q_norm", "k_norm", "norm"):  # timm's qk_norm and scale_norm
            if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
                raise ValueError(f"MesaAttention: {name} is not supported")
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.num_heads = attn.num_heads
        new.head_dim = attn.qkv.in_features // attn.num_heads
        new.scale = float(getattr(attn, "scale", new.head_dim ** -0.5))
        new.core = core
        new.qkv = MesaLinear.from_linear(attn.qkv, groups, **quant)
        new.proj = MesaLinear.from_linear(attn.proj, attn.num_heads, **quant)
        if core not in ("explicit", "sdpa"):
            raise ValueError(f"core: expected 'explicit' or 'sdpa', got {core!r}")
        new._core_modules(quant)
        new.to(attn.qkv.weight.device)
        new.proj_drop = getattr(attn, "proj_drop", nn.Identity())
        new.train(attn.training)
        return new

    def attend(self, qkv: torch.Tensor, *separate: torch.Tensor) -> torch.Tensor:
        """The core on the qkv projection's output [batch, tokens, 3 dim] (timm's layout,
        [batch, tokens, 3, heads, head_dim]); returns [batch, heads, tokens, head_dim]."""
        if separate:
            raise TypeError("MesaAttention.attend takes the qkv projection's output [batch, "
                            "tokens, 3 dim] since lowbit 0.2, not q, k and v")
        if qkv.dim() != 3 or qkv.shape[-1] != 3 * self.num_heads * self.head_dim:
            raise ValueError(f"MesaAttention.attend: qkv of shape {tuple(qkv.shape)}; expected "
                             f"[batch, tokens, {3 * self.num_heads * self.head_dim}]")
        if self.core == "explicit":
            q, k, v = _split_heads(qkv, self.num_heads)
            return self.pv(self.qk(q * self.scale, k), v)
        if not _needs_saving(self, qkv):
            return F.scaled_dot_product_attention(*_split_heads(qkv, self.num_heads),
                                                  scale=self.scale)
        return _SdpaFn.apply(qkv, self.num_heads, self.scale, self.quant_qkv, _low(qkv))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A state_dict of the SDPA core from before q, k and v were saved as one tensor has
        # quant_q, quant_k and quant_v (a group per head each): they are quant_qkv's groups in
        # that order.
        parts = [f"{prefix}quant_{n}." for n in "qkv"]
        if self.core == "sdpa" and f"{prefix}quant_qkv.alpha" not in state_dict and \
                all(f"{p}{key}" in state_dict for p in parts for key in ("alpha", "beta")):
            for key in ("alpha", "beta"):
                state_dict[f"{prefix}quant_qkv.{key}"] = torch.cat(
                    [state_dict.pop(f"{p}{key}") for p in parts])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = self.attend(self.qkv(x)).transpose(1, 2).reshape(b, n, c)
        x = self.proj(x)
        drop = getattr(self, "proj_drop", None)
        return drop(x) if drop is not None else x


# ---- lowbit._tiny's ViT block --------------------------------------------------------------


class MesaTinyBlock(nn.Module):
    """lowbit._tiny.Block (the library's small ViT) with Mesa modules: the same parameters and
    state_dict keys (norm1, qkv, proj, norm2, fc1, fc2), plus the quantizers. ``mlp=True``: the
    MLP saves as MesaMlp does (x and h; fc2 keeps no quantizer)."""

    def __init__(self, blk: nn.Module, core: str = "explicit", groups: int = 1,
                 mlp: bool = False, **quant) -> None:
        super().__init__()
        self.heads = blk.heads
        self.norm1 = MesaLayerNorm.from_layernorm(blk.norm1, groups, **quant)
        self.qkv = MesaLinear.from_linear(blk.qkv, groups, **quant)
        self.proj = MesaLinear.from_linear(blk.proj, blk.heads, **quant)
        self.norm2 = MesaLayerNorm.from_layernorm(blk.norm2, groups, **quant)
        self.fc1 = MesaLinear.from_linear(blk.fc1, groups, **quant)
        self.act = MesaGELU(groups=groups, **quant)
        self.fc2 = blk.fc2 if mlp else MesaLinear.from_linear(blk.fc2, groups, **quant)
        width = blk.qkv.in_features
        self.attn = MesaAttention.__new__(MesaAttention)
        nn.Module.__init__(self.attn)
        self.attn.num_heads, self.attn.head_dim = blk.heads, width // blk.heads
        self.attn.scale, self.attn.core = (width // blk.heads) ** -0.5, core
        if core not in ("explicit", "sdpa"):
            raise ValueError(f"core: expected 'explicit' or 'sdpa', got {core!r}")
        self.attn._core_modules(quant)
        self.to(blk.qkv.weight.device)
        self.train(blk.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        a = self.attn.attend(self.qkv(self.norm1(x)))
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        if self.fused_mlp:
            return x + _mlp(self.norm2(x), self.fc1, self.act, self.fc2)
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))

    @property
    def fused_mlp(self) -> bool:
        """Whether the MLP saves as MesaMlp does (fc2 then keeps no quantizer)."""
        return not isinstance(self.fc2, MesaLinear)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        if self.fused_mlp:
            _drop_fc2_quant(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# ---- convert ----------------------------------------------------------------------------------


# convert's default kinds; "mlp" is the one kind more.
DEFAULT_LAYERS = ("linear", "layernorm", "gelu", "silu", "relu", "softmax", "attention")


def _is_timm_attention(m: nn.Module) -> bool:
    return (type(m).__name__ == "Attention" and isinstance(getattr(m, "qkv", None), nn.Linear)
            and isinstance(getattr(m, "proj", None), nn.Linear) and hasattr(m, "num_heads"))


def _is_tiny_block(m: nn.Module) -> bool:
    from lowbit import _tiny

    return type(m) is _tiny.Block


def convert(model: nn.Module, *, core: str = "explicit", groups: int = 1,
            momentum: float = 0.9, rounding: str = "nearest_even", random_bits: int = 16,
            seed: int = 0, lagged: bool = False,
            filter: Optional[Callable[[str, nn.Module], bool]] = None,
            layers: tuple = DEFAULT_LAYERS) -> nn.Module:
    """Replaces, in place, the modules of a timm-style ViT by their Mesa counterparts holding
    the same parameters: timm's Attention -> MesaAttention (``core``), nn.Linear -> MesaLinear,
    nn.LayerNorm -> MesaLayerNorm, nn.GELU / nn.SiLU / nn.ReLU -> MesaGELU / MesaSiLU /
    MesaReLU, nn.Softmax -> MesaSoftmax; lowbit._tiny's Block -> MesaTinyBlock. ``filter(name,
    module)`` picks candidates (all without one), ``layers`` the kinds. The kind "mlp" (not
    among the defaults) makes timm's Mlp a MesaMlp, which saves two tensors where its three
    modules save three (and MesaTinyBlock's MLP likewise); an Mlp MesaMlp does not take
    (dropout, a norm) is converted module by module. ``momentum``,
    ``rounding``, ``random_bits``, ``lagged``: those of every :class:`ActQuantizer`. Each gets its
    own seed (``seed`` + its index) for stochastic rounding. The state_dict keeps every key and
    adds the quantizers' alpha/beta buffers (load an original state_dict with strict=False).
    Returns ``model`` (or the new module when ``model`` itself is replaced)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if filter is not None and not callable(filter):
        raise TypeError(f"filter: expected a callable (name, module) -> bool, got "
                        f"{type(filter).__name__}")
    if isinstance(layers, str) or not all(isinstance(k, str) for k in layers):
        raise TypeError(f"layers: expected a tuple of kinds, got {layers!r}")
    unknown = set(layers) - set(DEFAULT_LAYERS + ("mlp",))
    if unknown:
        raise ValueError(f"layers: unknown kinds {sorted(unknown)}")
    if core not in ("explicit", "sdpa"):  # checked here: a refused convert changes nothing
        raise ValueError(f"core: expected 'explicit' or 'sdpa', got {core!r}")
    _check_quant_args(groups, -1, momentum, rounding, random_bits, seed)
    if not isinstance(lagged, bool):
        raise TypeError(f"lagged: expected a bool, got {lagged!r}")
    counter = [0]

    def q() -> dict:
        counter[0] += 1
        return dict(momentum=momentum, rounding=rounding, random_bits=random_bits,
                    seed=seed + 7919 * counter[0], lagged=lagged)

    def replacement(name: str, m: nn.Module) -> Optional[nn.Module]:
        if filter is not None and not filter(name, m):
            return None
        if "attention" in layers and _is_tiny_block(m):
            return MesaTinyBlock(m, core, groups, "mlp" in layers, **q())
        if "mlp" in layers and MesaMlp.supports(m):
            return MesaMlp.from_mlp(m, groups, **q())
        if "attention" in layers and _is_timm_attention(m):
            return MesaAttention.from_timm(m, core, groups, **q())
        if "linear" in layers and type(m) is nn.Linear:
            return MesaLinear.from_linear(m, groups, **q())
        if "layernorm" in layers and type(m) is nn.LayerNorm:
            return MesaLayerNorm.from_layernorm(m, groups, **q())
        if "gelu" in layers and type(m) is nn.GELU:
            return MesaGELU(m.approximate, groups=1, **q()).train(m.training)
        if "silu" in layers and type(m) is nn.SiLU:
            return MesaSiLU(groups=1, **q()).train(m.training)
        if "relu" in layers and type(m) is nn.ReLU:
            return MesaReLU(groups=1, **q()).train(m.training)
        if "softmax" in layers and type(m) is nn.Softmax:
            return MesaSoftmax(m.dim if m.dim is not None else -1, groups=1,
                               **q()).train(m.training)
        return None

    top = replacement("", model)
    if top is not None:
        return top

    def moved(name: str, m: nn.Module) -> Optional[nn.Module]:
        new = replacement(name, m)
        dev = None if new is None else next(m.parameters(), None)
        return new if dev is None else new.to(dev.device)

    return replace_modules(model, moved)


def saved_bytes(fn: Callable[[], torch.Tensor], exclude: Optional[nn.Module] = None) -> int:
    """Bytes of the tensors autograd keeps for the backward of ``fn()`` (saved-tensor hooks;
    storages counted once), for the memory accounting of docs/techniques/mesa.md. The storages
    of ``exclude``'s parameters and buffers (which exist anyway) are not counted."""
    skip = set()
    if exclude is not None:
        skip = {t.untyped_storage().data_ptr()
                for t in [*exclude.parameters(), *exclude.buffers()]}
    seen: dict = {}

    def pack(t: torch.Tensor):
        try:
            key = t.untyped_storage().data_ptr()
            if key not in skip:
                seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        except RuntimeError:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())
