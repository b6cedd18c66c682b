"""CuPy arrays in and out (marker `cupy`: needs CuPy, a CUDA device and a lowbit build with CUDA
kernels; PyTorch is not needed).

A cupy.ndarray is a DLPack producer that lowbit knows by type: it is read in place on its device,
results are allocated with cupy on that device (cupy in, cupy out), and the CUDA work runs on
``cupy.cuda.get_current_stream()``. Every result must be bit-equal to the same call on numpy
copies of the inputs (the CUDA kernels and the CPU twin agree bit for bit; the other test files
hold the numpy path against its oracles).
"""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import Codebook, NestedAbsmax
from producer_cases import expect_verify_shape_errors, failing_verify_cases

try:
    import cupy
except Exception:  # the `cupy` marker skips every test here, with conftest's reason
    cupy = None

pytestmark = pytest.mark.cupy

RNG = np.random.default_rng(31)
# 37 x 70: partial blocks, tiles and MX blocks. Magnitudes over several binades; a zero row, a
# float32 subnormal, a NaN and an Inf in separate rows (per-row groups show each rule once).
X = (RNG.standard_normal((37, 70)) * np.exp(RNG.uniform(-4, 4, (37, 70)))).astype(np.float32)
X[3] = 0.0
X[1, 3] = 1e-40
X[5, 9] = np.nan
X[7, 11] = -np.inf
FINITE = np.nan_to_num(X, nan=1.0, posinf=2.0, neginf=-2.0)
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
GRANULARITIES = ["tensor", "rows", "columns", ("blocks", 8), ("tiles", 4, 16)]

# The _core functions that launch CUDA work; each takes the stream as its last argument.
LAUNCHERS = ("cast", "decode", "quantize", "dequantize", "cast_scaled", "quantize_delayed",
             "quantize_mx", "dequantize_mx", "quantize_blockwise", "dequantize_blockwise",
             "quantize_blockwise_nested", "dequantize_blockwise_nested", "estimate_quantiles")

# A GPU-side wait of about `cycles` SM clock cycles on the current stream.
SPIN_SOURCE = r"""
extern "C" __global__ void lowbit_test_spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""


def bit_view(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


_BF16_REASON: list[str | None] = []


def no_bfloat16() -> str | None:
    """Why this CuPy cannot hand lowbit bfloat16 arrays (None when it can: CuPy >= 14 holds them
    with ml_dtypes installed)."""
    if not _BF16_REASON:
        reason = None
        try:
            d = cupy.asarray(np.ones(3, ml_dtypes.bfloat16))
        except Exception as e:
            reason = f"CuPy {cupy.__version__} holds no bfloat16 arrays ({type(e).__name__}: {e})"
        else:
            try:  # lowbit reads cupy arrays through DLPack
                d.__dlpack__()
            except Exception as e:
                reason = (f"CuPy {cupy.__version__} cannot export bfloat16 through DLPack "
                          f"({type(e).__name__}: {e})")
        _BF16_REASON.append(reason)
    return _BF16_REASON[0]


def on_device(a) -> "cupy.ndarray":
    """A cupy array on the current device with exactly the dtype and bits of numpy's ``a``
    (a skip for bfloat16 where this CuPy cannot hold it or export it)."""
    a = np.asarray(a)
    if a.dtype == np.dtype(ml_dtypes.bfloat16) and no_bfloat16():
        pytest.skip(no_bfloat16())
    d = cupy.asarray(a)
    assert np.dtype(d.dtype) == a.dtype and d.shape == a.shape
    assert np.array_equal(bit_view(cupy.asnumpy(d)), bit_view(a))
    return d


def same(got, want, device: int | None = None) -> None:
    """``got`` is a cupy array (on ``device``, the current one by default) with the dtype, shape
    and bits of numpy's ``want``."""
    assert isinstance(got, cupy.ndarray), type(got)
    assert got.device.id == (cupy.cuda.Device().id if device is None else device)
    host = cupy.asnumpy(got)
    want = np.asarray(want)
    assert (host.dtype, host.shape) == (want.dtype, want.shape)
    assert np.array_equal(bit_view(host), bit_view(want))


