"""JAX arrays in and out (marker `jax`; CPU arrays, JAX is not a CI dependency).

JAX arrays are DLPack producers that lowbit knows only through the protocol and the array API:
they are read in place, results come back through ``jax.numpy.from_dlpack`` (a JAX array in gives
a JAX array out), and every result must be bit-equal to the same call on numpy arrays (which the
other test files check against their oracles). JAX arrays are immutable: lowbit must never write
into one, and must never hand back other values than it computed (JAX without jax_enable_x64
holds no float64).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import Codebook, NestedAbsmax
from producer_cases import expect_verify_shape_errors, failing_verify_cases

pytestmark = pytest.mark.jax

RNG = np.random.default_rng(23)
# Magnitudes over several binades, with a zero, a float32 subnormal, a NaN and an Inf in separate
# rows (so that per-row groups show each rule once).
X = (RNG.standard_normal((6, 40)) * np.exp(RNG.uniform(-4, 4, (6, 40)))).astype(np.float32)
X[0, 0] = 0.0
X[1, 3] = 1e-40
X[2, 7] = np.nan
X[3, 11] = -np.inf
FINITE = np.nan_to_num(X, nan=1.0, posinf=2.0, neginf=-2.0)
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
GRANULARITIES = ["tensor", "rows", "columns", ("blocks", 8), ("tiles", 4, 16)]


@pytest.fixture(scope="module")
def jax():
    import jax

    return jax


@pytest.fixture(scope="module")
def jnp(jax):
    return jax.numpy


def on_jax(jnp, a: np.ndarray):
    """A JAX CPU array with exactly the bits of ``a`` (a transfer, not a JAX computation, so
    subnormals and NaN payloads arrive as they are)."""
    j = jnp.asarray(a)
    assert j.dtype == a.dtype and np.array_equal(bit_view(np.asarray(j)), bit_view(a))
    return j


def bit_view(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same(jax, got, want) -> None:
    """``got`` is a JAX array on the CPU with the dtype, shape and bits of numpy's ``want``."""
    assert isinstance(got, jax.Array), type(got)
    assert {d.platform for d in got.devices()} == {"cpu"}
    got = np.asarray(got)
    want = np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert np.array_equal(bit_view(got), bit_view(want))


# ---- casts and decodes -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e2m1fn", "bfloat16", "float32"])
def test_cast_and_decode(jax, jnp, dtype, fmt):
    x = X.astype(NUMPY_DTYPES[dtype])
    jx = on_jax(jnp, x)
    for kwargs in ({}, {"saturate": True}, {"rounding": "toward_zero", "subnormals": "flush"},
                   {"rounding": "stochastic", "random_bits": 9, "seed": 7, "offset": 3}):
        codes = lowbit.cast(jx, fmt, **kwargs)
        want = lowbit.cast(x, fmt, **kwargs)
        same(jax, codes, want)
        values = lowbit.decode(codes, fmt)
        same(jax, values, lowbit.decode(want, fmt))
        assert values.dtype == jnp.float32


def test_cast_shapes_and_user_formats(jax, jnp):
    my_format = lowbit.Format(exp_bits=3, man_bits=2, bias=3, specials="fn")
    for x in (X.reshape(2, 3, 40), X.T, X[:, ::3], np.float32(-2.7), np.zeros((0, 5), np.float32)):
        x = np.asarray(x)
        jx = on_jax(jnp, x)
        same(jax, lowbit.cast(jx, my_format), lowbit.cast(x, my_format))
        same(jax, lowbit.cast(jx, "e4m3fn"), lowbit.cast(x, "e4m3fn"))


def test_float64_results_need_jax_x64(jax, jnp):
    # Codes of float32 subnormals: JAX without x64 would hold their float64 values as float32,
    # flushed to zero. That must be an error, never other values.
    codes = np.array([1, 2, 0x7F7F, 0x3F800000, 0x7FC00001], np.uint32)
    jcodes = on_jax(jnp, codes)
    with jax.enable_x64(False):
        with pytest.raises(TypeError, match=r"^dtype float64: jax\.numpy\.from_dlpack turned the "
                                            r"float64 results into float32"):
            lowbit.decode(jcodes, "float32", dtype="float64")
    with jax.enable_x64(True):
        got = lowbit.decode(jcodes, "float32", dtype=jnp.float64)
        assert got.dtype == jnp.float64
        same(jax, got, lowbit.decode(codes, "float32", dtype="float64"))
        assert np.asarray(got)[0] == 2.0**-149


