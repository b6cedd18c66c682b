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
    torch.ops.lowbit.scaled_mm(a, a_scales, a_fmt, b, b_scales, b_fmt, bias, out_dtype,
                               backend) -> out
        :func:`lowbit.scaled_matmul`: out = (sa * A)(sb * B)^T + bias, (M, N) of out_dtype.
"""

from __future__ import annotations

from typing import Optional

import torch

import lowbit
from lowbit._quantize import Granularity

# Code dtypes of the targets the layers quantize to (anything else reaches the kernels, which
# say why they refuse it; the fake then guesses uint8, the dtype of every 8-bit format).
_INT_TARGETS = {"int8": torch.int8, "int8_sym": torch.int8, "uint8": torch.uint8}


def _code_dtype(fmt: str) -> torch.dtype:
    return _INT_TARGETS.get(fmt, torch.uint8)


def _quantize(x: torch.Tensor, fmt: str, granularity: str,
              transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = lowbit.quantize(x, fmt, Granularity.of(granularity), transpose=transpose)
    return codes, scales


def _register(fn):
    """fn (named _<op>) as the custom op lowbit::<op>."""
    return torch.library.custom_op(f"lowbit::{fn.__name__[1:]}", mutates_args=())(fn)


def _fake_matrix(x: torch.Tensor) -> tuple[int, int]:
    torch._check(x.dim() == 2, lambda: f"x: the layers quantize 2-d tensors, got {x.dim()}-d")
    return x.shape[0], x.shape[1]


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


def _dequantize_rows(codes: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    return lowbit.dequantize(codes, scales, fmt, "rows")


dequantize_rows = _register(_dequantize_rows)


@dequantize_rows.register_fake
def _(codes: torch.Tensor, scales: torch.Tensor, fmt: str) -> torch.Tensor:
    return codes.new_empty(codes.shape, dtype=torch.float32)


def _scaled_mm(a: torch.Tensor, a_scales: torch.Tensor, a_fmt: str, b: torch.Tensor,
              b_scales: torch.Tensor, b_fmt: str, bias: Optional[torch.Tensor],
              out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    return lowbit.scaled_matmul(a, b, a_fmt=a_fmt, b_fmt=b_fmt, a_scales=a_scales,
                                b_scales=b_scales, bias=bias, out_dtype=out_dtype,
                                backend=backend)


scaled_mm = _register(_scaled_mm)


@scaled_mm.register_fake
def _(a: torch.Tensor, a_scales: torch.Tensor, a_fmt: str, b: torch.Tensor,
      b_scales: torch.Tensor, b_fmt: str, bias: Optional[torch.Tensor],
      out_dtype: torch.dtype, backend: str) -> torch.Tensor:
    torch._check(b.dim() == 2, lambda: "b: expected a 2-d (N, K) operand")
    torch._check(a.shape[-1] == b.shape[1], lambda: "a and b: K differs")
    return a.new_empty((*a.shape[:-1], b.shape[0]), dtype=out_dtype)


# The ops' own implementations, for eager mode: the custom op's dispatch costs tens of
# microseconds a call on the host, a visible share of a small layer's step. lowbit.nn calls
# these unless torch.compile is tracing (eager_or_op); the results are the same tensors.
EAGER = {"quantize_rows": _quantize_rows, "quantize_tensor": _quantize_tensor,
         "quantize_columns_t": _quantize_columns_t, "dequantize_rows": _dequantize_rows,
         "scaled_mm": _scaled_mm}


def eager_or_op(name: str):
    """The implementation of op `name` when nothing is being traced, else the custom op."""
    if torch.compiler.is_compiling():
        return getattr(torch.ops.lowbit, name)
    return EAGER[name]