def spin(cycles: int) -> None:
    kernel = cupy.RawKernel(SPIN_SOURCE, "lowbit_test_spin")
    kernel((1,), (1,), (np.int64(cycles),))


@pytest.fixture
def launches(monkeypatch):
    """(function, stream) of every _core call that launches work, in call order."""
    seen: list[tuple[str, int]] = []
    for name in LAUNCHERS:
        fn = getattr(lowbit._core, name)

        def spy(*args, _fn=fn, _name=name):
            seen.append((_name, int(args[-1])))
            return _fn(*args)

        monkeypatch.setattr(lowbit._core, name, spy)
    return seen


# ---- casts and decodes -------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [*NUMPY_DTYPES, "float64"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e2m1fn", "bfloat16", "float32"])
def test_cast_and_decode(dtype, fmt):
    x = X.astype(NUMPY_DTYPES.get(dtype, dtype))
    dx = on_device(x)
    for kwargs in ({}, {"saturate": True}, {"rounding": "toward_zero", "subnormals": "flush"},
                   {"rounding": "stochastic", "random_bits": 9, "seed": 7, "offset": 3}):
        codes = lowbit.cast(dx, fmt, **kwargs)
        want = lowbit.cast(x, fmt, **kwargs)
        same(codes, want)
        values = lowbit.decode(codes, fmt)
        same(values, lowbit.decode(want, fmt))
        wide = lowbit.decode(codes, fmt, dtype="float64")
        same(wide, lowbit.decode(want, fmt, dtype="float64"))


# Views that numpy and cupy take alike: transposed and column-strided ones are made contiguous on
# the caller's stream by cupy first, row-strided ones are read in place by the kernels.
VIEWS = {
    "transposed": lambda a: a.T,
    "every_third_column": lambda a: a[:, ::3],
    "row_slice": lambda a: a[2:9],
    "every_other_row": lambda a: a[::2],
    "columns_from_5": lambda a: a[:, 5:],
    "3d": lambda a: a[:36].reshape(4, 9, 70),
    "0d": lambda a: a[4:5, 4:5].reshape(()),
    "empty": lambda a: a[:0, :5],
}


@pytest.mark.parametrize("view", list(VIEWS))
def test_cast_and_decode_views(view):
    take = VIEWS[view]
    x, dx = take(X), take(on_device(X))
    assert isinstance(x, np.ndarray) and dx.shape == x.shape
    my_format = lowbit.Format(exp_bits=3, man_bits=2, bias=3, specials="fn")
    for fmt in ("e4m3fn", my_format):
        same(lowbit.cast(dx, fmt, rounding="stochastic", seed=11),
             lowbit.cast(x, fmt, rounding="stochastic", seed=11))
    codes = lowbit.cast(X, "e5m2")
    same(lowbit.decode(take(on_device(codes)), "e5m2"), lowbit.decode(take(codes), "e5m2"))


# ---- scaled quantization -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
@pytest.mark.parametrize("target", ["int8_sym", "int8", "e4m3fn", "e2m1fn", "uint4"])
def test_quantize_and_dequantize(dtype, granularity, target):
    x = X.astype(NUMPY_DTYPES[dtype])
    dx = on_device(x)
    for pow2 in (False, True):
        codes, scales = lowbit.quantize(dx, target, granularity, pow2=pow2)
        want_codes, want_scales = lowbit.quantize(x, target, granularity, pow2=pow2)
        same(codes, want_codes)
        same(scales, want_scales)
        back = lowbit.dequantize(codes, scales, target, granularity)
        same(back, lowbit.dequantize(want_codes, want_scales, target, granularity))
        # numpy's codes and scales, moved to the device, dequantize to the same values
        same(lowbit.dequantize(on_device(want_codes), on_device(want_scales), target,
                               granularity),
             lowbit.dequantize(want_codes, want_scales, target, granularity))


