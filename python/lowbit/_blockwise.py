"""Block-wise codebook quantization and SRAM-quantiles (the 8-bit optimizers' state format).

The functions bind the host API of kernels/include/lowbit/kernels/blockwise.hpp; the equations,
the tie rule and the NaN/zero rules are docs/techniques/blockwise.md's, the quantile estimator
docs/techniques/sram-quantiles.md's. Arrays are numpy arrays or DLPack producers (torch CPU/CUDA
tensors, cupy, ...); results come back in the caller's array library on the same device
(lowbit._interop), CUDA work on the caller's current stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from lowbit import _core, _interop
from lowbit._api import _flag, _format, _integer, _name, _renamed, _threads, _uint64
from lowbit._core import Format
from lowbit._quantize import _float32_out

# The block lengths the kernels take (they check them: kernels::is_blockwise_block).
BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)

_NAMED = {
    "dynamic": ("dynamic_tree", True),
    "dynamic_unsigned": ("dynamic_tree", False),
    "linear": ("linear", True),
    "linear_unsigned": ("linear", False),
}


def _host_float32(name: str, value: Any) -> np.ndarray:
    """A 1-D float32 numpy array of the values of a list, numpy array or DLPack producer (CUDA
    arrays are copied to the host on the caller's stream, waiting for the copy)."""
    if _interop.is_array(value):
        value = _interop.to_numpy(name, _interop.to_host(name, value))
    if isinstance(value, np.ndarray) and value.dtype.name == "bfloat16":
        value = value.astype(np.float32)
    arr = _interop.as_numpy(name, value, np.float32)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    return np.ascontiguousarray(arr)


def _frozen(values: np.ndarray) -> np.ndarray:
    values = np.array(values, dtype=np.float32, copy=True)
    values.flags.writeable = False
    return values


class Codebook:
    """A codebook of block-wise quantization: 256 finite float32 values, ascending (equal
    neighbours allowed), in [-1, 1]; code j stands for ``values[j]``.

    Build one with :meth:`dynamic_tree`, :meth:`linear`, :meth:`from_format`,
    :meth:`from_quantiles` or :meth:`from_values` (``Codebook(values)`` is the same as
    ``Codebook.from_values(values)``). The functions of this module also take the names
    ``"dynamic"``, ``"dynamic_unsigned"``, ``"linear"`` and ``"linear_unsigned"``. Two codebooks
    are equal when their values are (``-0.0 == 0.0``, as in the C++ ``operator==``). The
    constructions are docs/techniques/blockwise.md's.
    """

    __slots__ = ("_values", "_origin")

    def __init__(self, values: Any) -> None:
        v = _host_float32("v", values)
        self._values = _frozen(_core.codebook_from_values(v))
        self._origin = ""

    @classmethod
    def _make(cls, values: np.ndarray, origin: str) -> Codebook:
        cb = cls.__new__(cls)
        cb._values = _frozen(values)
        cb._origin = origin
        return cb

    @classmethod
    def dynamic_tree(cls, signed: bool = True) -> Codebook:
        """The dynamic tree map of the 8-bit optimizers: per decade ``10^-d`` (d = 6..0) the
        midpoints of a linear fraction grid on [0.1, 1] that doubles in size toward 1, plus 0 and
        1. Signed: 127 positive values, their negatives, 0 and +1 (no -1); unsigned: 0, 254
        positive values and +1. The float32 bits are those of the published construction (float32
        steps, as PyTorch computes them), within 2 ulps of the exact values rounded once
        (docs/techniques/blockwise.md).

        >>> cb = lowbit.Codebook.dynamic_tree()
        >>> float(cb.values[0]), float(cb.values[127]), float(cb.values[255])
        (-0.992968738079071, 0.0, 1.0)
        """
        signed = _flag("signed", signed)
        return cls._make(_core.codebook_dynamic_tree(signed),
                         f"Codebook.dynamic_tree(signed={signed})")

    @classmethod
    def linear(cls, signed: bool = True) -> Codebook:
        """256 evenly spaced values: ``(2k - 255) / 255`` (signed; no 0) or ``k / 255``
        (unsigned), k = 0..255, correctly rounded to float32.

        >>> signed, unsigned = lowbit.Codebook.linear(), lowbit.Codebook.linear(signed=False)
        >>> float(signed.values[0]), float(unsigned.values[1])
        (-1.0, 0.003921568859368563)
        """
        signed = _flag("signed", signed)
        return cls._make(_core.codebook_linear(signed), f"Codebook.linear(signed={signed})")

    @classmethod
    @_renamed(target="fmt", elem="fmt")
    def from_format(cls, fmt: Union[str, Format]) -> Codebook:
        """Every distinct finite value of a format of at most 8 bits (+-0 once), divided by the
        largest magnitude in float32, padded with zeros to 256 entries and sorted (e4m3fn: 253
        values and 3 extra zeros). Codebook indices are not the format's codes.

        >>> cb = lowbit.Codebook.from_format("e4m3fn")
        >>> float(cb.values[0]), float(cb.values[-1]), len(np.unique(cb.values))
        (-1.0, 1.0, 253)
        """
        f = _format(fmt)
        return cls._make(_core.codebook_from_format(f), f"Codebook.from_format({f.name!r})")

    @classmethod
    def from_quantiles(cls, q: Any) -> Codebook:
        """A quantile map: the 1..255 finite quantiles ``q`` plus 0, divided by their largest
        magnitude in float32, padded with zeros to 256 entries and sorted. ``q`` is a 1-D array
        (any float dtype, rounded to float32; device arrays are copied to the host), e.g.
        ``estimate_quantiles(x, 255)``; see also :func:`quantile_codebook`.

        >>> cb = lowbit.Codebook.from_quantiles([-2.0, 1.0])
        >>> float(cb.values[0]), float(cb.values[-1]), int(np.count_nonzero(cb.values == 0))
        (-1.0, 0.5, 254)
        """
        return cls._make(_core.codebook_from_quantiles(_host_float32("q", q)),
                         "Codebook.from_quantiles(...)")

    @classmethod
    def from_values(cls, v: Any) -> Codebook:
        """User values, validated: exactly 256 finite values in [-1, 1], ascending (a 1-D array;
        other float dtypes are rounded to float32). ValueError naming the first bad entry.

        >>> lowbit.Codebook.from_values(np.linspace(-1, 1, 256)) == lowbit.Codebook.linear()
        True
        """
        return cls(v)

    @classmethod
    def of(cls, value: Any, name: str = "codebook") -> Codebook:
        """A Codebook from a Codebook or one of the names "dynamic", "dynamic_unsigned",
        "linear", "linear_unsigned".

        >>> lowbit.Codebook.of("linear") == lowbit.Codebook.linear()
        True
        """
        if isinstance(value, Codebook):
            return value
        if isinstance(value, str):
            if value not in _NAMED:
                raise ValueError(f"{name} {value!r}: expected one of {', '.join(_NAMED)} or a "
                                 "lowbit.Codebook")
            if value not in _CACHE:
                kind, signed = _NAMED[value]
                _CACHE[value] = getattr(cls, kind)(signed)
            return _CACHE[value]
        raise TypeError(f"{name}: expected a codebook name (str) or a lowbit.Codebook, got "
                        f"{type(value).__name__} (wrap values with lowbit.Codebook.from_values)")

    @property
    def values(self) -> np.ndarray:
        """The 256 entries, a read-only float32 numpy array."""
        return self._values

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Codebook):
            return NotImplemented
        return bool(np.array_equal(self._values, other._values))

    def __hash__(self) -> int:
        return hash((self._values + np.float32(0)).tobytes())  # -0 hashes like +0

    def __repr__(self) -> str:
        v = self._values
        head = f"lowbit.{self._origin}" if self._origin else "lowbit.Codebook"
        return (f"<{head}: [{v[0]:.9g}, {v[1]:.9g}, ..., {v[-2]:.9g}, {v[-1]:.9g}], "
                f"{len(np.unique(v))} distinct values>")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Codebook._make, (np.array(self._values), self._origin))


