"""The scaled matmul of the GEMM layer: ``out = (sa * A) (sb * B)^T + bias`` over int8 codes,
fp8 codes or 16-bit values, the dequantization fused into the epilogue.

It binds kernels/include/lowbit/kernels/gemm.hpp; the rule, the backends and their bounds are
docs/techniques/gemm.md's. Arrays are numpy arrays or DLPack producers (torch CPU/CUDA tensors,
cupy, ...); the result comes back in the caller's array library on the same device
(lowbit._interop), CUDA work on the caller's current stream.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from lowbit import _core, _dtypes, _interop
from lowbit._api import _dtype_name, _format, _format_arg, _name, _threads

_OUT_DTYPES = ("float32", "bfloat16", "float16")


def _operand(arg: str, codes: Any, fmt: Any) -> tuple[Any, Any]:
    """Typed fp8 codes (ml_dtypes or torch float8 arrays) as raw uint8 codes, checked against
    the operand's format; everything else as it is (the module checks dtypes against formats).
    16-bit float arrays are values here, not codes."""
    codes, implied = _dtypes.codes_of(codes, arg, wide=False)
    if fmt is None:
        if implied is not None:
            return codes, implied
        raise TypeError(f"{arg}_fmt: required (only typed codes, ml_dtypes or torch float8 "
                        "arrays, name their format)")
    f = fmt if isinstance(fmt, str) else _dtypes.resolve_format(fmt, f"{arg}_fmt")
    if isinstance(f, str):
        f = _format_arg(f)
    if implied is not None and _format(f) != implied:
        raise ValueError(f"{arg}: an array of {implied.name} codes (its dtype), but {arg}_fmt is "
                         f"{_format(f).name}")
    return codes, f


def _out_dtype(value: Any) -> Optional[str]:
    if value is None:
        return None
    try:
        return _dtype_name(value)
    except TypeError:
        raise TypeError(f"out_dtype: expected float32, bfloat16 or float16 (a name, numpy dtype "
                        f"or torch dtype), got {type(value).__name__}") from None


def _empty(c: _interop.Call) -> Any:
    """The call's allocator, with numpy's bfloat16 taken from ml_dtypes (numpy has none)."""
    if not isinstance(c.backend, _interop._Numpy):
        return c.empty

    def empty(shape: Any, dtype: str) -> Any:
        if dtype == "bfloat16":
            import ml_dtypes

            return np.empty(tuple(shape), dtype=ml_dtypes.bfloat16)
        return c.empty(shape, dtype)

    return empty


def scaled_matmul(
    a: Any,
    b: Any,
    *,
    a_fmt: Any,
    b_fmt: Any,
    a_scales: Any = None,
    b_scales: Any = None,
    bias: Any = None,
    out_dtype: Any = None,
    out: Any = None,
    backend: str = "automatic",
    threads: int = 0,
) -> Any:
    """``out[m, n] = round(((float(acc[m, n]) * sa[m]) * sb[n]) + bias[n])`` with
    ``acc = A[m, :] . B[n, :]``: a matmul of two K-major operands (A is M x K, B is N x K, so
    the product is A B^T) whose dequantization and bias are fused into the epilogue.

    >>> a = np.array([[1, -2, 3]], np.int8)
    >>> b = np.array([[4, 5, 6], [-1, 0, 1]], np.int8)
    >>> lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=0.5,
    ...                      b_scales=np.array([1.0, 2.0], np.float32))
    array([[6., 2.]], dtype=float32)

    Each step of the epilogue is one float32 operation rounded to nearest-even (no fused
    multiply-add), the last rounding to out's dtype is nearest-even. ``acc`` is the exact int32
    sum for int8 operands (K up to 131071, 133143 for int8_sym codes) and a float32 sum of the
    exact products for fp8 and 16-bit operands, in an order that depends on the backend
    (docs/techniques/gemm.md gives each backend's order and bound).

    a, b: the operands, read as matrices (a's leading dimensions are its rows; b is 2-d, N x K),
        K contiguous, rows may be strided: int8 codes (fmt "int8" or "int8_sym"), uint8 codes of
        "e4m3fn" or "e5m2" (or ml_dtypes/torch float8 arrays of them, which name their format),
        or bfloat16/float16 values (fmt "bfloat16"/"float16"). numpy or DLPack producers.
    a_fmt, b_fmt: the operands' formats (a name or a :class:`Format`); None for typed codes,
        whose dtype names it.
    a_scales, b_scales: float32 dequantization factors (``d`` of :func:`quantize`), on the
        operands' device, contiguous: None (every scale 1), a Python float or one element (one
        scale for the operand), or one per row (M for a, N for b; any shape with that many
        elements, e.g. quantize's ``(M, 1)`` row scales).
    bias: float32, bfloat16 or float16, N elements, or None.
    out_dtype: "float32" (the default), "bfloat16" or "float16" (names, numpy or torch dtypes);
        with ``out``, its dtype (a different out_dtype is a TypeError).
    out: an array of a.shape[:-1] + (N,) to write into (it is returned); N contiguous.
    backend: "automatic", "simt", "cublaslt", "cutlass" or "widened": which implementation runs
        a CUDA matmul (CPU arrays always run the CPU twin; docs/techniques/gemm.md says which
        backend "automatic" picks where).
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream).

    Empty problems (M, N or K of 0) give round(bias) (zeros without a bias). Returns the result
    in the caller's array type on a's device (bfloat16 numpy results are ml_dtypes arrays).
    """
    a, af = _operand("a", a, a_fmt)
    b, bf = _operand("b", b, b_fmt)
    dt = _out_dtype(out_dtype)
    backend = _name("backend", backend)
    threads = _threads(threads)
    arrays = [("a", a, None), ("b", b, None)]
    for name, value in (("a_scales", a_scales), ("b_scales", b_scales), ("bias", bias)):
        if value is not None:
            arrays.append((name, value, "float32"))
    if out is not None:
        arrays.append(("out", out, None))
    with _interop.call(*arrays, inplace=("out",) if out is not None else ()) as c:
        v = c.values
        result = _core.scaled_matmul(v["a"], v["b"], af, bf, v.get("a_scales"),
                                     v.get("b_scales"), v.get("bias"), dt, v.get("out"),
                                     backend, _empty(c), threads, c.stream)
        return out if out is not None else c.result(result)