def test_quantize_options_and_layouts():
    dx = on_device(X)
    for kwargs in ({"margin": 2}, {"rounding": "stochastic", "seed": 5, "offset": 9},
                   {"transpose": True, "granularity": "columns"},
                   {"saturate": False, "subnormals": "flush", "nan_sign": "positive"}):
        got = lowbit.quantize(dx, "e5m2", **kwargs)
        want = lowbit.quantize(X, "e5m2", **kwargs)
        same(got[0], want[0])
        same(got[1], want[1])
    # rows strided on the device (last dimension contiguous): read in place
    got = lowbit.quantize(dx[::2, 3:], "int8_sym", "rows")
    want = lowbit.quantize(X[::2, 3:], "int8_sym", "rows")
    same(got[0], want[0])
    same(got[1], want[1])
    # a 3-D tensor is read as a matrix (leading dimensions are the rows)
    x3 = X[:36].reshape(3, 12, 70)
    got = lowbit.quantize(on_device(x3), "e4m3fn", ("blocks", 16))
    want = lowbit.quantize(x3, "e4m3fn", ("blocks", 16))
    assert got[1].shape == (3, 12, 5)
    same(got[0], want[0])
    same(got[1], want[1])


@pytest.mark.parametrize("target", ["e4m3fn", "int8", "uint4"])
def test_cast_scaled(target):
    dx = on_device(FINITE)
    want = lowbit.cast_scaled(FINITE, 0.75, target)
    # a Python float next to a cupy array becomes a cupy array on its device
    same(lowbit.cast_scaled(dx, 0.75, target), want)
    same(lowbit.cast_scaled(dx, on_device(np.float32([0.75])), target), want)
    same(lowbit.cast_scaled(on_device(FINITE.astype(np.float16)), 0.75, target),
         lowbit.cast_scaled(FINITE.astype(np.float16), 0.75, target))


def test_delayed_scaling_updates_a_cupy_history():
    history = on_device(np.array([50.0, 0.0, 3.0], np.float32))
    want_history = np.array([50.0, 0.0, 3.0], np.float32)
    for step, reduce in enumerate(("max", "most_recent", "max")):
        x = FINITE * (step + 1)
        codes, pair = lowbit.quantize_delayed(on_device(x), history, "e4m3fn", reduce=reduce)
        want_codes, want_pair = lowbit.quantize_delayed(x, want_history, "e4m3fn", reduce=reduce)
        same(codes, want_codes)
        same(pair, want_pair)
        same(history, want_history)  # updated in place, on the device
    assert want_history[0] == np.abs(FINITE).max() * 3


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
@pytest.mark.parametrize("elem", ["e4m3fn", "e5m2", "e2m1fn", "int8"])
@pytest.mark.parametrize("block", [32, 16])
def test_mx(dtype, elem, block):
    x = X.astype(NUMPY_DTYPES[dtype])
    codes, scales = lowbit.quantize_mx(on_device(x), elem, block)
    want_codes, want_scales = lowbit.quantize_mx(x, elem, block)
    same(codes, want_codes)
    same(scales, want_scales)
    same(lowbit.dequantize_mx(codes, scales, elem, block),
         lowbit.dequantize_mx(want_codes, want_scales, elem, block))