# ---- scaled quantization -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
@pytest.mark.parametrize("target", ["int8_sym", "e4m3fn", "e2m1fn", "uint4"])
def test_quantize_and_dequantize(jax, jnp, dtype, granularity, target):
    x = X.astype(NUMPY_DTYPES[dtype])
    jx = on_jax(jnp, x)
    codes, scales = lowbit.quantize(jx, target, granularity, pow2=target == "e4m3fn")
    want_codes, want_scales = lowbit.quantize(x, target, granularity, pow2=target == "e4m3fn")
    same(jax, codes, want_codes)
    same(jax, scales, want_scales)
    back = lowbit.dequantize(codes, scales, target, granularity)
    same(jax, back, lowbit.dequantize(want_codes, want_scales, target, granularity))


def test_quantize_options(jax, jnp):
    jx = on_jax(jnp, X)
    for kwargs in ({"margin": 2}, {"rounding": "stochastic", "seed": 5},
                   {"transpose": True, "granularity": "columns"}):
        got = lowbit.quantize(jx, "e5m2", **kwargs)
        want = lowbit.quantize(X, "e5m2", **kwargs)
        same(jax, got[0], want[0])
        same(jax, got[1], want[1])
    codes, scales = lowbit.quantize(jx, "int8", "tensor")
    # A Python float scale next to JAX codes is allocated by numpy, read in place.
    same(jax, lowbit.dequantize(codes, float(np.asarray(scales)), "int8"),
         lowbit.dequantize(np.asarray(codes), np.asarray(scales), "int8"))


def test_cast_scaled(jax, jnp):
    jx = on_jax(jnp, FINITE)
    for target in ("e4m3fn", "int8", "uint4"):
        want = lowbit.cast_scaled(FINITE, 0.75, target)
        same(jax, lowbit.cast_scaled(jx, 0.75, target), want)
        same(jax, lowbit.cast_scaled(jx, on_jax(jnp, np.float32([0.75])), target), want)


def test_delayed_scaling_with_a_numpy_history(jax, jnp):
    history = np.array([50.0, 0.0, 3.0], np.float32)
    want_history = history.copy()
    for step in range(3):
        x = FINITE * (step + 1)
        codes, pair = lowbit.quantize_delayed(on_jax(jnp, x), history, "e4m3fn")
        want_codes, want_pair = lowbit.quantize_delayed(x, want_history, "e4m3fn")
        same(jax, codes, want_codes)
        same(jax, pair, want_pair)
        assert np.array_equal(bit_view(history), bit_view(want_history))
    assert history[0] == np.abs(FINITE).max() * 3


def test_a_jax_history_is_refused_not_written(jax, jnp):
    # JAX arrays are immutable, and JAX exports legacy DLPack capsules that carry no read-only
    # flag: without the refusal the kernel would write the amax into this array.
    history = jnp.zeros(4, jnp.float32)
    before = np.array(history)
    with pytest.raises(ValueError, match=r"^history: JAX arrays are immutable, but this function "
                                         r"updates history in place"):
        lowbit.quantize_delayed(on_jax(jnp, FINITE), history, "e4m3fn")
    with pytest.raises(ValueError, match=r"^history: JAX arrays are immutable"):
        lowbit.quantize_delayed(FINITE, history, "e4m3fn")
    assert np.array_equal(np.asarray(history), before)


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("elem", ["e4m3fn", "e2m1fn", "int8"])
def test_mx(jax, jnp, dtype, elem):
    x = X.astype(NUMPY_DTYPES[dtype])
    codes, scales = lowbit.quantize_mx(on_jax(jnp, x), elem, 16)
    want_codes, want_scales = lowbit.quantize_mx(x, elem, 16)
    same(jax, codes, want_codes)
    same(jax, scales, want_scales)
    same(jax, lowbit.dequantize_mx(codes, scales, elem, 16),
         lowbit.dequantize_mx(want_codes, want_scales, elem, 16))