CodebookLike = Union[str, Codebook]
_CACHE: dict[str, Codebook] = {}


@dataclass(frozen=True, eq=False)
class NestedAbsmax:
    """The per-block absmax values of :func:`quantize_blockwise` stored block-wise quantized
    themselves (double quantization): ``codes`` (uint8, one per block) index ``codebook``, and
    ``absmax`` (float32, one per 256 blocks) scales them, so that the absmax of block b is
    ``fl(codebook.values[codes[b]] * absmax[b // 256])``. Arrays in the caller's array type."""

    codes: Any
    absmax: Any
    codebook: Codebook


@_renamed(target="fmt", elem="fmt")
def quantize_blockwise(
    x: Any,
    codebook: CodebookLike = "dynamic",
    block: int = 2048,
    *,
    rounding: str = "nearest_toward_zero",
    seed: int = 0,
    offset: int = 0,
    nested: bool = False,
    nested_codebook: CodebookLike = "dynamic_unsigned",
    threads: int = 0,
) -> tuple[Any, Any]:
    """Block-wise codebook quantization; returns ``(codes, absmax)``.

    >>> codes, absmax = lowbit.quantize_blockwise(np.array([0.5, -1.0, 0.25], np.float32),
    ...                                           "linear", 64)
    >>> codes, absmax
    (array([191,   0, 159], dtype=uint8), array([1.], dtype=float32))

    x is read flat (C order) and cut into blocks of ``block`` elements (the last may be
    partial). Per block b: ``a_b = max |x_i|`` (stored as float32), ``t_i = fl(x_i / a_b)`` (one
    float32 division; ``t_i = x_i`` in an all-zero block) and ``code_i`` is the index of the
    nearest codebook entry to t_i: a tie goes to the entry of smaller magnitude, at a zero
    midpoint to the positive entry (``rounding="nearest_toward_zero"``). With
    ``rounding="stochastic"``, code_i is one of the two entries around t_i, the upper with
    probability about its distance fraction, from the Philox bits of element i. A block holding
    NaN or Inf stores absmax NaN and every element the code nearest to +0. The exact rules are
    in docs/techniques/blockwise.md.

    x: float32, float16 or bfloat16, contiguous, any shape; numpy or a DLPack producer (lists
        and Python floats are converted to float32 numpy arrays).
    codebook: a :class:`Codebook` or "dynamic" (the signed dynamic tree map), "dynamic_unsigned",
        "linear", "linear_unsigned".
    block: 64, 128, 256, 512, 1024, 2048 or 4096.
    rounding: "nearest_toward_zero" (the nearest entry, ties to the smaller magnitude) or
        "stochastic".
    seed, offset: the Philox stream of stochastic rounding (element i of the flat tensor draws
        bits(i)).
    nested: also quantize the absmax values (double quantization): block-wise in blocks of 256
        with ``nested_codebook`` (nearest entry). Elements are still quantized against their
        exact absmax.
    nested_codebook: the codebook of the nested absmax (default: the unsigned dynamic tree map).
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream).

    Returns codes (uint8, shaped like x) and absmax (float32, shape ``(ceil(n / block),)``), or
    with ``nested`` a :class:`NestedAbsmax` in place of absmax, in the caller's array type on
    x's device.
    """
    cb = Codebook.of(codebook)
    block = _integer("block", block)
    rounding = _name("rounding", rounding)
    seed = _uint64("seed", seed)
    offset = _uint64("offset", offset)
    nested = _flag("nested", nested)
    cb2 = Codebook.of(nested_codebook, "nested_codebook")
    threads = _threads(threads)
    with _interop.call(("x", x, "float32")) as c:
        if not nested:
            codes, absmax = _core.quantize_blockwise(c["x"], cb.values, block, rounding, seed,
                                                     offset, c.empty, threads, c.stream)
            return c.result(codes), c.result(absmax)
        codes, codes2, absmax2 = _core.quantize_blockwise_nested(
            c["x"], cb.values, cb2.values, block, rounding, seed, offset, c.empty, threads,
            c.stream)
        return c.result(codes), NestedAbsmax(c.result(codes2), c.result(absmax2), cb2)


