"""Formats, casts and decodes: the array-facing API over lowbit._core.

The compiled module (its bindings and the kernels' host APIs) is the one checker of argument
values: it raises TypeError (wrong dtype or type), ValueError (a value outside its domain:
unknown name, bad stride, random_bits out of range) or RuntimeError (not available in this
build), with the Python argument's name in the message. This layer checks only what is Python's:
the types of scalar arguments, array libraries and devices (lowbit._interop); it turns
non-array inputs into arrays and calls the module once per call, handing it the allocator of
the caller's array library.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any, Callable, TypeVar, Union

import numpy as np

from lowbit import _core, _dtypes, _interop
from lowbit._core import Format

FormatLike = Union[str, Format]

_UINT64_LIMIT = 1 << 64
_INT64_LIMIT = 1 << 63

_F = TypeVar("_F", bound=Callable[..., Any])


def _renamed(**old_to_new: str) -> Callable[[_F], _F]:
    """Refuses the keyword arguments that lowbit 0.2 renamed (CHANGELOG.md) with a TypeError
    that names the new spelling, instead of Python's bare "unexpected keyword argument"."""

    def wrap(f: _F) -> _F:
        @functools.wraps(f)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    raise TypeError(f"{f.__name__}(): the argument {old!r} is called {new!r} "
                                    f"since lowbit 0.2 (see CHANGELOG.md)")
            return f(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap


def _format(value: Any) -> Format:
    """The Format of a format argument: a lowbit name, a Format, an ml_dtypes name or dtype, a
    torch dtype (lowbit._dtypes.resolve_format)."""
    return _dtypes.resolve_format(value, "fmt")


def _format_arg(value: Any) -> Any:
    """A format argument as the module takes it: a Format, or a name the module parses itself
    (lowbit's names and quantization's integer targets), so that a named call stays one trip."""
    if isinstance(value, Format):
        return value
    if isinstance(value, str):
        f = _dtypes._format_of_dtype_name(value)
        return value if f is None else f
    return _format(value)


def _typed(codes: Any, fmt: Any) -> Any:
    """The codes of a call with ``typed=True``: viewed as the format's dtype (ml_dtypes for numpy,
    torch's float8 types for torch)."""
    if isinstance(fmt, str) and fmt.startswith(("int", "uint")):
        raise TypeError(f"typed: codes of the integer target {fmt!r} are integers already; "
                        "leave typed=False")
    return _dtypes.typed(codes, fmt, "typed")


def _integer(name: str, value: Any) -> int:
    """An integer argument that fits the module's int64 (its range is the C++'s to check)."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    if not -_INT64_LIMIT <= value < _INT64_LIMIT:
        raise ValueError(f"{name}: {value} does not fit a 64-bit integer")
    return value


def _uint64(name: str, value: Any) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    if not 0 <= value < _UINT64_LIMIT:
        raise ValueError(f"{name}: expected an integer in 0..2**64-1, got {value}")
    return value


def _threads(value: Any) -> int:
    return _integer("threads", value)


def _random_bits(value: Any) -> int | None:
    return None if value is None else _integer("random_bits", value)


def _name(arg: str, value: Any) -> str:
    # Names (rounding modes, granularities, ...) are checked against their lists in the C++.
    if not isinstance(value, str):
        raise TypeError(f"{arg}: expected a name (str), got {type(value).__name__}")
    return value


def _flag(arg: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{arg}: expected True or False, got {type(value).__name__}")
    return bool(value)


def _dtype_name(value: Any) -> str:
    """The name of a dtype given as a str, a numpy dtype (or type) or a torch dtype."""
    if isinstance(value, str):
        return value
    if value is None:  # np.dtype(None) is float64, which the caller never named
        raise TypeError("dtype: expected a dtype name, numpy dtype or torch dtype, got None")
    if _interop.is_torch_dtype(value):
        return str(value).removeprefix("torch.")
    try:
        return np.dtype(value).name
    except TypeError:
        raise TypeError(f"dtype: expected a dtype name, numpy dtype or torch dtype, got "
                        f"{type(value).__name__}") from None


def _rounding(
    rounding: Any, saturate: Any, subnormals: Any, nan_sign: Any, random_bits: Any, seed: Any,
    offset: Any,
) -> _core._Rounding:
    """The rounding arguments of a converting call, with their types checked."""
    return _core._Rounding(
        rounding=_name("rounding", rounding),
        saturate=_flag("saturate", saturate),
        subnormals=_name("subnormals", subnormals),
        nan_sign=_name("nan_sign", nan_sign),
        random_bits=_random_bits(random_bits),
        seed=_uint64("seed", seed),
        offset=_uint64("offset", offset),
    )


def parse_format(fmt: FormatLike) -> Format:
    """The Format named ``fmt``: a named format ("e4m3fn", see :func:`formats`) or
    ``e<E>m<M>[b<bias>][_ieee|_fn|_fnuz|_none][_unsigned][_nozero]``. A Format is returned as is.

    >>> lowbit.parse_format("e5m2b11_fnuz").bias
    11
    """
    return _format(fmt)


def formats() -> list[str]:
    """Names of the named formats, in the library's order (docs/formats.md lists them).

    >>> lowbit.formats()[:3]
    ['e4m3fn', 'e5m2', 'e4m3fnuz']
    """
    return [f.name for f in _core.named_formats()]


def roundings() -> list[str]:
    """Names accepted by ``rounding=`` of :func:`cast` and the scaled quantizations.

    >>> lowbit.roundings()[:3]
    ['nearest_even', 'nearest_away', 'toward_zero']
    """
    return list(_core.roundings())


def _out_call(first: tuple[str, Any, Any], out: Any, **kw: Any) -> _interop.Call:
    """The array arguments of a call with an optional ``out``, which is written in place."""
    arrays = [first] + ([("out", out, None)] if out is not None else [])
    return _interop.call(*arrays, inplace=("out",) if out is not None else (), **kw)


@_renamed(target="fmt", elem="fmt")
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
    out: Any = None,
    typed: bool = False,
    threads: int = 0,
) -> Any:
    """Round every element of ``x`` to format ``fmt``; returns the codes, shaped like ``x``.

    >>> lowbit.cast(np.array([1.0, 0.3, 500.0], np.float32), "e4m3fn", saturate=True)
    array([ 56,  42, 126], dtype=uint8)
    >>> lowbit.cast(np.array([1.0, 0.3], np.float32), "e4m3fn", typed=True).dtype
    dtype(float8_e4m3fn)

    x: an array of float32, float64, float16 or bfloat16: a numpy array (bfloat16 from
        ml_dtypes; any strides; lists and Python floats are converted with ``np.asarray``) or a
        DLPack producer (torch tensor on CPU or CUDA, cupy array, ...), read without a copy.
        float64 inputs are rounded once, directly (never through float32).
    fmt: a format: a lowbit name ("e4m3fn"), a :class:`Format`, an ml_dtypes name or dtype
        ("float8_e4m3fn", ``ml_dtypes.float8_e4m3fn``) or a torch dtype
        (``torch.float8_e4m3fn``).
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
        (seed, offset), so results depend on neither memory layout, thread count nor device.
    out: an array of the code dtype shaped like x, on x's device, to write the codes into (it is
        returned); by default a new one.
    typed: return the codes viewed as the format's dtype (an ml_dtypes array for numpy, a torch
        float8 tensor for torch; TypeError where the library has none), without a copy.
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream).

    The codes are uint8 for formats of up to 8 bits, uint16 up to 16, uint32 beyond, in the
    caller's array type on the same device (numpy in, numpy out; torch in, torch out; see
    docs/python.md). The rules are docs/rounding.md's.
    """
    f = _format_arg(fmt)
    r = _rounding(rounding, saturate, subnormals, nan_sign, random_bits, seed, offset)
    typed = _flag("typed", typed)
    threads = _threads(threads)
    with _out_call(("x", x, None), out, any_layout=("x",)) as c:
        result = _core.cast(c["x"], f, r, c.values.get("out"), c.empty, threads, c.stream)
        result = out if out is not None else c.result(result)
    return _typed(result, f) if typed else result


@_renamed(target="fmt", elem="fmt")
def decode(codes: Any, fmt: FormatLike | None = None, dtype: Any = None, *, out: Any = None,
           threads: int = 0) -> Any:
    """The exact values of ``codes`` (codes of ``fmt``) as float32 or float64.

    >>> lowbit.decode(np.array([56, 42, 126], np.uint8), "e4m3fn").tolist()
    [1.0, 0.3125, 448.0]
    >>> import ml_dtypes
    >>> lowbit.decode(np.array([0.3, 448], ml_dtypes.float8_e5m2)).tolist()
    [0.3125, 448.0]

    codes: an array of the format's code dtype (``format_info(fmt).code_dtype``: uint8, uint16
        or uint32): numpy or a DLPack producer, as for :func:`cast`; lists of ints are converted
        to it. Bits above the format's width are ignored. Or typed codes: an ml_dtypes array
        (float8_*, float6_*, float4_*, bfloat16, float16) or a torch float8/bfloat16/float16
        tensor, whose dtype names the format (``fmt`` may then be left out).
    fmt: a format, in any form :func:`cast` takes; required for raw codes.
    dtype: "float32" (the default without ``out``) or "float64" (a name, numpy dtype or torch
        dtype); float64 is required for formats whose values do not all fit float32
        (``Format.fits_float``). JAX holds float64 results only with jax_enable_x64 (TypeError
        otherwise).
    out: a float32 or float64 array shaped like codes, on their device, to write the values into
        (it is returned; its dtype is the result's).
    threads: CPU threads, 0 for all cores.

    NaN codes decode to a quiet NaN with the code's sign (fnuz NaNs have none), Inf codes to Inf.
    The result is the caller's array type on the codes' device.
    """
    dtype_name = None if dtype is None else _dtype_name(dtype)
    threads = _threads(threads)
    codes, implied = _dtypes.codes_of(codes, "codes")
    if implied is not None:
        if fmt is not None and _format(fmt) != implied:
            raise ValueError(f"codes: an array of {implied.name} codes (its dtype), but fmt is "
                             f"{_format(fmt).name}")
        fmt = implied
    elif fmt is None:
        raise TypeError("fmt: required for raw codes (only typed codes, ml_dtypes or torch "
                        "float8 arrays, name their format)")
    f = _format_arg(fmt)
    # Non-array codes (lists) become numpy arrays of the format's code dtype.
    code_dtype = None if _interop.is_array(codes) else _format(f).code_dtype
    with _out_call(("codes", codes, code_dtype), out, any_layout=("codes",)) as c:
        result = _core.decode(c["codes"], f, dtype_name, c.values.get("out"), c.empty, threads,
                              c.stream)
        return out if out is not None else c.result(result)


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


@_renamed(target="fmt", elem="fmt")
def format_info(fmt: FormatLike) -> FormatInfo:
    """Facts about ``fmt`` (a name or a Format): widths, bias, range, NaN/Inf codes.

    >>> info = lowbit.format_info("e4m3fn")
    >>> info.max, info.min_subnormal, info.nan_codes
    (448.0, 0.001953125, [127, 255])
    """
    f = _format(fmt)
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
        min_subnormal=f.min_subnormal,
        epsilon=f.epsilon,
        emin=f.emin,
        emax=f.emax,
        nan_ranges=tuple(tuple(r) for r in f.nan_ranges),
        inf_ranges=tuple(tuple(r) for r in f.inf_ranges),
        code_dtype=f.code_dtype,
        spec=f.spec,
        fmt=f,
    )
