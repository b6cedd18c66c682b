"""Every public array function, called with a mix of valid and invalid arguments (wrong dtypes,
odd layouts, read-only arrays, unknown names, NaN scales, objects that are not arrays, broken
DLPack producers): each call either succeeds or raises TypeError/ValueError (RuntimeError for a
CUDA array in a build without CUDA) whose message starts with the name of one of the function's
arguments. Never a crash, never another exception."""

from __future__ import annotations

import inspect
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from dlfake import Fake, Wrapped

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16, np.int8, np.uint8, np.uint16,
          np.uint32, np.int32, np.int64, np.bool_, np.complex64]
LAYOUTS = ["contiguous", "reversed", "strided", "transposed", "read-only", "wrapped", "fake",
           "legacy", "big-endian"]


def _array(dtype, shape, layout, special, seed):
    rng = np.random.default_rng(seed)
    base = np.asarray(rng.standard_normal(shape) * 50, np.float64)
    if special and base.size:
        base.flat[0] = special
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.array(base, dtype=dtype)
    if layout == "reversed" and a.ndim:
        a = a[..., ::-1]
    elif layout == "strided" and a.ndim:
        a = np.repeat(a, 2, axis=-1)[..., ::2]
    elif layout == "transposed":
        a = a.T
    elif layout == "read-only":
        a.flags.writeable = False
    elif layout == "wrapped":
        return Wrapped(a)
    elif layout == "fake" and dtype not in (np.bool_, np.complex64):
        return Fake(a)
    elif layout == "legacy":
        return Wrapped(a, legacy_only=True)
    elif layout == "big-endian" and a.dtype.kind in "fiu" and a.dtype.itemsize > 1:
        a = a.astype(a.dtype.newbyteorder(">"))
    return a


arrays = st.builds(
    _array,
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 5), max_size=3).map(tuple),
    st.sampled_from(LAYOUTS),
    st.sampled_from([None, np.nan, np.inf, -np.inf, 0.0, 1e-40]),
    st.integers(0, 2**16),
)
float32_arrays = st.builds(
    _array, st.just(np.float32), st.lists(st.integers(0, 5), min_size=1, max_size=3).map(tuple),
    st.sampled_from(["contiguous", "reversed", "strided", "wrapped", "fake"]),
    st.sampled_from([None, np.nan, 0.0]), st.integers(0, 2**16))
junk = st.sampled_from([None, 1, -3, 1.5, "x", "", b"ab", [1.0, 2.0], [[1.0], [2.0, 3.0]],
                        (), {"a": 1}, object, True, 2**70, np.float32(np.nan)])
unsupported_devices = st.builds(
    lambda d: Fake(np.zeros(3, np.float32), device=d),
    st.sampled_from([(8, 0), (10, 0), (2, 0), (13, 1)]))
array_like = st.one_of(arrays, arrays, junk, unsupported_devices)
names = st.one_of(st.text(max_size=8), junk)
ints = st.one_of(st.integers(-5, 40), st.sampled_from([2**31, -(2**63), 2**64, 3.0]), junk)
bools = st.one_of(st.booleans(), junk)
formats = st.one_of(st.sampled_from(["e4m3fn", "e5m2", "e2m1fn", "float16", "bfloat16",
                                     "e8m0fnu", "float32", "e3m1_fn", "fp8", "e9m3"]),
                    st.just(lowbit.Format(4, 3, specials="fn")), names)
targets = st.one_of(st.sampled_from(["e4m3fn", "e5m2", "e2m1fn", "int8", "int8_sym", "uint8",
                                     "int4", "uint4", "int3", "float32", "e8m0fnu"]), formats)
granularities = st.one_of(
    st.sampled_from(["tensor", "rows", "columns", ("blocks", 4), ("tiles", 2, 3), "blocks",
                     ("blocks", 0), ("tiles", 2), ("blocks", "4"), ("tiles", -1, 2), "cols",
                     lowbit.Granularity.blocks(3), ["blocks", 2], ("blocks", 2.5)]),
    junk)
roundings = st.one_of(st.sampled_from(["nearest_even", "stochastic", "toward_zero", "nearest"]),
                      names)