def dequantize_blockwise(
    codes: Any,
    absmax: Any,
    codebook: CodebookLike = "dynamic",
    block: int = 2048,
    dtype: Any = "float32",
    *,
    out: Any = None,
    threads: int = 0,
) -> Any:
    """``out_i = fl(codebook[code_i] * a_b)`` with b = i // block: the inverse of
    :func:`quantize_blockwise` (up to the rounding of the codes). A NaN absmax makes its block
    NaN (the positive quiet NaN).

    >>> lowbit.dequantize_blockwise(np.array([191, 0, 159], np.uint8),
    ...                             np.array([1.0], np.float32), "linear", 64)
    array([ 0.49803922, -1.        ,  0.24705882], dtype=float32)

    codes: uint8, contiguous, any shape (read flat).
    absmax: float32, contiguous, ``ceil(n / block)`` elements; or a :class:`NestedAbsmax`,
        whose block b absmax is ``fl(nested.codebook[nested.codes[b]] * nested.absmax[b // 256])``.
    codebook, block: as given to :func:`quantize_blockwise`.
    dtype: "float32", the type the kernels compute in.
    out: a float32 array shaped like codes, on their device, to write the values into (it is
        returned); by default a new one.
    threads: CPU threads, 0 for all cores.

    Returns float32 values shaped like codes, in the caller's array type on codes' device.
    """
    cb = Codebook.of(codebook)
    block = _integer("block", block)
    _float32_out(dtype)
    threads = _threads(threads)
    extra = [("out", out, None)] if out is not None else []
    inplace = ("out",) if out is not None else ()
    if isinstance(absmax, NestedAbsmax):
        cb2 = Codebook.of(absmax.codebook, "absmax.codebook")
        with _interop.call(("codes", codes, "uint8"), ("absmax.codes", absmax.codes, "uint8"),
                           ("absmax.absmax", absmax.absmax, "float32"), *extra,
                           inplace=inplace) as c:
            result = _core.dequantize_blockwise_nested(
                c["codes"], c["absmax.codes"], c["absmax.absmax"], cb.values, cb2.values, block,
                c.values.get("out"), c.empty, threads, c.stream)
            return out if out is not None else c.result(result)
    with _interop.call(("codes", codes, "uint8"), ("absmax", absmax, "float32"), *extra,
                       inplace=inplace) as c:
        result = _core.dequantize_blockwise(c["codes"], c["absmax"], cb.values, block,
                                            c.values.get("out"), c.empty, threads, c.stream)
        return out if out is not None else c.result(result)