# ---- block-wise quantization and quantiles -----------------------------------------------------


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_blockwise(jax, jnp, dtype):
    x = np.tile(X, (3, 2)).astype(NUMPY_DTYPES[dtype])  # 1440 elements: partial last blocks
    jx = on_jax(jnp, x)
    for codebook, block, rounding in (("dynamic", 64, "nearest_toward_zero"), ("linear", 256, "stochastic"),
                                      (Codebook.from_format("e4m3fn"), 1024, "nearest_toward_zero")):
        codes, absmax = lowbit.quantize_blockwise(jx, codebook, block, rounding=rounding, seed=4)
        want_codes, want_absmax = lowbit.quantize_blockwise(x, codebook, block,
                                                            rounding=rounding, seed=4)
        same(jax, codes, want_codes)
        same(jax, absmax, want_absmax)
        same(jax, lowbit.dequantize_blockwise(codes, absmax, codebook, block),
             lowbit.dequantize_blockwise(want_codes, want_absmax, codebook, block))


def test_nested_blockwise(jax, jnp):
    x = np.tile(FINITE, (30, 1))  # 7200 elements: 113 blocks of 64, one nested block
    codes, nested = lowbit.quantize_blockwise(on_jax(jnp, x), "dynamic", 64, nested=True)
    want_codes, want_nested = lowbit.quantize_blockwise(x, "dynamic", 64, nested=True)
    assert isinstance(nested, NestedAbsmax) and nested.codebook == want_nested.codebook
    same(jax, codes, want_codes)
    same(jax, nested.codes, want_nested.codes)
    same(jax, nested.absmax, want_nested.absmax)
    same(jax, lowbit.dequantize_blockwise(codes, nested, "dynamic", 64),
         lowbit.dequantize_blockwise(want_codes, want_nested, "dynamic", 64))


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_quantiles_and_quantile_codebooks(jax, jnp, dtype):
    x = (RNG.standard_normal(9000) * 3).astype(NUMPY_DTYPES[dtype])
    jx = on_jax(jnp, x)
    for k in (1, 255, 4096):
        same(jax, lowbit.estimate_quantiles(jx, k), lowbit.estimate_quantiles(x, k))
    q = lowbit.estimate_quantiles(jx, 255)
    assert Codebook.from_quantiles(q) == Codebook.from_quantiles(np.asarray(q))
    assert lowbit.quantile_codebook(jx) == lowbit.quantile_codebook(x)
    values = Codebook.dynamic_tree().values
    assert Codebook.from_values(on_jax(jnp, values)) == Codebook.from_values(values)


# ---- verify ------------------------------------------------------------------------------------


def same_report(got, want) -> None:
    # The text and the JSON hold every field of a report (test_verify.py checks that).
    assert got.to_json() == want.to_json() and str(got) == str(want)


def test_verify_gives_the_numpy_report(jnp):
    cases = failing_verify_cases(X, FINITE)
    for cand, ref, policy, kwargs in cases:
        want = lowbit.verify(cand, ref, policy, **kwargs)
        assert not want.ok and want.worst  # something to show
        jkwargs = {k: on_jax(jnp, v) if isinstance(v, np.ndarray) else v
                   for k, v in kwargs.items()}
        same_report(lowbit.verify(on_jax(jnp, cand), on_jax(jnp, ref), policy, **jkwargs), want)
        # JAX arrays mix with numpy arrays
        same_report(lowbit.verify(on_jax(jnp, cand), ref, policy, **kwargs), want)
    assert lowbit.verify(on_jax(jnp, X), on_jax(jnp, X), "exact").ok


def test_verify_with_a_bound_function(jnp):
    seen = []

    def within(reference, inputs):
        seen.append((reference, inputs))
        return np.abs(reference) * 2.0**-7

    cand = (FINITE * 1.005).astype(ml_dtypes.bfloat16)
    ref = FINITE.astype(ml_dtypes.bfloat16)
    codes = lowbit.cast(FINITE, "e4m3fn")
    want = lowbit.verify(cand, ref, within, inputs=codes, input_fmt="e4m3fn")
    got = lowbit.verify(on_jax(jnp, cand), on_jax(jnp, ref), within, inputs=on_jax(jnp, codes),
                        input_fmt="e4m3fn")
    assert not got.ok and got.policy == "bound:within"
    same_report(got, want)
    (ref_np, in_np), (ref_jax, in_jax) = seen
    for a, b in ((ref_np, ref_jax), (in_np, in_jax)):
        assert type(b) is np.ndarray and b.dtype == np.float64 and np.array_equal(a, b)