# ---- block-wise quantization and quantiles -----------------------------------------------------


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_blockwise(dtype):
    x = np.tile(X, (3, 2)).astype(NUMPY_DTYPES[dtype])  # 15540 elements: partial last blocks
    dx = on_device(x)
    for codebook, block, rounding in (("dynamic", 64, "nearest_toward_zero"), ("linear", 256, "stochastic"),
                                      ("dynamic", 4096, "stochastic"),
                                      (Codebook.from_format("e4m3fn"), 1024, "nearest_toward_zero")):
        codes, absmax = lowbit.quantize_blockwise(dx, codebook, block, rounding=rounding, seed=4)
        want_codes, want_absmax = lowbit.quantize_blockwise(x, codebook, block,
                                                            rounding=rounding, seed=4)
        same(codes, want_codes)
        same(absmax, want_absmax)
        same(lowbit.dequantize_blockwise(codes, absmax, codebook, block),
             lowbit.dequantize_blockwise(want_codes, want_absmax, codebook, block))


def test_nested_blockwise():
    x = np.tile(FINITE, (30, 1))  # 77700 elements: 1215 blocks of 64, 5 nested blocks
    codes, nested = lowbit.quantize_blockwise(on_device(x), "dynamic", 64, nested=True)
    want_codes, want_nested = lowbit.quantize_blockwise(x, "dynamic", 64, nested=True)
    assert isinstance(nested, NestedAbsmax) and nested.codebook == want_nested.codebook
    same(codes, want_codes)
    same(nested.codes, want_nested.codes)
    same(nested.absmax, want_nested.absmax)
    same(lowbit.dequantize_blockwise(codes, nested, "dynamic", 64),
         lowbit.dequantize_blockwise(want_codes, want_nested, "dynamic", 64))


@pytest.mark.parametrize("dtype", list(NUMPY_DTYPES))
def test_quantiles_and_quantile_codebooks(dtype):
    x = (RNG.standard_normal(9000) * 3).astype(NUMPY_DTYPES[dtype])
    dx = on_device(x)
    for k in (1, 255, 4096):
        same(lowbit.estimate_quantiles(dx, k), lowbit.estimate_quantiles(x, k))
    q = lowbit.estimate_quantiles(dx, 255)
    assert Codebook.from_quantiles(q) == Codebook.from_quantiles(cupy.asnumpy(q))
    assert lowbit.quantile_codebook(dx) == lowbit.quantile_codebook(x)


# ---- streams -----------------------------------------------------------------------------------


def test_the_kernels_are_handed_cupys_current_stream(launches):
    dx = on_device(X)
    history = on_device(np.zeros(3, np.float32))
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        codes = lowbit.cast(dx, "e4m3fn")
        lowbit.decode(codes, "e4m3fn")
        c, s = lowbit.quantize(dx, "int8_sym", "rows")
        lowbit.dequantize(c, s, "int8_sym", "rows")
        lowbit.cast_scaled(dx, 2.0, "e4m3fn")
        lowbit.quantize_delayed(dx, history, "e4m3fn")
        c, s = lowbit.quantize_mx(dx, "e4m3fn")
        lowbit.dequantize_mx(c, s, "e4m3fn")
        c, a = lowbit.quantize_blockwise(dx, "dynamic", 64)
        lowbit.dequantize_blockwise(c, a, "dynamic", 64)
        c, n = lowbit.quantize_blockwise(dx, "dynamic", 64, nested=True)
        lowbit.dequantize_blockwise(c, n, "dynamic", 64)
        lowbit.estimate_quantiles(dx, 16)
    side.synchronize()
    assert [name for name, _ in launches] == list(LAUNCHERS)
    assert all(stream == side.ptr for _, stream in launches), (side.ptr, launches)
    assert side.ptr != 0
    launches.clear()
    lowbit.cast(dx, "e4m3fn")  # outside the `with`: cupy's current stream again
    assert launches == [("cast", int(cupy.cuda.get_current_stream().ptr))]


def late_copy(src):
    """A new array on cupy's current stream that receives src only after a GPU-side spin: work
    that reads it too early (not ordered after the copy on this stream) sees zeros."""
    dst = cupy.zeros_like(src)
    spin(100_000_000)
    dst.data.copy_from_device_async(src.data, src.nbytes, stream=cupy.cuda.get_current_stream())
    return dst


