"""torch.library custom ops over lowbit's kernels: the only place that binds them to torch.

Each op runs lowbit's function on its tensors (CPU tensors: the CPU twin; CUDA tensors: the
CUDA kernels on the current stream, through DLPack, without copies) and has a fake
implementation that gives the results' shapes and dtypes, so that torch.compile traces the
modules of lowbit.nn without graph breaks. The ops are registered when this module is first
imported (by lowbit.nn); ``import lowbit`` alone never imports torch.

    torch.ops.lowbit.quantize_rows(x, fmt) -> (codes, scales)
    torch.ops.lowbit.quantize_tensor(x, fmt) -> (codes, scales)
    torch.ops.lowbit.quantize_columns_t(x, fmt) -> (codes, scales)
        absmax quantization (:func:`lowbit.quantize`: saturating, nearest-even, the stored
        scale d = amax / max) of a 2-d x (M, N): one scale per row (scales (M, 1)), one for the
        tensor (scales ()), or one per column with the codes written transposed (codes (N, M),
        scales (N, 1): the row scales of x^T's codes).
    torch.ops.lowbit.dequantize_rows(codes, scales, fmt) -> values
        :func:`lowbit.dequantize` of row-wise codes: float32 value(code) * d, per element.
    torch.ops.lowbit.quantize_blocks(x, fmt, block_rows, block_k) -> (codes, scales)
        absmax quantization of x (M, K) in block_rows x block_k blocks: ("blocks", block_k)
        for one row (scales (M, ceil(K/block_k))), ("tiles", block_rows, block_k) otherwise
        (scales (ceil(M/block_rows), ceil(K/block_k))).
    torch.ops.lowbit.quantize_mx(x, fmt, block) -> (codes, scales)
        :func:`lowbit.quantize_mx`: OCP MX blocks along rows, uint8 E8M0 scales.
    torch.ops.lowbit.quantize_scaled(x, q, fmt) -> codes
        :func:`lowbit.cast_scaled`: codes = encode(x * q) with a given multiplier q (one
        float32 element; delayed scaling's q from the amax history).
    torch.ops.lowbit.scaled_mm(a, a_scales, a_fmt, b, b_scales, b_fmt, bias, out_dtype,
                               backend, accumulation="", a_block=None, b_block=None) -> out
        :func:`lowbit.scaled_matmul`: out = (sa * A)(sb * B)^T + bias, (M, N) of out_dtype;
        accumulation is an :class:`lowbit.Accumulation` spec string ("" for none), a_block /
        b_block are [block_rows, block_k] for block scales (None for tensor/row scales).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch

import lowbit
from lowbit import _core
from lowbit._interop import torch_stream

# The code dtype of each quantization target, as the kernels allocate it (int8 for the signed
# integer formats, uint16 for 16-bit floats, uint8 for the 8-bit and narrower floats): the
# fakes give the real ops' dtypes, so that compiled graphs read the codes as the eager ops do.
_CODE_DTYPES: dict[str, torch.dtype] = {}
_TORCH_CODE_DTYPES = {"int8": torch.int8, "uint8": torch.uint8, "uint16": torch.uint16}


def _code_dtype(fmt: str) -> torch.dtype:
    d = _CODE_DTYPES.get(fmt)
    if d is None:  # target_info refuses a format that cannot be a target, by name
        d = _CODE_DTYPES[fmt] = _TORCH_CODE_DTYPES[lowbit.target_info(fmt).code_dtype]
    return d


# The ops' tensors are torch tensors that the ops' callers (lowbit.nn) made contiguous on one
# device, and their formats are the few names of the layers' recipes: each op calls the compiled
# module directly, with the torch allocator, the device and the current stream, instead of going
# through lowbit.quantize / lowbit.scaled_matmul's argument resolution (the same C++ call, the
# same checks of every value there; tens of microseconds less host time per call).
_POLICY = None


def _policy() -> object:
    global _POLICY
    if _POLICY is None:  # nearest-even, saturating, as lowbit.quantize's defaults
        from lowbit._api import _rounding

        _POLICY = _rounding("nearest_even", True, "keep", "preserve", None, 0, 0)
    return _POLICY


_FORMATS: dict[str, object] = {}


def _fmt(name: str) -> object:
    f = _FORMATS.get(name)
    if f is None:
        from lowbit._api import _format_arg

        f = _FORMATS[name] = _format_arg(name)
    return f


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
           "uint16": torch.uint16}


def _allocator(device: torch.device):
    def empty(shape: tuple[int, ...], dtype: str) -> torch.Tensor:  # the module passes a tuple
        return torch.empty(shape, dtype=_DTYPES[dtype], device=device)

    return empty


def _stream(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch_stream(torch, device.index)


def _on_device(device: torch.device):
    """The device of CUDA tensors as the current one (the module's kernels run there)."""
    if device.type == "cuda" and torch.cuda.current_device() != device.index:
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _quantize(x: torch.Tensor, fmt: str, granularity: str,
              transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _matrix(x)
    _code_dtype(fmt)  # a format that cannot be a target: target_info's error
    x = x.detach()
    with _on_device(x.device):
        return _core.quantize(x, _fmt(fmt), granularity, 1, 1, 0, False, transpose, _policy(),
                              _allocator(x.device), 0, _stream(x.device))


def _register(fn):
    """fn (named _<op>) as the custom op lowbit::<op>."""
    return torch.library.custom_op(f"lowbit::{fn.__name__[1:]}", mutates_args=())(fn)


def _matrix(x: torch.Tensor) -> tuple[int, int]:
    """The quantize ops take 2-d tensors (what the layers pass), eager and traced alike."""
    if x.dim() != 2:
        raise ValueError(f"x: the quantize ops take 2-d tensors, got {x.dim()}-d of shape "
                         f"{tuple(x.shape)}")
    return x.shape[0], x.shape[1]


_fake_matrix = _matrix


def _quantize_rows(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, fmt, "rows")


quantize_rows = _register(_quantize_rows)


@quantize_rows.register_fake
def _(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = _fake_matrix(x)
    return x.new_empty((m, n), dtype=_code_dtype(fmt)), x.new_empty((m, 1), dtype=torch.float32)


def _quantize_tensor(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, fmt, "tensor")


quantize_tensor = _register(_quantize_tensor)


@quantize_tensor.register_fake
def _(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = _fake_matrix(x)
    return x.new_empty((m, n), dtype=_code_dtype(fmt)), x.new_empty((), dtype=torch.float32)


def _quantize_columns_t(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    return _quantize(x, fmt, "columns", transpose=True)


quantize_columns_t = _register(_quantize_columns_t)


@quantize_columns_t.register_fake
def _(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = _fake_matrix(x)
    return x.new_empty((n, m), dtype=_code_dtype(fmt)), x.new_empty((n, 1), dtype=torch.float32)


def _quantize_blocks(x: torch.Tensor, fmt: str, block_rows: int,
                     block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    _matrix(x)
    _code_dtype(fmt)
    x = x.detach()
    kind = "blocks" if block_rows == 1 else "tiles"
    with _on_device(x.device):
        return _core.quantize(x, _fmt(fmt), kind, block_rows, block_k, 0, False, False,
                              _policy(), _allocator(x.device), 0, _stream(x.device))


quantize_blocks = _register(_quantize_blocks)


def _ceil(a, b):
    return (a + b - 1) // b


@quantize_blocks.register_fake
def _(x: torch.Tensor, fmt: str, block_rows: int,
      block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = _fake_matrix(x)
    rows = m if block_rows == 1 else _ceil(m, block_rows)
    return (x.new_empty((m, n), dtype=_code_dtype(fmt)),
            x.new_empty((rows, _ceil(n, block_k)), dtype=torch.float32))


def _quantize_mx(x: torch.Tensor, fmt: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    _matrix(x)
    x = x.detach()
    with _on_device(x.device):
        return _core.quantize_mx(x, _fmt(fmt), block, _policy(), _allocator(x.device), 0,
                                 _stream(x.device))


quantize_mx = _register(_quantize_mx)


@quantize_mx.register_fake
def _(x: torch.Tensor, fmt: str, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, n = _fake_matrix(x)
    return (x.new_empty((m, n), dtype=_code_dtype(fmt)),
            x.new_empty((m, _ceil(n, block)), dtype=torch.uint8))


def _quantize_scaled(x: torch.Tensor, q: torch.Tensor, fmt: str) -> torch.Tensor:
    if q.numel() != 1:
        raise ValueError(f"q: expected one multiplier (a tensor of one element), got shape "
                         f"{tuple(q.shape)}")
    _matrix(x)
    _code_dtype(fmt)
    x = x.detach()
    with _on_device(x.device):
        return _core.cast_scaled(x, q.detach().reshape(1), _fmt(fmt), _policy(), None,
                                 _allocator(x.device), 0, _stream(x.device))


quantize_scaled = _register(_quantize_scaled)


@quantize_scaled.register_fake
def _(x: torch.Tensor, q: torch.Tensor, fmt: str) -> torch.Tensor:
    m, n = _fake_matrix(x)
    return x.new_empty((m, n), dtype=_code_dtype(fmt))


def _dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    return lowbit.dequantize(codes, scales, fmt, "rows")


dequantize_rows = _register(_dequantize_rows)


@dequantize_rows.register_fake
def _(codes: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    return codes.new_empty(codes.shape, dtype=torch.float32)


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


_ACCUMULATIONS: dict[str, Optional[list[int]]] = {"": None}


def _accumulation(spec: str) -> Optional[list[int]]:
    f = _ACCUMULATIONS.get(spec)
    if f is None and spec not in _ACCUMULATIONS:
        f = _ACCUMULATIONS[spec] = lowbit.Accumulation.parse(spec).fields()
    return f


def _block(b: Optional[list[int]], name: str) -> tuple[int, int]:
    if b is None:
        return (0, 0)
    if len(b) != 2:
        raise ValueError(f"{name}: expected [block_rows, block_k], got {list(b)!r}")
    return (int(b[0]), int(b[1]))


def _scaled_mm(a: torch.Tensor, a_scales: torch.Tensor, a_fmt: str, b: torch.Tensor,
               b_scales: torch.Tensor, b_fmt: str, bias: Optional[torch.Tensor],
               out_dtype: torch.dtype, backend: str, accumulation: str = "",
               a_block: Optional[list[int]] = None,
               b_block: Optional[list[int]] = None) -> torch.Tensor:
    if out_dtype not in _DTYPE_NAMES:
        raise TypeError(f"out_dtype: expected float32, bfloat16 or float16, got {out_dtype}")
    with _on_device(a.device):
        return _core.scaled_matmul(a.detach(), b.detach(), _fmt(a_fmt), _fmt(b_fmt),
                                   a_scales.detach(), b_scales.detach(),
                                   None if bias is None else bias.detach(),
                                   _DTYPE_NAMES[out_dtype], None, backend, _allocator(a.device),
                                   0, _stream(a.device), _accumulation(accumulation),
                                   _block(a_block, "a_block"), _block(b_block, "b_block"))


scaled_mm = _register(_scaled_mm)


@scaled_mm.register_fake
def _(a: torch.Tensor, a_scales: torch.Tensor, a_fmt: str, b: torch.Tensor,
      b_scales: torch.Tensor, b_fmt: str, bias: Optional[torch.Tensor],
      out_dtype: torch.dtype, backend: str, accumulation: str = "",
      a_block: Optional[list[int]] = None,
      b_block: Optional[list[int]] = None) -> torch.Tensor:
    torch._check(b.dim() == 2, lambda: "b: expected a 2-d (N, K) operand")
    torch._check(a.shape[-1] == b.shape[1], lambda: "a and b: K differs")
    return a.new_empty((*a.shape[:-1], b.shape[0]), dtype=out_dtype)


# The ops' own implementations, for eager mode: the custom op's dispatch costs tens of
# microseconds a call on the host, a visible share of a small layer's step. lowbit.nn calls
# these unless torch.compile is tracing (eager_or_op); the results are the same tensors.
EAGER = {"quantize_rows": _quantize_rows, "quantize_tensor": _quantize_tensor,
         "quantize_columns_t": _quantize_columns_t, "dequantize_rows": _dequantize_rows,
         "scaled_mm": _scaled_mm, "quantize_blocks": _quantize_blocks,
         "quantize_mx": _quantize_mx, "quantize_scaled": _quantize_scaled}


def eager_or_op(name: str):
    """The implementation of op `name` when nothing is being traced, else the custom op."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.lowbit, name)
    return EAGER[name]


# ---- activation quantization with running estimates (Mesa; lowbit.nn.mesa) ------------------
#
#   torch.ops.lowbit.actquant_quantize(x, alpha, beta, dim, group_size, update, lagged,
#                                      momentum, stochastic, random_bits, seed, offset) -> codes
#       uint8 codes of a contiguous x (float32/bfloat16/float16), alpha and beta (float32, one
#       per group along dim) updated in place first when `update`, or after quantizing from the
#       same read of x when `lagged` (kernels/include/lowbit/kernels/actquant.hpp).
#   torch.ops.lowbit.actquant_dequantize(codes, alpha, beta, dim, group_size, out_dtype)
#       codes * alpha[g] + beta[g] as out_dtype.
#   torch.ops.lowbit.actquant_layer_norm_backward(codes, alpha, beta, group_size, gy, weight,
#                                                 eps) -> (gx, gw, gb)
#       layer_norm's backward over the last dimension from its input's codes (groups along the
#       last dimension), the statistics recomputed from the dequantized input: gx as gy's
#       dtype, gw and gb float32 (actquant_layer_norm_backward).
#   torch.ops.lowbit.actquant_activation_backward(codes, alpha, beta, dim, group_size,
#                                                 activation, dy, want_value) -> (gx, value)
#       gx = dy f'(x) and f(x) (an empty tensor unless want_value) for the dequantized input x,
#       as dy's dtype (actquant_activation_backward).

_FLOAT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _where(t: torch.Tensor) -> tuple[int, int]:
    return (1, t.device.index) if t.device.type == "cuda" else (0, 0)


def _check_estimates(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, dim: int,
                     group_size: int) -> None:
    # The compiled entry reads G = x.shape[dim] / group_size floats from each pointer.
    for name, t in (("alpha", alpha), ("beta", beta)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device != x.device:
            raise ValueError(f"{name}: expected a contiguous float32 tensor on {x.device}")
        c = x.shape[dim] if x.dim() else 1
        if group_size > 0 and c % group_size == 0 and t.numel() * group_size != c:
            raise ValueError(f"{name}: {t.numel()} elements, but x.shape[{dim}] = {c} / "
                             f"group_size {group_size} groups")


def _actquant_quantize(x: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, dim: int,
                       group_size: int, update: bool, lagged: bool, momentum: float,
                       stochastic: bool, random_bits: int, seed: int,
                       offset: int) -> torch.Tensor:
    if x.dtype not in _FLOAT_CODES:
        raise TypeError(f"x: expected float32, bfloat16 or float16, got {x.dtype}")
    _check_estimates(x, alpha, beta, dim, group_size)
    x = x.detach().contiguous()
    codes = torch.empty(x.shape, dtype=torch.uint8, device=x.device)
    dt, di = _where(x)
    with _on_device(x.device):
        _core.actquant_quantize_raw(x.data_ptr(), _FLOAT_CODES[x.dtype], list(x.shape), dim,
                                    group_size, codes.data_ptr(), alpha.data_ptr(),
                                    beta.data_ptr(), True, update, lagged, momentum,
                                    "stochastic" if stochastic else "nearest_even",
                                    random_bits if stochastic else 0, seed, offset, dt, di, 0,
                                    _stream(x.device))
    return codes


actquant_quantize = torch.library.custom_op("lowbit::actquant_quantize",
                                            mutates_args=("alpha", "beta"))(_actquant_quantize)


@actquant_quantize.register_fake
def _(x, alpha, beta, dim, group_size, update, lagged, momentum, stochastic, random_bits, seed,
      offset):
    return torch.empty_like(x, dtype=torch.uint8, memory_format=torch.contiguous_format)


def _actquant_dequantize(codes: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, dim: int,
                         group_size: int, out_dtype: torch.dtype) -> torch.Tensor:
    if out_dtype not in _FLOAT_CODES:
        raise TypeError(f"out_dtype: expected float32, bfloat16 or float16, got {out_dtype}")
    if codes.dtype != torch.uint8 or not codes.is_contiguous():
        raise ValueError("codes: expected a contiguous uint8 tensor")
    _check_estimates(codes, alpha, beta, dim, group_size)
    out = torch.empty(codes.shape, dtype=out_dtype, device=codes.device)
    dt, di = _where(codes)
    with _on_device(codes.device):
        _core.actquant_dequantize_raw(codes.data_ptr(), list(codes.shape), dim, group_size,
                                      alpha.data_ptr(), beta.data_ptr(), out.data_ptr(),
                                      _FLOAT_CODES[out_dtype], dt, di, 0, _stream(codes.device))
    return out


actquant_dequantize = _register(_actquant_dequantize)


@actquant_dequantize.register_fake
def _(codes, alpha, beta, dim, group_size, out_dtype):
    return torch.empty_like(codes, dtype=out_dtype)


def _actquant_layer_norm_backward(codes: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                                  group_size: int, gy: torch.Tensor,
                                  weight: Optional[torch.Tensor],
                                  eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if gy.dtype not in _FLOAT_CODES:
        raise TypeError(f"gy: expected float32, bfloat16 or float16, got {gy.dtype}")
    if codes.dtype != torch.uint8 or not codes.is_contiguous() or codes.dim() == 0:
        raise ValueError("codes: expected a contiguous uint8 tensor of at least one dimension")
    if gy.shape != codes.shape or gy.device != codes.device:
        raise ValueError(f"gy: expected codes' shape {tuple(codes.shape)} on {codes.device}, got "
                         f"{tuple(gy.shape)} on {gy.device}")
    _check_estimates(codes, alpha, beta, -1, group_size)
    c = codes.shape[-1]
    if weight is not None and (weight.dtype != torch.float32 or weight.device != codes.device
                               or weight.numel() != c):
        raise ValueError(f"weight: expected {c} float32 elements on {codes.device}")
    gy = gy.contiguous()
    w = None if weight is None else weight.contiguous()
    gx = torch.empty_like(gy, memory_format=torch.contiguous_format)
    gw = torch.empty(c, dtype=torch.float32, device=codes.device)
    gb = torch.empty(c, dtype=torch.float32, device=codes.device)
    dt, di = _where(codes)
    with _on_device(codes.device):
        _core.actquant_layer_norm_backward_raw(
            codes.data_ptr(), list(codes.shape), group_size, alpha.data_ptr(), beta.data_ptr(),
            gy.data_ptr(), _FLOAT_CODES[gy.dtype], 0 if w is None else w.data_ptr(), eps,
            gx.data_ptr(), gw.data_ptr(), gb.data_ptr(), dt, di, 0, _stream(codes.device))
    return gx, gw, gb


actquant_layer_norm_backward = _register(_actquant_layer_norm_backward)


@actquant_layer_norm_backward.register_fake
def _(codes, alpha, beta, group_size, gy, weight, eps):
    c = codes.shape[-1]
    return (torch.empty_like(gy, memory_format=torch.contiguous_format),
            gy.new_empty(c, dtype=torch.float32), gy.new_empty(c, dtype=torch.float32))


def _actquant_activation_backward(codes: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor,
                                  dim: int, group_size: int, activation: str, dy: torch.Tensor,
                                  want_value: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if dy.dtype not in _FLOAT_CODES:
        raise TypeError(f"dy: expected float32, bfloat16 or float16, got {dy.dtype}")
    if codes.dtype != torch.uint8 or not codes.is_contiguous():
        raise ValueError("codes: expected a contiguous uint8 tensor")
    if dy.shape != codes.shape or dy.device != codes.device:
        raise ValueError(f"dy: expected codes' shape {tuple(codes.shape)} on {codes.device}, got "
                         f"{tuple(dy.shape)} on {dy.device}")
    _check_estimates(codes, alpha, beta, dim, group_size)
    dy = dy.contiguous()
    gx = torch.empty_like(dy, memory_format=torch.contiguous_format)
    value = torch.empty_like(gx) if want_value else gx.new_empty(0)
    dt, di = _where(codes)
    with _on_device(codes.device):
        _core.actquant_activation_backward_raw(
            codes.data_ptr(), list(codes.shape), dim, group_size, alpha.data_ptr(),
            beta.data_ptr(), activation, dy.data_ptr(), _FLOAT_CODES[dy.dtype], gx.data_ptr(),
            value.data_ptr() if want_value else 0, dt, di, 0, _stream(codes.device))
    return gx, value


actquant_activation_backward = _register(_actquant_activation_backward)


@actquant_activation_backward.register_fake
def _(codes, alpha, beta, dim, group_size, activation, dy, want_value):
    gx = torch.empty_like(dy, memory_format=torch.contiguous_format)
    return gx, (torch.empty_like(gx) if want_value else gx.new_empty(0))


EAGER["actquant_quantize"] = _actquant_quantize
EAGER["actquant_dequantize"] = _actquant_dequantize
EAGER["actquant_layer_norm_backward"] = _actquant_layer_norm_backward
EAGER["actquant_activation_backward"] = _actquant_activation_backward