def estimate_quantiles(x: Any, k: int = 256, *, out: Any = None, threads: int = 0) -> Any:
    """SRAM-quantiles: k estimates of the quantiles of x at probabilities ``(2i + 1) / (2k)``.

    >>> lowbit.estimate_quantiles(np.arange(100, dtype=np.float32), 4)
    array([12., 37., 62., 87.], dtype=float32)

    x is read flat and cut into chunks of 4096 elements (the last may be shorter); each chunk is
    sorted (IEEE total order: NaNs and signed zeros have a place) and gives its order statistics
    ``s[floor((2i + 1) m / (2k))]`` (m its length); estimate i is their average weighted by m,
    summed in double in a fixed order (chunk order within groups of 256 chunks, then the groups in
    order) and rounded once to float32. Deterministic, and equal on CPU and GPU; with at most 4096
    elements the quantiles are exact. See
    docs/techniques/sram-quantiles.md (measured rank errors are there).

    x: float32, float16 or bfloat16, contiguous, at least one element; numpy or a DLPack producer.
    k: number of quantiles, 1..4096 (255 for :meth:`Codebook.from_quantiles`).
    out: a float32 array of shape ``(k,)`` on x's device to write the estimates into (it is
        returned); by default a new one.
    threads: CPU threads, 0 for all cores (CUDA work runs on the caller's current stream).

    Returns float32 estimates, shape ``(k,)``, ascending, in the caller's array type on x's
    device.
    """
    k = _integer("k", k)
    threads = _threads(threads)
    extra = [("out", out, None)] if out is not None else []
    with _interop.call(("x", x, "float32"), *extra,
                       inplace=("out",) if out is not None else ()) as c:
        result = _core.estimate_quantiles(c["x"], k, c.values.get("out"), c.empty, threads,
                                          c.stream)
        return out if out is not None else c.result(result)


def quantile_codebook(x: Any, k: int = 255, *, threads: int = 0) -> Codebook:
    """The quantile map of x: ``Codebook.from_quantiles(estimate_quantiles(x, k))``, k in
    1..255 estimated quantiles plus 0 (device estimates are copied to the host, which waits for
    the caller's stream).

    >>> x = np.random.default_rng(0).normal(size=10_000).astype(np.float32)
    >>> cb = lowbit.quantile_codebook(x)
    >>> float(cb.values.min()), len(np.unique(cb.values))
    (-1.0, 256)
    """
    # Checked here, before the estimate (the costly part); Codebook.from_quantiles would refuse
    # too many quantiles only afterwards, naming its own argument.
    k = _integer("k", k)
    if not 1 <= k <= 255:
        raise ValueError(f"k: expected 1..255 quantiles (one codebook entry is kept for 0), "
                         f"got {k}")
    return Codebook.from_quantiles(estimate_quantiles(x, k, threads=threads))