def side_stream():
    """A non-blocking stream, after the spin kernel has been compiled and the device is idle."""
    spin(1000)
    cupy.cuda.Device().synchronize()
    return cupy.cuda.Stream(non_blocking=True)


def test_work_is_ordered_on_the_callers_stream():
    # On a non-blocking side stream: a GPU-side spin, then the copy that fills x, then lowbit.
    # Only work ordered after the copy on that stream sees the filled x; work launched on any
    # other stream (the legacy default stream does not wait for non-blocking streams) would read
    # the zeros while the side stream still spins.
    src_host = (RNG.standard_normal((256, 1024)) * 40).astype(np.float32)
    want = lowbit.cast(src_host, "e4m3fn", saturate=True)
    want_q = lowbit.quantize(src_host, "int8_sym", "rows")
    want_mx = lowbit.quantize_mx(src_host, "e4m3fn")
    want_bw = lowbit.quantize_blockwise(src_host, "dynamic", 256)
    src = on_device(src_host)
    codes_host = lowbit.cast(src_host, "e5m2")
    codes_src = on_device(codes_host)
    side = side_stream()
    with side:
        x = late_copy(src)
        codes = lowbit.cast(x, "e4m3fn", saturate=True)
        spin(100_000_000)
        q_codes, q_scales = lowbit.quantize(x, "int8_sym", "rows")
        mx_codes, mx_scales = lowbit.quantize_mx(x, "e4m3fn")
        bw_codes, bw_absmax = lowbit.quantize_blockwise(x, "dynamic", 256)
        values = lowbit.decode(late_copy(codes_src), "e5m2")
    side.synchronize()
    same(codes, want)
    same(q_codes, want_q[0])
    same(q_scales, want_q[1])
    same(mx_codes, want_mx[0])
    same(mx_scales, want_mx[1])
    same(bw_codes, want_bw[0])
    same(bw_absmax, want_bw[1])
    same(values, lowbit.decode(codes_host, "e5m2"))


def test_verify_copies_on_the_callers_stream():
    ref = lowbit.cast(FINITE, "e4m3fn")
    src = on_device(ref)
    with side_stream():
        report = lowbit.verify(late_copy(src), ref, "exact", fmt="e4m3fn")
    assert report.ok, str(report)


# ---- verify ------------------------------------------------------------------------------------


def same_report(got, want) -> None:
    # The text and the JSON hold every field of a report (test_verify.py checks that).
    assert got.to_json() == want.to_json() and str(got) == str(want)


def test_verify_gives_the_numpy_report():
    cases = failing_verify_cases(X, FINITE)
    if no_bfloat16():
        cases.pop()
    for cand, ref, policy, kwargs in cases:
        want = lowbit.verify(cand, ref, policy, **kwargs)
        assert not want.ok and want.worst  # something to show
        dkwargs = {k: on_device(v) if isinstance(v, np.ndarray) else v
                   for k, v in kwargs.items()}
        same_report(lowbit.verify(on_device(cand), on_device(ref), policy, **dkwargs), want)
        # cupy arrays mix with numpy arrays in verify (both are read on the host)
        same_report(lowbit.verify(on_device(cand), ref, policy, **kwargs), want)
        same_report(lowbit.verify(cand, on_device(ref), policy, **dkwargs), want)
    assert lowbit.verify(on_device(X), on_device(X), "exact").ok


def test_verify_with_a_bound_function():
    seen = []

    def within(reference, inputs):
        seen.append((reference, inputs))
        return np.abs(reference) * 2.0**-7

    ref = FINITE.copy()
    cand = FINITE.copy()
    cand[::2] *= np.float32(1.01)  # over the bound of 2^-7 relative in every other row
    codes = lowbit.cast(FINITE, "e4m3fn")
    want = lowbit.verify(cand, ref, within, inputs=codes, input_fmt="e4m3fn")
    got = lowbit.verify(on_device(cand), on_device(ref), within, inputs=on_device(codes),
                        input_fmt="e4m3fn")
    assert not got.ok and got.policy == "bound:within"
    same_report(got, want)
    (ref_np, in_np), (ref_cupy, in_cupy) = seen
    for a, b in ((ref_np, ref_cupy), (in_np, in_cupy)):
        assert type(b) is np.ndarray and b.dtype == np.float64 and np.array_equal(a, b)


