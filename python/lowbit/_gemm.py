"""The scaled matmul of the GEMM layer: ``out = (sa * A) (sb * B)^T + bias`` over int8 codes,
fp8 codes or 16-bit values, the dequantization fused into the epilogue.

It binds kernels/include/lowbit/kernels/gemm.hpp; the rule, the backends and their bounds are
docs/techniques/gemm.md's. Arrays are numpy arrays or DLPack producers (torch CPU/CUDA tensors,
cupy, ...); the result comes back in the caller's array library on the same device
(lowbit._interop), CUDA work on the caller's current stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lowbit import _core, _dtypes, _interop
from lowbit._api import _dtype_name, _format, _format_arg, _name, _threads

_OUT_DTYPES = ("float32", "bfloat16", "float16")

_KINDS = ("fp32_sequential", "exact", "block_fixed_point")
_TERMS = ("toward_zero", "nearest_even")  # emu::term_rounding's order
_REGISTER = ("nearest_even", "toward_zero")  # emu::register_rounding's order
_EXPONENT = ("of_product", "of_operands", "of_operand_fields")  # emu::product_exponent's order


@dataclass(frozen=True)
class Accumulation:
    """How a matmul sums its exact products: emu::accumulation (emu/include/lowbit/emu/
    accumulate.hpp; the equations are docs/techniques/fp8-training.md's "The accumulation
    models"). Build one with ``Accumulation.fp32()`` (acc = acc + p in k order, float32
    nearest-even: the CPU twin's and simt's own sum), ``Accumulation.exact()`` (the exact sum:
    the reference's; no backend computes it) or ``Accumulation.block_fixed_point(...)`` (a
    tensor-core model: blocks of ``k`` products aligned to the block's largest exponent, kept to
    ``fraction_bits`` bits below it, summed exactly, written into a float32 register, promoted
    into a float32 accumulator every ``promote_every`` blocks, 0 for never; the register keeps
    ``register_bits`` significand bits, 24 for float32; ``exponent`` "of_operands" places each
    product by its operands' exponents e(a) + e(b) rather than its own, "of_operand_fields" the
    same with a subnormal operand at its format's minimum normal exponent, as its exponent field
    reads). ``Accumulation.hopper()``
    is the model fitted to the H200's fp8 tensor cores (slow accumulation; ``fast=True`` for fast
    accumulation).

    >>> lowbit.Accumulation.parse(str(lowbit.Accumulation.block_fixed_point(32, 13)))
    Accumulation.block_fixed_point(k=32, fraction_bits=13)

    ``str()`` gives a short spec (``"fp32"``, ``"exact"``, ``"bfp:k=32,f=13,..."``) that
    :meth:`parse` reads back: the form the torch custom op ``lowbit::scaled_mm`` takes.
    """

    kind: str = "fp32_sequential"
    k: int = 1
    fraction_bits: int = 23
    align_with_register: bool = False
    terms: str = "toward_zero"
    register: str = "nearest_even"
    promote_every: int = 0
    register_bits: int = 24
    exponent: str = "of_product"

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"accumulation kind {self.kind!r}: expected one of "
                             f"{', '.join(_KINDS)}")
        if self.terms not in _TERMS:
            raise ValueError(f"accumulation terms {self.terms!r}: expected one of "
                             f"{', '.join(_TERMS)}")
        if self.register not in _REGISTER:
            raise ValueError(f"accumulation register {self.register!r}: expected one of "
                             f"{', '.join(_REGISTER)}")
        if self.exponent not in _EXPONENT:
            raise ValueError(f"accumulation exponent {self.exponent!r}: expected one of "
                             f"{', '.join(_EXPONENT)}")
        for name in ("k", "fraction_bits", "promote_every", "register_bits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"accumulation {name}: expected an int, got {type(v).__name__}")
        if self.kind == "block_fixed_point" and not (
                1 <= self.k <= 64 and 0 <= self.fraction_bits <= 40 and self.promote_every >= 0
                and 1 <= self.register_bits <= 24):
            raise ValueError(f"accumulation: block_fixed_point needs 1 <= k <= 64, 0 <= "
                             f"fraction_bits <= 40, promote_every >= 0 and 1 <= register_bits "
                             f"<= 24 (got k={self.k}, fraction_bits={self.fraction_bits}, "
                             f"promote_every={self.promote_every}, "
                             f"register_bits={self.register_bits})")
        if not isinstance(self.align_with_register, (bool, int)):  # bool("no") would be True
            raise TypeError(f"accumulation align_with_register: expected a bool, got "
                            f"{self.align_with_register!r}")
        object.__setattr__(self, "align_with_register", bool(self.align_with_register))

    @classmethod
    def fp32(cls) -> Accumulation:
        """acc = acc + p in product order, float32 nearest-even."""
        return cls("fp32_sequential")

    @classmethod
    def exact(cls) -> Accumulation:
        """The exact sum, rounded once (the reference's; the kernels refuse it)."""
        return cls("exact")

    @classmethod
    def block_fixed_point(cls, k: int, fraction_bits: int, *, align_with_register: bool = False,
                          terms: str = "toward_zero", register: str = "nearest_even",
                          promote_every: int = 0, register_bits: int = 24,
                          exponent: str = "of_product") -> Accumulation:
        """The tensor-core model of emu::block_fixed_point (parameters as the class doc)."""
        return cls("block_fixed_point", k, fraction_bits, align_with_register, terms, register,
                   promote_every, register_bits, exponent)

    @classmethod
    def hopper(cls, fast: bool = False) -> Accumulation:
        """emu::hopper_fp8_accumulation: the H200's fp8 sum as the probes and the replayed
        training matmuls pinned it (docs/techniques/fp8-training.md, "Hopper's parameters"):
        blocks of 32 products aligned with the register, 13 fraction bits, truncated; a 14-bit
        register truncated; products placed by their operands' exponent fields; slow
        accumulation promotes into float32 every 4 blocks, fast accumulation never."""
        return cls.block_fixed_point(32, 13, align_with_register=True, terms="toward_zero",
                                     register="toward_zero", promote_every=0 if fast else 4,
                                     register_bits=14, exponent="of_operand_fields")

    def fields(self) -> list[int]:
        """The nine integers the compiled module takes (python/src/gemm.cpp)."""
        return [_KINDS.index(self.kind), self.k, self.fraction_bits,
                int(self.align_with_register), _TERMS.index(self.terms),
                _REGISTER.index(self.register), self.promote_every, self.register_bits,
                _EXPONENT.index(self.exponent)]

    def __str__(self) -> str:
        if self.kind == "fp32_sequential":
            return "fp32"
        if self.kind == "exact":
            return "exact"
        return (f"bfp:k={self.k},f={self.fraction_bits},align={int(self.align_with_register)},"
                f"terms={self.terms},register={self.register},promote={self.promote_every},"
                f"reg_bits={self.register_bits},exp={self.exponent}")

    def __repr__(self) -> str:
        if self.kind != "block_fixed_point":
            return f"Accumulation.{'fp32' if self.kind == 'fp32_sequential' else 'exact'}()"
        extra = []
        if self.align_with_register:
            extra.append("align_with_register=True")
        if self.terms != "toward_zero":
            extra.append(f"terms={self.terms!r}")
        if self.register != "nearest_even":
            extra.append(f"register={self.register!r}")
        if self.promote_every:
            extra.append(f"promote_every={self.promote_every}")
        if self.register_bits != 24:
            extra.append(f"register_bits={self.register_bits}")
        if self.exponent != "of_product":
            extra.append(f"exponent={self.exponent!r}")
        tail = "".join(", " + e for e in extra)
        return f"Accumulation.block_fixed_point(k={self.k}, fraction_bits={self.fraction_bits}{tail})"

    @classmethod
    def parse(cls, spec: str) -> Accumulation:
        """The value of ``str(accumulation)``; also "fp32_sequential" and "block_fixed_point:..."."""
        if not isinstance(spec, str):
            raise TypeError(f"accumulation: expected a spec (str), got {type(spec).__name__}")
        if spec in ("fp32", "fp32_sequential"):
            return cls.fp32()
        if spec == "exact":
            return cls.exact()
        head, _, rest = spec.partition(":")
        if head not in ("bfp", "block_fixed_point") or not rest:
            raise ValueError(f"accumulation {spec!r}: expected 'fp32', 'exact' or "
                             "'bfp:k=..,f=..[,align=0|1,terms=..,register=..,promote=..,"
                             "reg_bits=..,exp=of_product|of_operands|of_operand_fields]'")
        keys = {"k": "k", "f": "fraction_bits", "align": "align_with_register",
                "terms": "terms", "register": "register", "promote": "promote_every",
                "reg_bits": "register_bits", "exp": "exponent"}
        kw: dict[str, Any] = {}
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or key not in keys or keys[key] in kw:
                raise ValueError(f"accumulation {spec!r}: bad or repeated field {item!r} "
                                 f"(fields {', '.join(keys)})")
            if key in ("terms", "register", "exp"):
                kw[keys[key]] = value
            else:
                try:
                    kw[keys[key]] = int(value)
                except ValueError:
                    raise ValueError(f"accumulation {spec!r}: {key} is not an integer") from None
        if "k" not in kw or "fraction_bits" not in kw:
            raise ValueError(f"accumulation {spec!r}: k and f are required")
        return cls("block_fixed_point", **kw)

    @classmethod
    def of(cls, value: Any) -> Accumulation:
        """An Accumulation, or its spec string."""
        if isinstance(value, Accumulation):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise TypeError(f"accumulation: expected a lowbit.Accumulation or a spec string, got "
                        f"{type(value).__name__}")


def _block(arg: str, value: Any) -> tuple[int, int]:
    """Block scales as (block_rows, block_k): a tuple, or the granularity that made the scales
    (("blocks", k) of :func:`quantize` is (1, k), ("tiles", r, c) is (r, c))."""
    if value is None:
        return (0, 0)
    if isinstance(value, tuple) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        return (int(value[0]), int(value[1]))
    from lowbit._quantize import Granularity

    try:
        g = Granularity.of(value)
    except (TypeError, ValueError):
        raise TypeError(f"{arg}: expected (block_rows, block_k), ('blocks', k) or ('tiles', r, c),"
                        f" got {value!r}") from None
    if g.kind == "blocks":
        return (1, g.size[0])
    if g.kind == "tiles":
        return (g.size[0], g.size[1])
    raise ValueError(f"{arg}: block scales come from ('blocks', k) or ('tiles', r, c) "
                     f"granularities, got {g.kind!r} (pass those scales without {arg})")


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
    accumulation: Any = None,
    a_block: Any = None,
    b_block: Any = None,
    fast_accumulation: bool = False,
) -> Any:
    """``out[m, n] = round(((float(acc[m, n]) * sb[n]) * sa[m]) + bias[n])`` (per-row scales; with
    one scale or none per operand ``round((float(acc[m, n]) * (sa * sb)) + bias[n])``) with
    ``acc = A[m, :] . B[n, :]``: a matmul of two K-major operands (A is M x K, B is N x K, so
    the product is A B^T) whose dequantization and bias are fused into the epilogue.

    >>> a = np.array([[1, -2, 3]], np.int8)
    >>> b = np.array([[4, 5, 6], [-1, 0, 1]], np.int8)
    >>> lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=0.5,
    ...                      b_scales=np.array([1.0, 2.0], np.float32))
    array([[6., 2.]], dtype=float32)

    Each step of the epilogue is one float32 operation rounded to nearest-even (no fused
    multiply-add), the last rounding to out's dtype is nearest-even. ``acc`` is the exact int32
    sum for int8 operands (K up to 131071) and a float32 sum of the
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
    accumulation: None (each backend's own sum) or an :class:`Accumulation` (or its spec
        string) for fp8 and 16-bit operands: the CPU twin and simt (which "automatic" then
        picks) sum with that model; tensor-core backends refuse one (they sum in hardware).
    a_block, b_block: block scales: (block_rows, block_k), or the granularity that made the
        scales (("blocks", 128) is (1, 128), ("tiles", 128, 128) is (128, 128)); the scales are
        then :func:`quantize`'s [ceil(rows / block_rows), ceil(K / block_k)] float32 factors, or
        :func:`quantize_mx`'s uint8 E8M0 codes with ``(1, 32)`` for fp8 operands. Each K
        block's partial sum (exact int32 for int8; float32 or the accumulation model, started
        afresh, for the others) is multiplied by its two scales, ``(acc_j * sb) * sa``, and the
        terms are summed in float32 in block order, the first as the start, then the bias
        (docs/techniques/gemm.md, "Block scales"). CPU twin and simt only.
    fast_accumulation: cuBLASLt's fp8 fast accumulation (the tensor cores' partial sum is never
        promoted into float32; on the H200 the sum of ``Accumulation.hopper(fast=True)``): fp8
        operands on a CUDA device with fp8, backend "cublaslt" or "automatic" only (else
        ValueError for other operands, RuntimeError for other backends, CPU arrays or with
        ``accumulation``). Off: cuBLASLt's slow accumulation, ``Accumulation.hopper()``.

    Empty problems (M, N or K of 0) give round(bias) (zeros without a bias). Returns the result
    in the caller's array type on a's device (bfloat16 numpy results are ml_dtypes arrays).
    """
    a, af = _operand("a", a, a_fmt)
    b, bf = _operand("b", b, b_fmt)
    dt = _out_dtype(out_dtype)
    backend = _name("backend", backend)
    threads = _threads(threads)
    acc = None if accumulation is None else Accumulation.of(accumulation).fields()
    if not isinstance(fast_accumulation, bool):
        raise TypeError(f"fast_accumulation: expected a bool, got "
                        f"{type(fast_accumulation).__name__}")
    ab, bb = _block("a_block", a_block), _block("b_block", b_block)
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
                                     backend, _empty(c), threads, c.stream, acc, ab, bb,
                                     fast_accumulation)
        return out if out is not None else c.result(result)

