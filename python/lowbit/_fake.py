"""Fake quantization: round a tensor to a format's grid and hand it back in its own float dtype.

This is the one call research code makes most: the values a tensor would have after a trip
through fp8 (or MX, or int8 with a scale), as ordinary floats of the input's dtype, on the
input's device. It composes the public functions (cast + decode, quantize + dequantize,
quantize_mx + dequantize_mx), so its bits are theirs by construction; python/tests/
test_fake_quantize.py checks that they stay so. With ``straight_through=True`` a torch tensor
gets the straight-through gradient (torch is imported only when a torch tensor is passed).
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from lowbit import _interop
from lowbit._api import cast, decode
from lowbit._dtypes import resolve_format, typed
from lowbit._quantize import (
    Granularity,
    dequantize,
    dequantize_mx,
    quantize,
    quantize_mx,
    target_info,
)

# The float dtypes fake quantization returns; float64 only without a scale (the scaled kernels
# read float32, float16 and bfloat16).
_FLOATS = ("float32", "float64", "float16", "bfloat16")


def _granularity(value: Any) -> tuple[str, Any]:
    """("cast", None), ("mx", block) or ("scaled", Granularity)."""
    if value is None:
        return "cast", None
    if isinstance(value, str) and value == "mx":
        return "mx", 32
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], str) and \
            value[0] == "mx":
        if len(value) != 2:
            raise ValueError(f"granularity: MX is written 'mx' or ('mx', block), got {value!r}")
        return "mx", value[1]
    return "scaled", Granularity.of(value)


def _target(fmt: Any) -> Any:
    """A Format, or the name of an integer target (quantize's "int8_sym", ...)."""
    try:
        return resolve_format(fmt, "fmt")
    except ValueError:
        if isinstance(fmt, str):
            try:
                if target_info(fmt).is_int:
                    return fmt
            except (TypeError, ValueError):
                pass
        raise


def _dtype_of(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return x.dtype.name
    dtype = getattr(x, "dtype", None)
    if _interop.is_torch(x):
        return str(dtype).removeprefix("torch.")
    name = _interop._dtype_name(dtype)
    return name if name is not None else repr(dtype)


def _to_dtype(values: Any, dtype: str, like: Any) -> Any:
    """float32 (or float64) results as ``like``'s dtype. A 16-bit dtype is reached by lowbit's
    own cast (nearest-even, overflow to Inf, canonical NaNs of the value's sign), so that the
    bits do not depend on the array library's conversion (torch and ml_dtypes keep different
    NaN payloads); exact where the format's values are values of that dtype."""
    if dtype in ("float32", "float64"):
        return values
    codes = cast(values, dtype)
    if isinstance(codes, np.ndarray) or _interop.is_torch(codes):
        return typed(codes, dtype, "x")
    return codes.view(dtype)  # cupy and JAX arrays have numpy's view


def _check_out(out: Any, x: Any, dtype: str) -> None:
    if isinstance(x, np.ndarray):
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out: expected a numpy array (x is one), got {type(out).__name__}")
        if not out.flags.writeable:
            raise ValueError("out: the array is read-only")
    elif _interop.is_torch(x):
        if not _interop.is_torch(out):
            raise TypeError(f"out: expected a torch tensor (x is one), got {type(out).__name__}")
        if out.device != x.device:
            raise ValueError(f"out is on {out.device} but x is on {x.device}")
    else:
        raise TypeError(f"out: only for numpy arrays and torch tensors; x is "
                        f"{type(x).__module__}.{type(x).__name__}")
    got = _dtype_of(out)
    if got != dtype:
        raise TypeError(f"out: expected {dtype} (x's dtype), got {got}")
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out: expected shape {tuple(x.shape)} (x's), got {tuple(out.shape)}")


def _store(out: Any, values: Any) -> Any:
    if _interop.is_torch(out):
        out.copy_(values)  # same dtype: a copy of the bits, on out's device
    else:
        out[...] = values
    return out


_ste: Optional[Any] = None


def _straight_through(torch: Any) -> Any:
    global _ste
    if _ste is None:

        class FakeQuantizeSTE(torch.autograd.Function):
            """Forward: the fake quantization; backward: the incoming gradient, unchanged."""

            @staticmethod
            def forward(ctx: Any, x: Any, run: Any) -> Any:
                return run(x.detach())

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad, None

        _ste = FakeQuantizeSTE
    return _ste


def fake_quantize(
    x: Any,
    fmt: Any,
    granularity: Any = None,
    *,
    margin: int = 0,
    pow2: bool = False,
    rounding: str = "nearest_even",
    saturate: Optional[bool] = None,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: Optional[int] = None,
    seed: int = 0,
    offset: int = 0,
    straight_through: bool = False,
    out: Any = None,
    threads: int = 0,
) -> Any:
    """``x`` rounded to the grid of ``fmt`` (scaled where a granularity is given), returned as
    floats of x's own dtype on x's device: ``decode(cast(x, fmt))`` without a granularity,
    ``dequantize(*quantize(x, fmt, granularity), fmt, granularity)`` with one and
    ``dequantize_mx(*quantize_mx(x, fmt, block), fmt, block)`` for ``("mx", block)``.

    >>> lowbit.fake_quantize(np.array([1.3, 2.7, 500.0], np.float32), "e4m3fn", saturate=True)
    array([  1.25,   2.75, 448.  ], dtype=float32)
    >>> lowbit.fake_quantize(np.array([[0.3, -2.0]], np.float32), "int8_sym", "rows")
    array([[ 0.2992126, -2.       ]], dtype=float32)

    x: float32, float16 or bfloat16 (float64 too without a granularity, rounded once, directly);
        a numpy array (bfloat16 from ml_dtypes) or a DLPack producer (torch CPU/CUDA tensors,
        cupy, ...); lists and Python floats are converted with numpy (to float64 without a
        granularity, float32 with one).
    fmt: the format: a name ("e4m3fn"), an ml_dtypes/numpy/torch dtype (``torch.float8_e4m3fn``)
        or a :class:`Format`; with a granularity also an integer target ("int8_sym", "int8",
        "uint8", "int4", ...).
    granularity: None (no scale: round x itself), "tensor", "rows", "columns", ("blocks", k),
        ("tiles", r, c), a :class:`Granularity` (absmax scaling, as in :func:`quantize`), or
        "mx" / ("mx", block) (OCP MX: power-of-two scales per block of a row, 32 by default,
        as in :func:`quantize_mx`).
    margin, pow2: as for :func:`quantize`; only with a scaling granularity other than MX.
    rounding, subnormals, nan_sign, random_bits, seed, offset: as for :func:`cast`.
    saturate: overflow to +-max instead of Inf/NaN. The default follows the function composed:
        False without a granularity (as :func:`cast`, ml_dtypes and torch's ``.to``), True with
        one (as :func:`quantize` and the MX spec).
    straight_through: torch tensors only: make the result differentiable with the
        straight-through estimator, whose gradient is the incoming gradient unchanged, for every
        element: also those that saturated, overflowed or are NaN (no clipping, no masking). A
        tensor that requires grad needs it (or ``torch.no_grad()``): otherwise the result would
        silently cut the graph, so that is a ValueError.
    out: an array of x's dtype and shape, of x's library and device, to write the result into
        (it is returned); not with ``straight_through``.
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream).

    The format's values are computed in float32 (float64 for float64 inputs) and, for float16 and
    bfloat16 inputs, cast to x's dtype by :func:`cast` (nearest-even, overflow to Inf, NaN the
    canonical NaN of its sign): exact wherever the rounded values are values of that dtype
    (every format of up to 8 bits in bfloat16; in float16 all of them but e8m0fnu, whose values
    reach 2^127; scaled results are float32 products, rounded once more).
    """
    mode, param = _granularity(granularity)
    target = _target(fmt)
    if isinstance(target, str) and mode == "cast":
        raise ValueError(f"fmt: the integer target {target!r} needs a granularity (its "
                         "scale); pass one, e.g. 'tensor' or 'rows'")
    if mode != "scaled" and (margin != 0 or pow2):
        where = "without a granularity" if mode == "cast" else "with MX (its scales are " \
                "powers of two by definition)"
        raise ValueError(f"margin, pow2: only with a scaling granularity, not {where}")
    if not isinstance(straight_through, (bool, np.bool_)):
        raise TypeError(f"straight_through: expected True or False, got "
                        f"{type(straight_through).__name__}")
    if saturate is None:
        saturate = mode != "cast"

    if not _interop.is_array(x):
        x = _interop.as_numpy("x", x, "float64" if mode == "cast" else "float32")
    dtype = _dtype_of(x)
    if dtype not in _FLOATS:
        raise TypeError(f"x: expected float32, float16 or bfloat16 values (float64 without a "
                        f"granularity), got {dtype}; codes are decoded with lowbit.decode")
    if dtype == "float64" and mode != "cast":
        raise TypeError("x: float64 with a granularity: the scaling kernels read float32, "
                        "float16 or bfloat16; convert x (the scale is computed in float32 anyway)")

    torch = sys.modules.get("torch") if _interop.is_torch(x) else None
    if straight_through and torch is None:
        raise TypeError(f"straight_through: only for torch tensors; x is "
                        f"{type(x).__module__}.{type(x).__name__}")
    if straight_through and out is not None:
        raise ValueError("out: not with straight_through=True (autograd makes its own result)")
    needs_grad = torch is not None and x.requires_grad and torch.is_grad_enabled()
    if needs_grad and not straight_through:
        raise ValueError("x requires grad, and fake_quantize has no gradient of its own: pass "
                         "straight_through=True (the gradient passes unchanged), or detach x or "
                         "call it under torch.no_grad()")
    if out is not None:
        _check_out(out, x, dtype)

    policy = dict(rounding=rounding, saturate=saturate, subnormals=subnormals, nan_sign=nan_sign,
                  random_bits=random_bits, seed=seed, offset=offset, threads=threads)
    wide = "float64" if dtype == "float64" else "float32"

    def run(v: Any) -> Any:
        if mode == "cast":
            codes = cast(v, target, **policy)
            values = decode(codes, target, wide, threads=threads)
        elif mode == "mx":
            codes, scales = quantize_mx(v, target, param, **policy)
            values = dequantize_mx(codes, scales, target, param, threads=threads)
        else:
            codes, scales = quantize(v, target, param, margin=margin, pow2=pow2, **policy)
            values = dequantize(codes, scales, target, param, threads=threads)
        values = _to_dtype(values, dtype, v)
        return values if out is None else _store(out, values)

    if straight_through:
        return _straight_through(torch).apply(x, run)
    return run(x)