scales = st.one_of(st.floats(allow_nan=True, allow_infinity=True), array_like)
outs = st.one_of(st.none(), arrays, junk)

POLICY = dict(rounding=roundings, saturate=bools,
              subnormals=st.one_of(st.sampled_from(["keep", "flush"]), names),
              nan_sign=st.one_of(st.sampled_from(["preserve", "positive"]), names),
              random_bits=st.one_of(st.none(), ints), seed=ints, offset=ints, threads=ints)

# function -> argument strategies (valid values are likely, invalid ones frequent)
CALLS = {
    lowbit.cast: dict(x=array_like, fmt=formats, out=outs, typed=bools, **POLICY),
    lowbit.decode: dict(codes=array_like, fmt=formats,
                        dtype=st.one_of(st.sampled_from(["float32", "float64", np.float64,
                                                         "int8"]), junk),
                        out=outs, threads=ints),
    lowbit.quantize: dict(x=st.one_of(float32_arrays, array_like), fmt=targets,
                          granularity=granularities, margin=ints, pow2=bools, transpose=bools,
                          typed=bools, **POLICY),
    lowbit.cast_scaled: dict(x=st.one_of(float32_arrays, array_like), scale=scales,
                             fmt=targets, out=outs, typed=bools, **POLICY),
    lowbit.dequantize: dict(codes=array_like, scales=scales, fmt=targets,
                            granularity=granularities,
                            dtype=st.one_of(st.just("float32"), junk), out=outs,
                            threads=ints),
    lowbit.quantize_delayed: dict(x=st.one_of(float32_arrays, array_like),
                                  history=st.one_of(float32_arrays, array_like), fmt=targets,
                                  reduce=st.one_of(st.sampled_from(["max", "most_recent"]),
                                                   names),
                                  margin=ints, pow2=bools, typed=bools, **POLICY),
    lowbit.quantize_mx: dict(x=st.one_of(float32_arrays, array_like),
                             fmt=st.one_of(st.sampled_from(["e4m3fn", "int8", "e2m1fn"]),
                                            targets),
                             block=ints, typed=bools, **POLICY),
    lowbit.dequantize_mx: dict(codes=array_like, scales=array_like,
                               fmt=st.one_of(st.sampled_from(["e4m3fn", "int8"]), targets),
                               block=ints, dtype=st.one_of(st.just("float32"), junk),
                               out=outs, threads=ints),
}


def _check_outcome(fn, kwargs):
    params = list(inspect.signature(fn).parameters)
    try:
        fn(**kwargs)
    except (TypeError, ValueError, RuntimeError) as e:  # OverflowError only as lowbit's OutOfRange
        message = str(e)
        if isinstance(e, RuntimeError) and not isinstance(e, NotImplementedError):
            assert "CUDA" in message, message
        first = re.match(r"[A-Za-z_][A-Za-z_0-9]*", message)
        assert first and first.group(0) in params + ["granularity"], (
            f"{fn.__name__}: {type(e).__name__} does not name an argument: {message}")


@pytest.mark.parametrize("fn", list(CALLS), ids=lambda f: f.__name__)
def test_fuzz_arguments(fn):
    params = inspect.signature(fn).parameters
    required = {p: s for p, s in CALLS[fn].items()
                if params[p].default is inspect.Parameter.empty}
    optional = {p: s for p, s in CALLS[fn].items() if p not in required}

    @settings(max_examples=150)
    @given(st.fixed_dictionaries(required, optional=optional))
    def run(kwargs):
        _check_outcome(fn, kwargs)

    run()


def test_fuzz_covers_every_public_array_function():
    # The array functions of this package's API modules (other modules bring their own tests).
    public = {getattr(lowbit, name) for name in lowbit.__all__}
    mine = {f for f in public if inspect.isfunction(f)
            and f.__module__ in ("lowbit._api", "lowbit._quantize")}
    no_arrays = {lowbit.format_info, lowbit.formats, lowbit.parse_format, lowbit.roundings,
                 lowbit.target_info}
    assert mine - no_arrays == set(CALLS)
    for fn, strategies in CALLS.items():
        assert set(strategies) == set(inspect.signature(fn).parameters), fn.__name__