@pytest.mark.parametrize("dtype, fmt", [("float8_e4m3fn", "e4m3fn"), ("float8_e5m2", "e5m2"),
                                        ("float8_e4m3fnuz", "e4m3fnuz")])
def test_verify_reads_jax_float8_arrays_as_codes(jnp, dtype, fmt):
    # JAX's own conversion (nearest-even, in range here) is an outside witness of lowbit's cast.
    x = np.clip(FINITE, -50, 50)
    jcand = on_jax(jnp, x).astype(getattr(jnp, dtype))
    want = lowbit.verify(np.asarray(jcand).view(np.uint8), lowbit.cast(x, fmt), "exact",
                         fmt=fmt)
    got = lowbit.verify(jcand, lowbit.cast(x, fmt), "exact")
    assert got.ok and got.grid == fmt
    same_report(got, want)
    assert lowbit.verify(jcand, on_jax(jnp, x.astype(getattr(ml_dtypes, dtype))), "exact").ok
    with pytest.raises(ValueError, match=rf"^candidate: dtype {dtype} holds {fmt} codes, but the "
                                         r"format is e3m4"):
        lowbit.verify(jcand, lowbit.cast(x, fmt), "exact", fmt="e3m4")


# ---- refusals ----------------------------------------------------------------------------------


def test_bad_inputs_are_named(jax, jnp):
    jx = on_jax(jnp, FINITE)
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported; expected float32"):
        lowbit.cast(jnp.arange(4, dtype=jnp.int32), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported"):
        lowbit.quantize(jnp.arange(4, dtype=jnp.int32), "int8")
    with pytest.raises(TypeError, match=r"^codes: dtype float32 does not hold codes of e4m3fn; "
                                        r"expected uint8"):
        lowbit.decode(jx, "e4m3fn")
    codes, scales = lowbit.quantize(jx, "int8_sym", "rows")
    with pytest.raises(TypeError, match=r"^codes: dtype uint8 does not hold codes of int8_sym"):
        lowbit.dequantize(lowbit.cast(jx, "e4m3fn"), scales, "int8_sym", "rows")
    with pytest.raises(ValueError, match=r"^scales: expected 6 elements \(one per group\) but "
                                         r"got shape \(3,\)"):
        lowbit.dequantize(codes, jnp.ones(3, jnp.float32), "int8_sym", "rows")
    blocks, absmax = lowbit.quantize_blockwise(jx, "dynamic", 64)
    with pytest.raises(ValueError, match=r"^absmax: "):
        lowbit.dequantize_blockwise(blocks, absmax[:-1], "dynamic", 64)
    expect_verify_shape_errors(jx)
    with pytest.raises(TypeError, match=r"^candidate: dtype bool8? is not supported"):
        lowbit.verify(jx > 0, jx > 0, "exact")


def test_traced_and_deleted_arrays_are_named(jax, jnp):
    # lowbit runs eagerly on concrete arrays: inside jax.jit there is no memory to read.
    with pytest.raises(TypeError, match=r"^x: .*__dlpack__\(\) failed: .*Concretization"):
        jax.jit(lambda a: lowbit.cast(a, "e4m3fn"))(on_jax(jnp, X))
    gone = on_jax(jnp, X)
    gone.delete()
    with pytest.raises(TypeError, match=r"^x: ArrayImpl\.__dlpack"):
        lowbit.cast(gone, "e4m3fn")


def test_the_first_argument_decides_the_result_type(jax, jnp):
    codes, scales = lowbit.quantize(X, "e4m3fn", "rows")
    got = lowbit.dequantize(codes, on_jax(jnp, scales), "e4m3fn", "rows")
    assert type(got) is np.ndarray
    got = lowbit.dequantize(on_jax(jnp, codes), scales, "e4m3fn", "rows")
    same(jax, got, lowbit.dequantize(codes, scales, "e4m3fn", "rows"))