# ---- refusals ----------------------------------------------------------------------------------


def test_wrong_dtypes_are_type_errors():
    dx = on_device(FINITE)
    ints = on_device(np.arange(4, dtype=np.int32))
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported; expected float32"):
        lowbit.cast(ints, "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported"):
        lowbit.quantize(ints, "int8")
    with pytest.raises(TypeError, match=r"^x: dtype int32 is not supported"):
        lowbit.quantize_blockwise(ints, "dynamic", 64)
    with pytest.raises(TypeError, match=r"^codes: dtype float32 does not hold codes of e4m3fn; "
                                        r"expected uint8"):
        lowbit.decode(dx, "e4m3fn")
    codes, scales = lowbit.quantize(dx, "int8_sym", "rows")
    with pytest.raises(TypeError, match=r"^codes: dtype uint8 does not hold codes of int8_sym"):
        lowbit.dequantize(lowbit.cast(dx, "e4m3fn"), scales, "int8_sym", "rows")
    # the same refusals as for numpy arrays, word for word
    np_codes = cupy.asnumpy(codes)
    calls = [
        lambda m: lowbit.dequantize(np_codes if m is np else codes,
                                    m.asarray(cupy.asnumpy(scales)).astype(m.float16),
                                    "int8_sym", "rows"),
        lambda m: lowbit.dequantize_mx(m.asarray(np.zeros((4, 32), np.uint8)),
                                       m.asarray(np.ones((4, 1), np.float32)), "e4m3fn"),
        lambda m: lowbit.decode(m.asarray(np.zeros(4, np.uint16)), "e4m3fn"),
        lambda m: lowbit.quantize_delayed(m.asarray(FINITE), m.zeros(2, m.float64), "e4m3fn"),
    ]
    for call in calls:
        with pytest.raises(TypeError) as want:
            call(np)
        with pytest.raises(TypeError) as got:
            call(cupy)
        assert str(got.value) == str(want.value)


def test_wrong_shapes_are_value_errors():
    dx = on_device(FINITE)
    codes, scales = lowbit.quantize(dx, "int8_sym", "rows")
    with pytest.raises(ValueError, match=r"^scales: expected 37 elements \(one per group\) but "
                                         r"got shape \(3,\)"):
        lowbit.dequantize(codes, on_device(np.ones(3, np.float32)), "int8_sym", "rows")
    blocks, absmax = lowbit.quantize_blockwise(dx, "dynamic", 64)
    with pytest.raises(ValueError, match=r"^absmax: "):
        lowbit.dequantize_blockwise(blocks, absmax[:-1], "dynamic", 64)
    mx_codes, mx_scales = lowbit.quantize_mx(dx, "e4m3fn")
    with pytest.raises(ValueError, match=r"^scales: "):
        lowbit.dequantize_mx(mx_codes, mx_scales[:, :-1].copy(), "e4m3fn")
    expect_verify_shape_errors(dx)
    with pytest.raises(ValueError, match=r"^transpose: only per-column quantization"):
        lowbit.quantize(dx, "e4m3fn", "rows", transpose=True)


