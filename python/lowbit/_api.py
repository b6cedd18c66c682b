"""Formats, casts and decodes: the numpy-facing API over lowbit._core.

The compiled module checks every argument and raises TypeError (wrong dtype or type),
ValueError (a value outside its domain: unknown name, bad stride, random_bits out of range) or
RuntimeError (not available in this build). This layer only turns non-array inputs into arrays
and gives the functions their documented signatures.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from lowbit import _core
from lowbit._core import Format

FormatLike = Union[str, Format]

_UINT64_LIMIT = 1 << 64


def _as_array(value: Any, dtype: Any = None) -> np.ndarray:
    # Arrays pass through untouched (the C++ takes their strides, no copy); lists and Python
    # scalars become arrays, so that float inputs work and int inputs reach the dtype check.
    if isinstance(value, np.ndarray) and dtype is None:
        return value
    return np.asarray(value, dtype=dtype)


def _integer(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None


def _uint64(name: str, value: Any) -> int:
    value = _integer(name, value)
    if not 0 <= value < _UINT64_LIMIT:
        raise ValueError(f"{name}: expected an integer in 0..2**64-1, got {value}")
    return value


def _threads(value: Any) -> int:
    value = _integer("threads", value)
    if value < 0:
        raise ValueError(f"threads: expected 0 (all cores) or a positive count, got {value}")
    return value


def _random_bits(value: Any) -> int | None:
    if value is None:
        return None
    value = _integer("random_bits", value)
    # The C++ checks the range; values beyond int would fail its conversion with a vaguer error.
    if not 1 <= value <= 32:
        raise ValueError(f"random_bits: stochastic rounding takes 1..32 random bits, got {value}")
    return value


def parse_format(fmt: FormatLike) -> Format:
    """The Format named ``fmt``: a named format ("e4m3fn", see :func:`formats`) or
    ``e<E>m<M>[b<bias>][_ieee|_fn|_fnuz|_none][_unsigned][_nozero]``. A Format is returned as is.
    """
    return _core.parse_format(fmt)


def formats() -> list[str]:
    """Names of the named formats, in the library's order (docs/formats.md lists them)."""
    return [f.name for f in _core.named_formats()]


def roundings() -> list[str]:
    """Names accepted by ``cast(..., rounding=...)``."""
    return list(_core.roundings())


def cast(
    x: Any,
    fmt: FormatLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = False,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: int | None = None,
    seed: int = 0,
    offset: int = 0,
    threads: int = 0,
) -> np.ndarray:
    """Round every element of ``x`` to format ``fmt``; returns the codes, shaped like ``x``.

    x: a numpy array of float32, float64, float16 or ml_dtypes.bfloat16 (any strides; lists and
        Python floats are converted with ``np.asarray``). float64 inputs are rounded once,
        directly (never through float32).
    fmt: a format name or a :class:`Format`.
    rounding: "nearest_even" (default), "nearest_away", "toward_zero", "up", "down", "odd" or
        "stochastic".
    saturate: finite overflow and +-Inf give +-max instead of Inf (or NaN where the format has
        no Inf).
    subnormals: "keep" or "flush" (values below the smallest normal become a zero of their sign;
        tininess is detected before rounding).
    nan_sign: "preserve" (NaN results keep the input's sign where the format has signed NaNs) or
        "positive".
    random_bits: stochastic rounding only: how many random bits decide each rounding (1..32,
        default 32). Element i of the row-major order draws its bits from the Philox stream
        (seed, offset), so results depend on neither memory layout nor thread count.
    threads: CPU threads, 0 for all cores.

    The codes are uint8 for formats of up to 8 bits, uint16 up to 16, uint32 beyond. The rules
    are docs/rounding.md's.
    """
    return _core.cast(
        _as_array(x),
        fmt,
        rounding,
        saturate,
        subnormals,
        nan_sign,
        _random_bits(random_bits),
        _uint64("seed", seed),
        _uint64("offset", offset),
        _threads(threads),
    )


def decode(codes: Any, fmt: FormatLike, dtype: Any = "float32", *, threads: int = 0) -> np.ndarray:
    """The exact values of ``codes`` (codes of ``fmt``) as float32 or float64.

    codes: an array of the format's code dtype (``format_info(fmt).code_dtype``: uint8, uint16
        or uint32); lists of ints are converted to it. Bits above the format's width are ignored.
    dtype: "float32" (default) or "float64"; float64 is required for formats whose values do
        not all fit float32 (``Format.fits_float``).

    NaN codes decode to a quiet NaN with the code's sign (fnuz NaNs have none), Inf codes to Inf.
    """
    if not isinstance(codes, np.ndarray):
        codes = _as_array(codes, dtype=_core.parse_format(fmt).code_dtype)
    try:
        dtype_name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    except TypeError as e:
        raise ValueError(f"dtype {dtype!r}: expected one of float32, float64") from e
    return _core.decode(codes, fmt, dtype_name, _threads(threads))


@dataclass(frozen=True)
class FormatInfo:
    """Facts about a format (see :func:`format_info`). Values are exact Python floats."""

    name: str
    bits: int
    exp_bits: int
    man_bits: int
    bias: int
    specials: str  # "ieee", "fn", "fnuz" or "none"
    signed: bool
    has_zero: bool
    has_inf: bool
    has_nan: bool
    max: float  # largest finite value
    min_normal: float  # smallest positive normal value
    min_subnormal: float  # smallest positive value (a normal one where there are no subnormals)
    epsilon: float  # distance from 1 to the next larger value, 2**-man_bits
    emin: int  # exponent of the smallest normal binade
    emax: int  # exponent of the largest finite value
    nan_ranges: tuple[tuple[int, int], ...]  # (first, last) code ranges, inclusive
    inf_ranges: tuple[tuple[int, int], ...]
    code_dtype: str  # numpy dtype of the codes
    spec: str | None  # where a named format is defined; None for other formats
    fmt: Format

    @property
    def nan_codes(self) -> list[int]:
        """Every NaN code (2**24 - 2 of them for float32: prefer nan_ranges there)."""
        return [c for first, last in self.nan_ranges for c in range(first, last + 1)]

    @property
    def inf_codes(self) -> list[int]:
        """Every Inf code (+Inf first)."""
        return [c for first, last in self.inf_ranges for c in range(first, last + 1)]


def format_info(fmt: FormatLike) -> FormatInfo:
    """Facts about ``fmt`` (a name or a Format): widths, bias, range, NaN/Inf codes."""
    f = _core.parse_format(fmt)
    return FormatInfo(
        name=f.name,
        bits=f.bits,
        exp_bits=f.exp_bits,
        man_bits=f.man_bits,
        bias=f.bias,
        specials=f.specials,
        signed=f.signed,
        has_zero=f.has_zero,
        has_inf=f.has_inf,
        has_nan=f.has_nan,
        max=f.max,
        min_normal=f.min_normal,
        min_subnormal=f.min_positive,
        epsilon=f.epsilon,
        emin=f.emin,
        emax=f.emax,
        nan_ranges=tuple(tuple(r) for r in f.nan_ranges),
        inf_ranges=tuple(tuple(r) for r in f.inf_ranges),
        code_dtype=f.code_dtype,
        spec=f.spec,
        fmt=f,
    )
