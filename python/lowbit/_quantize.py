"""Scaled quantization: per tensor, row, column, block and tile, delayed scaling, OCP MX.

The functions bind the host API of kernels/include/lowbit/kernels/quantize.hpp; the equations
and the NaN/zero rules are docs/techniques/quantization.md's. Arrays are numpy arrays or DLPack
producers (torch CPU/CUDA tensors, cupy, ...); results come back in the caller's array library
on the same device (lowbit._interop), CUDA work on the caller's current stream.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from lowbit import _core, _dtypes, _interop
from lowbit._api import (
    _dtype_name,
    _flag,
    _format,
    _format_arg,
    _typed,
    _integer,
    _name,
    _renamed,
    _rounding,
    _threads,
)
from lowbit._core import Format

# A float format (name or Format) or an integer target's name ("int8", "int8_sym", ...).
FormatLike = Union[str, Format]

_KINDS = ("tensor", "rows", "columns", "blocks", "tiles")
_EXPECTED = "expected 'tensor', 'rows', 'columns', ('blocks', k) or ('tiles', r, c)"


@dataclass(frozen=True)
class Granularity:
    """Which elements share one scale, on the matrix reading of the input (leading dimensions
    are the rows, the last dimension the columns).

    Build one with ``Granularity.tensor()``, ``.rows()``, ``.columns()``, ``.blocks(k)`` (``k``
    consecutive elements of a row) or ``.tiles(r, c)``; every function also takes the short forms
    ``"tensor"``, ``"rows"``, ``"columns"``, ``("blocks", k)`` and ``("tiles", r, c)``.

    >>> lowbit.Granularity.of(("blocks", 32)) == lowbit.Granularity.blocks(32)
    True
    """

    kind: str
    size: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise TypeError(f"granularity: expected a kind name (str), got "
                            f"{type(self.kind).__name__}")
        if self.kind not in _KINDS:
            raise ValueError(f"granularity {self.kind!r}: {_EXPECTED}")
        if not isinstance(self.size, tuple):
            raise TypeError(f"granularity {self.kind!r}: sizes are a tuple of integers, got "
                            f"{type(self.size).__name__}")
        want = {"blocks": 1, "tiles": 2}.get(self.kind, 0)
        if len(self.size) != want:
            form = {"blocks": "('blocks', k)", "tiles": "('tiles', r, c)"}.get(self.kind,
                                                                              repr(self.kind))
            raise ValueError(f"granularity {self.kind!r}: takes {want} size(s), written {form}; "
                             f"got {self.size!r}")
        # The sizes' range (>= 1) is the kernels' to check, when the granularity is used.
        sizes = tuple(_integer("granularity", s) for s in self.size)
        object.__setattr__(self, "size", sizes)

    @classmethod
    def tensor(cls) -> Granularity:
        """One scale for the whole tensor.

        >>> lowbit.Granularity.tensor().scale_shape((4, 8))
        ()
        """
        return cls("tensor")

    @classmethod
    def rows(cls) -> Granularity:
        """One scale per row (per index of the leading dimensions).

        >>> lowbit.Granularity.rows().scale_shape((2, 4, 8))
        (2, 4, 1)
        """
        return cls("rows")

    @classmethod
    def columns(cls) -> Granularity:
        """One scale per column (per index of the last dimension).

        >>> lowbit.Granularity.columns().scale_shape((4, 8))
        (8,)
        """
        return cls("columns")

    @classmethod
    def blocks(cls, k: int) -> Granularity:
        """One scale per ``k`` consecutive elements of a row (the last block may be shorter).

        >>> lowbit.Granularity.blocks(3).scale_shape((4, 8))
        (4, 3)
        """
        return cls("blocks", (k,))

    @classmethod
    def tiles(cls, r: int, c: int) -> Granularity:
        """One scale per ``r x c`` tile of the matrix reading (edge tiles may be smaller).

        >>> lowbit.Granularity.tiles(2, 3).scale_shape((4, 8))
        (2, 3)
        """
        return cls("tiles", (r, c))

    @classmethod
    def of(cls, value: Any) -> Granularity:
        """A Granularity from any accepted form.

        >>> lowbit.Granularity.of("rows")
        Granularity(kind='rows', size=())
        """
        if isinstance(value, Granularity):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, (tuple, list)) and value and isinstance(value[0], str):
            return cls(value[0], tuple(value[1:]))
        raise TypeError(f"granularity: {_EXPECTED} or a lowbit.Granularity, got "
                        f"{type(value).__name__}")

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the scales for an input of ``shape``: ``()`` per tensor,
        ``shape[:-1] + (1,)`` per row, ``(N,)`` per column, ``shape[:-1] + (ceil(N/k),)`` for
        blocks and ``(ceil(M/r), ceil(N/c))`` for tiles (M rows, N columns).

        >>> lowbit.Granularity.tiles(2, 2).scale_shape((3, 5))
        (2, 3)
        """
        if any(k < 1 for k in self.size):  # (the kernels check it where the sizes are used)
            raise ValueError(f"granularity {self.kind!r}: sizes must be >= 1, got {self.size}")
        lead, n = (shape[:-1], shape[-1]) if shape else ((), 1)
        m = math.prod(lead)
        if self.kind == "tensor":
            return ()
        if self.kind == "rows":
            return lead + (1,)
        if self.kind == "columns":
            return (n,)
        if self.kind == "blocks":
            return lead + (-(-n // self.size[0]),)
        return (-(-m // self.size[0]), -(-n // self.size[1]))

    def _core_args(self) -> tuple[str, int, int]:
        if self.kind == "blocks":
            return self.kind, 1, self.size[0]
        if self.kind == "tiles":
            return self.kind, self.size[0], self.size[1]
        return self.kind, 1, 1


GranularityLike = Union[str, tuple, Granularity]


def _float32_out(dtype: Any) -> None:
    if dtype is None:  # the default, as decode's dtype=None
        return
    name = _dtype_name(dtype)
    if name != "float32":
        raise ValueError(f"dtype {name!r}: expected float32 (the kernels dequantize to float32; "
                         "convert the result if you need another type)")


_POLICY_DOC = """
    rounding, saturate, subnormals, nan_sign, random_bits: how the scaled values round to the
        format, as in :func:`lowbit.cast` (integer targets always saturate and turn NaN into
        0). ``saturate`` defaults to True here: a value that overflows the format clamps to its
        largest finite value, as in the common quantization libraries.
    seed, offset: the Philox stream of stochastic rounding; element (r, c) of the matrix
        reading draws bits(r * N + c), whatever the layout of x or of the codes.
    typed: return the codes viewed as the format's dtype (an ml_dtypes array for numpy, a torch
        float8 tensor for torch; TypeError for integer targets and where the library has no
        dtype for the format), without a copy.
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream)."""


def _doc(f: Any) -> Any:
    if f.__doc__:  # None under python -OO
        f.__doc__ = f.__doc__.replace("    {policy}", _POLICY_DOC.strip("\n"))
    return f


def _typed_codes(codes: Any, fmt: Any) -> tuple[Any, Any]:
    """Typed codes (ml_dtypes arrays, torch float8 tensors) as raw codes, checked against fmt."""
    codes, implied = _dtypes.codes_of(codes, "codes")
    if fmt is None:
        if implied is None:
            raise TypeError("fmt: required for raw codes (only typed codes, ml_dtypes or torch "
                            "float8 arrays, name their format)")
        return codes, implied
    f = _format_arg(fmt)
    if implied is not None and (isinstance(f, str) and f.startswith(("int", "uint"))
                                or _format(f) != implied):
        # (an integer target is a name the module parses, not a Format)
        name = f if isinstance(f, str) else _format(f).name
        raise ValueError(f"codes: an array of {implied.name} codes (its dtype), but fmt is "
                         f"{name}")
    return codes, f


def _code_dtype(fmt: Any) -> str:
    """The code dtype of a quantization format, for codes given as lists (arrays go as they
    are: the module checks their dtype)."""
    return _core.target_info(fmt)[1]


@_doc
@_renamed(target="fmt", elem="fmt")
def quantize(
    x: Any,
    fmt: FormatLike,
    granularity: GranularityLike = "tensor",
    *,
    margin: int = 0,
    pow2: bool = False,
    transpose: bool = False,
    rounding: str = "nearest_even",
    saturate: bool = True,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: int | None = None,
    seed: int = 0,
    offset: int = 0,
    typed: bool = False,
    threads: int = 0,
) -> tuple[Any, Any]:
    """Absmax-scaled quantization; returns ``(codes, scales)``.

    >>> codes, scales = lowbit.quantize(np.array([[1.0, -2.0], [0.5, 4.0]], np.float32),
    ...                                 "int8_sym", "rows")
    >>> codes
    array([[ 64, -127],
           [ 16,  127]], dtype=int8)
    >>> scales
    array([[0.01574803],
           [0.03149606]], dtype=float32)

    For each group G of elements sharing a scale: ``amax = max |x_i|``,
    ``q = fl(fl(max / amax) * 2^-margin)`` (with ``pow2``: the power of two
    ``2^(floor(log2(max / amax)) - margin)``), ``code_i = encode(fmt, fl(x_i * q))``, and the
    stored scale is ``d = fl(fl(amax / max) * 2^margin)`` (``1 / q`` with ``pow2``), so that
    ``x_i ~ value(code_i) * d``. A group of zeros gets ``q = d = 1``; a NaN or Inf in a group makes
    its ``d`` NaN and its codes the format's NaN (0 for integers). The exact rules are in
    docs/techniques/quantization.md.

    x: float32, float16 or bfloat16; numpy or a DLPack producer (lists and Python floats are
        converted to float32 numpy arrays). It is read as a matrix: the leading dimensions are
        the rows, the last dimension is the columns (a 0-d x is 1 x 1). Rows may be strided;
        the last dimension must be contiguous.
    fmt: a float format whose values fit float32 (name or :class:`Format`, e.g. "e4m3fn",
        "e5m2", "e2m1fn", "bfloat16") or an integer target: "int8", "int8_sym" (the symmetric
        [-127, 127] of absmax int8 quantization), "uint8", "int4", "int4_sym", "uint4".
    granularity: "tensor", "rows", "columns", ("blocks", k), ("tiles", r, c) or a
        :class:`Granularity`; block and tile sizes are >= 1 and may exceed the tensor's
        (one group then spans the row or the matrix).
    margin: scale down by an extra 2^margin (headroom), -126..126.
    pow2: round q down to a power of two (exact scaling; d = 1 / q).
    transpose: granularity "columns" only: write the codes as the N x M transpose of the matrix
        reading, with one scale per row of the transposed codes (dequantize them with
        granularity "rows").
    {policy}

    Returns codes (uint8 or uint16 for formats, int8 for signed integer targets, uint8 for
    unsigned ones; shaped like x, or (N, M) with ``transpose``) and float32 scales shaped by
    :meth:`Granularity.scale_shape` (``()``, ``x.shape[:-1] + (1,)``, ``(N,)``,
    ``x.shape[:-1] + (ceil(N/k),)``, ``(ceil(M/r), ceil(N/c))``; ``(N, 1)`` with
    ``transpose``), both in the caller's array type on x's device.
    """
    f = _format_arg(fmt)
    g = Granularity.of(granularity)
    margin = _integer("margin", margin)
    pow2 = _flag("pow2", pow2)
    transpose = _flag("transpose", transpose)
    r = _rounding(rounding, saturate, subnormals, nan_sign, random_bits, seed, offset)
    typed = _flag("typed", typed)
    threads = _threads(threads)
    with _interop.call(("x", x, "float32")) as c:
        kind, rows, cols = g._core_args()
        codes, scales = _core.quantize(c["x"], f, kind, rows, cols, margin, pow2, transpose, r,
                                       c.empty, threads, c.stream)
        codes, scales = c.result(codes), c.result(scales)
    return (_typed(codes, f) if typed else codes), scales


@_doc
@_renamed(target="fmt", elem="fmt")
def cast_scaled(
    x: Any,
    scale: Any,
    fmt: FormatLike,
    *,
    rounding: str = "nearest_even",
    saturate: bool = True,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: int | None = None,
    seed: int = 0,
    offset: int = 0,
    out: Any = None,
    typed: bool = False,
    threads: int = 0,
) -> Any:
    """Quantize with a given multiplier: ``code_i = encode(fmt, fl(x_i * scale))``.

    >>> lowbit.cast_scaled(np.array([0.5, -1.0, 3.0], np.float32), 100.0, "e4m3fn")
    array([100, 236, 121], dtype=uint8)

    x: float32, float16 or bfloat16; numpy or a DLPack producer (read as for :func:`quantize`).
    scale: the quantization multiplier q (not the dequantization factor d = 1/q): a positive
        finite Python number, or a one-element float32 array on x's device (a device array is
        not inspected: that would synchronize).
    fmt: as for :func:`quantize`.
    {policy}
    out: an array of the code dtype shaped like x, on x's device, to write the codes into (it is
        returned); by default a new one.

    Returns the codes, shaped like x, in the caller's array type on x's device.
    """
    if isinstance(scale, (bool, np.bool_)):
        raise TypeError("scale: expected a number or a float32 array, got bool")
    f = _format_arg(fmt)
    r = _rounding(rounding, saturate, subnormals, nan_sign, random_bits, seed, offset)
    typed = _flag("typed", typed)
    threads = _threads(threads)
    arrays = [("x", x, "float32"), ("scale", scale, "float32")]
    if out is not None:
        arrays.append(("out", out, None))
    with _interop.call(*arrays, inplace=("out",) if out is not None else ()) as c:
        codes = _core.cast_scaled(c["x"], c["scale"], f, r, c.values.get("out"), c.empty,
                                  threads, c.stream)
        codes = out if out is not None else c.result(codes)
    return _typed(codes, f) if typed else codes


@_renamed(target="fmt", elem="fmt")
def dequantize(
    codes: Any,
    scales: Any,
    fmt: FormatLike | None = None,
    granularity: GranularityLike = "tensor",
    dtype: Any = "float32",
    *,
    out: Any = None,
    threads: int = 0,
) -> Any:
    """``out_i = fl(value(code_i) * d)`` with the scale d of the element's group: the inverse of
    :func:`quantize` (up to the rounding of the codes).

    >>> codes, scales = lowbit.quantize(np.array([[1.0, -2.0], [0.5, 4.0]], np.float32),
    ...                                 "int8_sym", "rows")
    >>> lowbit.dequantize(codes, scales, "int8_sym", "rows")
    array([[ 1.007874, -2.      ],
           [ 0.503937,  4.      ]], dtype=float32)

    codes: codes of ``fmt`` (uint8/uint16 for formats, int8 or uint8 for integer targets),
        read as a matrix like x in :func:`quantize`.
    scales: float32, contiguous, one per group (any shape with that many elements; NaN scales
        are valid and give NaN groups); a Python float is taken as the one scale of
        granularity "tensor".
    fmt, granularity: as given to :func:`quantize` (codes written with ``transpose`` are
        dequantized with granularity "rows"); typed codes (``quantize(..., typed=True)``) name
        their format, and fmt may then be left out.
    dtype: "float32", the type the kernels compute in.
    out: a float32 array shaped like codes, on their device, to write the values into (it is
        returned); by default a new one.
    threads: CPU threads, 0 for all cores.

    Returns float32 values shaped like codes, in the caller's array type on codes' device.
    """
    codes, f = _typed_codes(codes, fmt)
    g = Granularity.of(granularity)
    _float32_out(dtype)
    threads = _threads(threads)
    code_dtype = None if _interop.is_array(codes) else _code_dtype(f)
    arrays = [("codes", codes, code_dtype), ("scales", scales, "float32")]
    if out is not None:
        arrays.append(("out", out, None))
    with _interop.call(*arrays, inplace=("out",) if out is not None else ()) as c:
        kind, rows, cols = g._core_args()
        result = _core.dequantize(c["codes"], c["scales"], f, kind, rows, cols,
                                  c.values.get("out"), c.empty, threads, c.stream)
        return out if out is not None else c.result(result)


@_doc
@_renamed(target="fmt", elem="fmt")
def quantize_delayed(
    x: Any,
    history: Any,
    fmt: FormatLike,
    *,
    reduce: str = "max",
    margin: int = 0,
    pow2: bool = False,
    rounding: str = "nearest_even",
    saturate: bool = True,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: int | None = None,
    seed: int = 0,
    offset: int = 0,
    typed: bool = False,
    threads: int = 0,
) -> tuple[Any, Any]:
    """Per-tensor quantization with delayed scaling: the scale comes from the amax history of
    earlier steps; then this tensor's amax enters the history.

    >>> history = np.array([4.0, 2.0, 0.0], np.float32)
    >>> codes, (q, d) = lowbit.quantize_delayed(np.array([1.0, -3.0], np.float32), history,
    ...                                         "e4m3fn")
    >>> float(q), history
    (112.0, array([3., 4., 2.], dtype=float32))

    ``amax_used = max(history)`` (reduce="max") or ``history[0]`` (reduce="most_recent");
    q and d follow from it as in :func:`quantize`; then the history shifts by one (the oldest
    entry drops out) and ``history[0] = amax(x)``.

    x: float32, float16 or bfloat16; numpy or a DLPack producer.
    history: float32, contiguous, 1..4096 entries, on x's device, newest first; updated in place
        (so it must be a writable array: not a list, nor a JAX array, which is immutable). Start
        it with zeros (the first call then uses q = d = 1) or with a known amax.
    fmt: as for :func:`quantize`.
    reduce: "max" or "most_recent".
    margin, pow2: as for :func:`quantize`.
    {policy}

    Returns ``(codes, scale_pair)``: the codes shaped like x and a float32 array ``[q, d]`` of
    the multiplier and dequantization factor used, both in the caller's array type on x's device
    (no device synchronization: read ``scale_pair`` when you need it).
    """
    f = _format_arg(fmt)
    reduce = _name("reduce", reduce)
    margin = _integer("margin", margin)
    pow2 = _flag("pow2", pow2)
    r = _rounding(rounding, saturate, subnormals, nan_sign, random_bits, seed, offset)
    typed = _flag("typed", typed)
    threads = _threads(threads)
    with _interop.call(("x", x, "float32"), ("history", history, "float32"),
                       inplace=("history",)) as c:
        codes, pair = _core.quantize_delayed(c["x"], c["history"], f, reduce, margin, pow2, r,
                                             c.empty, threads, c.stream)
        codes, pair = c.result(codes), c.result(pair)
    return (_typed(codes, f) if typed else codes), pair


@_doc
@_renamed(target="fmt", elem="fmt")
def quantize_mx(
    x: Any,
    fmt: FormatLike,
    block: int = 32,
    *,
    rounding: str = "nearest_even",
    saturate: bool = True,
    subnormals: str = "keep",
    nan_sign: str = "preserve",
    random_bits: int | None = None,
    seed: int = 0,
    offset: int = 0,
    typed: bool = False,
    threads: int = 0,
) -> tuple[Any, Any]:
    """OCP Microscaling (MX v1.0): ``block`` consecutive elements of a row share the power-of-two
    scale ``X = 2^s``, ``s = clamp(floor(log2(amax)) - emax_elem, -127, 127)``, stored as an E8M0
    code (``s + 127``); the elements are ``encode(fmt, x_i / X)`` (exact division).

    >>> codes, scales = lowbit.quantize_mx(np.array([1.0, 2.0, 3.0, 100.0], np.float32),
    ...                                    "e4m3fn", block=2)
    >>> codes, scales
    (array([112, 120,  84, 124], dtype=uint8), array([120, 125], dtype=uint8))

    An all-zero block gets s = -127 (code 0x00); a NaN or Inf in a block gives scale code 0xFF and
    every element the element format's NaN (0 for formats without NaN). The default rounding is
    the spec's: nearest-even with saturation (``x / X`` can reach ``2^(emax+1)``, above the
    element maximum).

    x: float32, float16 or bfloat16; numpy or a DLPack producer (read as a matrix, as for
        :func:`quantize`).
    fmt: the element format: "e4m3fn" or "e5m2" (MXFP8), "e3m2fn" or "e2m3fn" (MXFP6),
        "e2m1fn" (MXFP4), "int8" (MXINT8: value = int8 * 2^-6).
    block: the block length along rows, >= 1 (32 in the OCP spec); the last block of a row may
        be shorter, and a block longer than the rows makes one block per row.
    {policy}

    Returns ``(codes, scales)``: codes shaped like x (uint8; int8 for MXINT8) and the E8M0 scale
    codes, uint8, shaped ``x.shape[:-1] + (ceil(N/block),)``, in the caller's array type.
    """
    f = _format_arg(fmt)
    block = _integer("block", block)
    r = _rounding(rounding, saturate, subnormals, nan_sign, random_bits, seed, offset)
    typed = _flag("typed", typed)
    threads = _threads(threads)
    with _interop.call(("x", x, "float32")) as c:
        codes, scales = _core.quantize_mx(c["x"], f, block, r, c.empty, threads, c.stream)
        codes, scales = c.result(codes), c.result(scales)
    return (_typed(codes, f) if typed else codes), scales


@_renamed(target="fmt", elem="fmt")
def dequantize_mx(
    codes: Any,
    scales: Any,
    fmt: FormatLike | None = None,
    block: int = 32,
    dtype: Any = "float32",
    *,
    out: Any = None,
    threads: int = 0,
) -> Any:
    """``out_i = fl(value(code_i) * X)``, X the power of two of the element's block: the inverse
    of :func:`quantize_mx`. A scale code 0xFF (NaN) makes its block NaN.

    >>> lowbit.dequantize_mx(np.array([112, 120, 84, 124], np.uint8),
    ...                      np.array([120, 125], np.uint8), "e4m3fn", block=2)
    array([ 1.,  2.,  3., 96.], dtype=float32)

    codes: codes of ``fmt`` (uint8; int8 for MXINT8), read as a matrix.
    scales: the E8M0 scale codes, uint8, contiguous, ``rows x ceil(N/block)`` elements.
    fmt, block: as given to :func:`quantize_mx`; typed codes name their format, and fmt may
        then be left out.
    dtype: "float32", the type the kernels compute in.
    out: a float32 array shaped like codes, on their device, to write the values into (it is
        returned); by default a new one.
    threads: CPU threads, 0 for all cores.

    Returns float32 values shaped like codes, in the caller's array type on codes' device.
    """
    codes, f = _typed_codes(codes, fmt)
    block = _integer("block", block)
    _float32_out(dtype)
    threads = _threads(threads)
    code_dtype = None if _interop.is_array(codes) else _code_dtype(f)
    arrays = [("codes", codes, code_dtype), ("scales", scales, "uint8")]
    if out is not None:
        arrays.append(("out", out, None))
    with _interop.call(*arrays, inplace=("out",) if out is not None else ()) as c:
        result = _core.dequantize_mx(c["codes"], c["scales"], f, block, c.values.get("out"),
                                     c.empty, threads, c.stream)
        return out if out is not None else c.result(result)


@dataclass(frozen=True)
class TargetInfo:
    """Facts about a quantization format (see :func:`target_info`)."""

    name: str  # the canonical name ("e4m3fn", "int8_sym", ...)
    code_dtype: str  # numpy dtype of the codes ("uint8", "uint16", "int8")
    max: float  # largest finite value (the integer maximum for integer targets)
    is_int: bool  # an integer target


@_renamed(target="fmt", elem="fmt")
def target_info(fmt: FormatLike) -> TargetInfo:
    """Facts about ``fmt`` as a quantization format (a float format whose values fit float32,
    or an integer target by name); ValueError for formats no quantization function takes.

    >>> lowbit.target_info("int8_sym")
    TargetInfo(name='int8_sym', code_dtype='int8', max=127.0, is_int=True)
    """
    name, code_dtype, max_value, is_int = _core.target_info(_format_arg(fmt))
    return TargetInfo(name, code_dtype, max_value, is_int)