def test_mixed_devices():
    dev = cupy.cuda.Device().id
    dx = on_device(FINITE)
    codes, scales = lowbit.quantize(dx, "int8", "tensor")
    np_codes, np_scales = cupy.asnumpy(codes), cupy.asnumpy(scales)
    with pytest.raises(ValueError, match=rf"^scales is on cpu but codes is on cuda:{dev}; every "
                                         r"array argument must be on the same device"):
        lowbit.dequantize(codes, np_scales, "int8")
    with pytest.raises(ValueError, match=rf"^scales is on cuda:{dev} but codes is on cpu"):
        lowbit.dequantize(np_codes, scales, "int8")
    with pytest.raises(ValueError, match=rf"^history is on cpu but x is on cuda:{dev}"):
        lowbit.quantize_delayed(dx, np.zeros(2, np.float32), "e4m3fn")
    with pytest.raises(ValueError, match=rf"^scale is on cpu but x is on cuda:{dev}"):
        lowbit.cast_scaled(dx, np.float32([0.75]), "e4m3fn")
    mx_codes, mx_scales = lowbit.quantize_mx(dx, "e4m3fn")
    with pytest.raises(ValueError, match=rf"^scales is on cpu but codes is on cuda:{dev}"):
        lowbit.dequantize_mx(mx_codes, cupy.asnumpy(mx_scales), "e4m3fn")
    blocks, absmax = lowbit.quantize_blockwise(dx, "dynamic", 64)
    with pytest.raises(ValueError, match=rf"^absmax is on cpu but codes is on cuda:{dev}"):
        lowbit.dequantize_blockwise(blocks, cupy.asnumpy(absmax), "dynamic", 64)
    # Python numbers are no arrays: they are made cupy arrays on the first argument's device
    want = lowbit.dequantize(np_codes, np_scales, "int8")
    same(lowbit.dequantize(codes, float(np_scales), "int8"), want)
    same(lowbit.cast_scaled(dx, 0.75, "e4m3fn"), lowbit.cast_scaled(FINITE, 0.75, "e4m3fn"))
    # The first argument decides the result type: numpy results for numpy inputs
    assert type(lowbit.dequantize(np_codes, float(np_scales), "int8")) is np.ndarray


def test_an_absent_device_number_is_a_value_error():
    n = lowbit._core.cuda_device_count()

    class Elsewhere(cupy.ndarray):
        """A cupy array that says it lives on device n, one past the last (a real one cannot be
        made)."""

        @property
        def device(self):
            return types.SimpleNamespace(id=n)

    def elsewhere(a):
        # The same memory as a subclass instance (cupy's view() takes no array class).
        return Elsewhere(a.shape, a.dtype, memptr=a.data, strides=a.strides)

    x = elsewhere(on_device(FINITE))
    assert isinstance(x, cupy.ndarray) and x.device.id == n
    with pytest.raises(ValueError, match=rf"^x: a CUDA array on cuda:{n}, but this process sees "
                                         rf"{n} CUDA device"):
        lowbit.cast(x, "e4m3fn")
    codes = elsewhere(on_device(np.zeros((4, 8), np.uint8)))
    with pytest.raises(ValueError, match=rf"^codes: a CUDA array on cuda:{n}"):
        lowbit.dequantize(codes, 1.0, "e4m3fn")


def test_results_stay_on_a_second_device():
    if cupy.cuda.runtime.getDeviceCount() < 2 or lowbit._core.cuda_device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with cupy.cuda.Device(1):
        dx = on_device(X)
    assert cupy.cuda.Device().id == 0  # the call is made with device 0 current
    codes, scales = lowbit.quantize(dx, "e4m3fn", "rows")
    want = lowbit.quantize(X, "e4m3fn", "rows")
    same(codes, want[0], device=1)
    same(scales, want[1], device=1)
    same(lowbit.dequantize(codes, scales, "e4m3fn", "rows"),
         lowbit.dequantize(*want, "e4m3fn", "rows"), device=1)
    assert cupy.cuda.Device().id == 0
    with pytest.raises(ValueError, match=r"^scales is on cuda:0 but codes is on cuda:1"):
        lowbit.dequantize(codes, on_device(cupy.asnumpy(scales)), "e4m3fn", "rows")
