"""lowbit.fake_quantize: bit-equal to the functions it composes (decode(cast(x)),
dequantize(quantize(x)), dequantize_mx(quantize_mx(x))) for every format, rounding and
granularity; the input's dtype, shape, library and device kept; out=; the straight-through
gradient is the identity; bad arguments refused with the argument's name."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowbit

GRANULARITIES = ["tensor", "rows", "columns", ("blocks", 4), ("tiles", 3, 5)]
SCALED_TARGETS = ["e4m3fn", "e5m2", "e2m1fn", "e3m2fn", "bfloat16", "int8_sym", "int8", "uint8",
                  "int4_sym"]
MX_ELEMS = ["e4m3fn", "e5m2", "e3m2fn", "e2m3fn", "e2m1fn", "int8"]
# Every named format whose values fit float32 (the decoded type).
FORMATS = [n for n in lowbit.formats() if lowbit.parse_format(n).fits_float]


def sample(shape=(7, 13), seed=0, specials=True):
    """Values across many binades, with exact ties of the 8-bit grids, and the special values."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    x = rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))
    x[: n // 4] = rng.integers(-64, 64, n // 4) / 16.0 + 1 / 32  # midpoints of e4m3fn near 1
    if specials and n >= 8:
        x[:8] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -7e-40, 448.0 + 16]
    return x.reshape(shape).astype(np.float32)


def bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert np.array_equal(bits(a), bits(b))


def same_but_nan_payloads(a, b):
    """Bit equality, except that any NaN matches any NaN (lowbit's results carry the canonical
    all-ones NaN of docs/rounding.md, inputs any payload)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    nan_a, nan_b = np.isnan(a.astype(np.float32)), np.isnan(b.astype(np.float32))
    assert np.array_equal(nan_a, nan_b)
    assert np.array_equal(bits(a)[~nan_a], bits(b)[~nan_b])


def narrowed(wide, dtype):
    """float32 values in a 16-bit dtype as fake_quantize narrows them: lowbit's cast. numpy's
    and ml_dtypes' own conversions round the same way (checked here too); only the payload bits
    of NaNs differ between libraries."""
    name = np.dtype(dtype).name
    got = lowbit.cast(wide, name).view(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        theirs = wide.astype(dtype)
    nan = np.isnan(wide)
    assert np.array_equal(bits(got)[~nan], bits(theirs)[~nan])
    assert np.isnan(got.astype(np.float32)[nan]).all()
    return got


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


# ---- without a scale: decode(cast(x)) ----------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rounding", lowbit.roundings())
def test_equals_decode_of_cast(fmt, rounding):
    x = sample(seed=len(fmt))
    for saturate in (False, True):
        kw = dict(rounding=rounding, saturate=saturate, seed=5, offset=3)
        got = lowbit.fake_quantize(x, fmt, **kw)
        same(got, lowbit.decode(lowbit.cast(x, fmt, **kw), fmt, "float32"))


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e8m0fnu", "e2m1fn", "bfloat16", "float16"])
def test_is_idempotent(fmt):
    once = lowbit.fake_quantize(sample(), fmt)
    same(lowbit.fake_quantize(once, fmt), once)


def test_policy_arguments_reach_the_cast():
    x = sample(seed=3)
    kw = dict(subnormals="flush", nan_sign="positive", rounding="stochastic", random_bits=3,
              seed=11, offset=7)
    same(lowbit.fake_quantize(x, "e5m2", **kw),
         lowbit.decode(lowbit.cast(x, "e5m2", **kw), "e5m2", "float32"))
    # and they change something, so the comparison above is not vacuous
    assert not np.array_equal(bits(lowbit.fake_quantize(x, "e5m2", **kw)),
                              bits(lowbit.fake_quantize(x, "e5m2")))


def test_float64_is_rounded_once():
    # 1 + 2^-4 + 2^-30 lies just above an e4m3fn midpoint; through float32 it would be the tie
    # itself, which rounds to even (1.0). Rounded once it goes up to 1.125.
    x = np.array([1 + 2**-4 + 2**-30, -(1 + 2**-4 + 2**-30)])
    got = lowbit.fake_quantize(x, "e4m3fn")
    assert got.dtype == np.float64 and got.tolist() == [1.125, -1.125]
    same(got, lowbit.decode(lowbit.cast(x, "e4m3fn"), "e4m3fn", "float64"))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1fn", "e3m2fn",
                                 "e2m3fn", "e8m0fnu"])
def test_16_bit_inputs_keep_their_dtype_and_values(dtype, fmt):
    with np.errstate(over="ignore"):  # float16: 1e30 becomes Inf
        x = sample(seed=9).astype(dtype)
    got = lowbit.fake_quantize(x, fmt)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    wide = lowbit.decode(lowbit.cast(x, fmt), fmt, "float32")
    same(got, narrowed(wide, dtype))
    if dtype is ml_dtypes.bfloat16 or fmt != "e8m0fnu":
        # The format's values are values of x's dtype: the conversion is exact.
        back = got.astype(np.float32)
        nan = np.isnan(wide)
        assert np.array_equal(np.isnan(back), nan)
        assert np.array_equal(bits(back)[~nan], bits(wide)[~nan])


def test_16_bit_format_of_a_16_bit_input():
    x = sample(seed=4).astype(ml_dtypes.bfloat16)
    same_but_nan_payloads(lowbit.fake_quantize(x, "bfloat16"), x)  # on its own grid
    with np.errstate(over="ignore"):
        h = sample(seed=4, specials=False).astype(np.float16)
    same(lowbit.fake_quantize(h, "bfloat16"),
         narrowed(lowbit.decode(lowbit.cast(h, "bfloat16"), "bfloat16", "float32"), np.float16))


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (1,), (2, 3, 4)])
def test_any_shape(shape):
    x = sample(shape if shape else (1,), specials=False).reshape(shape)
    got = lowbit.fake_quantize(x, "e4m3fn")
    assert got.shape == shape and got.dtype == np.float32
    same(got, lowbit.decode(lowbit.cast(x, "e4m3fn"), "e4m3fn", "float32"))


def test_strided_input():
    x = sample((9, 16))[::2, ::3]
    same(lowbit.fake_quantize(x, "e5m2"), lowbit.fake_quantize(np.ascontiguousarray(x), "e5m2"))


def test_lists_become_float64():
    got = lowbit.fake_quantize([0.3, 1000.0], "e4m3fn", saturate=True)
    assert got.dtype == np.float64 and got.tolist() == [0.3125, 448.0]
    got = lowbit.fake_quantize([[0.3, -2.0]], "int8_sym", "rows")
    assert got.dtype == np.float32


@pytest.mark.parametrize("spelling", ["float8_e4m3fn", ml_dtypes.float8_e4m3fn,
                                      np.dtype(ml_dtypes.float8_e4m3fn),
                                      lowbit.parse_format("e4m3fn")])
def test_format_as_a_dtype(spelling):
    x = sample()
    same(lowbit.fake_quantize(x, spelling), lowbit.fake_quantize(x, "e4m3fn"))


# ---- scaled: dequantize(quantize(x)) and MX ---------------------------------------------------


@pytest.mark.parametrize("target", SCALED_TARGETS)
@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_equals_dequantize_of_quantize(target, granularity):
    x = sample((6, 10), seed=2, specials=False)
    x[4] = 0.0  # an all-zero row: scale 1
    for kw in (dict(), dict(margin=2, pow2=True), dict(rounding="stochastic", seed=3),
               dict(saturate=False, rounding="toward_zero")):
        got = lowbit.fake_quantize(x, target, granularity, **kw)
        codes, scales = lowbit.quantize(x, target, granularity, **kw)
        same(got, lowbit.dequantize(codes, scales, target, granularity))


def test_scaled_with_nan_follows_quantize():
    x = sample((4, 8), specials=False)
    x[1, 2] = np.nan
    got = lowbit.fake_quantize(x, "e4m3fn", "rows")
    same(got, lowbit.dequantize(*lowbit.quantize(x, "e4m3fn", "rows"), "e4m3fn", "rows"))
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2, 3]]).any()


@pytest.mark.parametrize("elem", MX_ELEMS)
@pytest.mark.parametrize("block", [32, 8])
def test_mx_equals_dequantize_mx_of_quantize_mx(elem, block):
    x = sample((5, 70), seed=6)
    got = lowbit.fake_quantize(x, elem, ("mx", block))
    codes, scales = lowbit.quantize_mx(x, elem, block)
    same(got, lowbit.dequantize_mx(codes, scales, elem, block))
    if block == 32:
        same(lowbit.fake_quantize(x, elem, "mx"), got)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_scaled_16_bit_inputs(dtype):
    with np.errstate(over="ignore"):
        x = sample((6, 10), specials=False).astype(dtype)
    got = lowbit.fake_quantize(x, "e4m3fn", ("blocks", 4))
    assert got.dtype == np.dtype(dtype)
    wide = lowbit.dequantize(*lowbit.quantize(x, "e4m3fn", ("blocks", 4)), "e4m3fn",
                             ("blocks", 4))
    same(got, narrowed(wide, dtype))


def test_saturate_default_follows_the_composed_function():
    x = np.float32([1000.0, -1000.0, 1.0])
    assert np.isnan(lowbit.fake_quantize(x, "e4m3fn")[:2]).all()  # as cast: no saturation
    # per-tensor scaling puts 1000 at e4m3fn's max; it stays finite
    assert np.isfinite(lowbit.fake_quantize(x, "e4m3fn", "tensor")).all()


# ---- out= ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("granularity", [None, "rows", "mx"])
def test_out(dtype, granularity):
    if dtype is np.float64 and granularity is not None:
        pytest.skip("float64 inputs are not scaled")
    with np.errstate(over="ignore"):
        x = sample((4, 40), seed=1).astype(dtype)
    out = np.full(x.shape, 7, dtype)
    got = lowbit.fake_quantize(x, "e4m3fn", granularity, out=out)
    assert got is out
    same(out, lowbit.fake_quantize(x, "e4m3fn", granularity))


def test_out_refusals():
    x = sample((3, 4))
    with pytest.raises(TypeError, match=r"^out: expected float32 \(x's dtype\), got float64"):
        lowbit.fake_quantize(x, "e4m3fn", out=np.empty((3, 4)))
    with pytest.raises(ValueError, match=r"^out: expected shape \(3, 4\) \(x's\), got \(4, 3\)"):
        lowbit.fake_quantize(x, "e4m3fn", out=np.empty((4, 3), np.float32))
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: the array is read-only"):
        lowbit.fake_quantize(x, "e4m3fn", out=ro)
    with pytest.raises(TypeError, match=r"^out: expected a numpy array"):
        lowbit.fake_quantize(x, "e4m3fn", out=[0.0] * 12)


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_arguments():
    x = sample((3, 4))
    with pytest.raises(ValueError, match=r"^fmt: format 'e4m3fnx'"):
        lowbit.fake_quantize(x, "e4m3fnx")
    with pytest.raises(TypeError, match=r"^fmt: expected a format"):
        lowbit.fake_quantize(x, None)
    with pytest.raises(ValueError, match=r"^fmt: the integer target 'int8_sym' needs a "
                                         "granularity"):
        lowbit.fake_quantize(x, "int8_sym")
    with pytest.raises(ValueError, match=r"^margin, pow2: only with a scaling granularity"):
        lowbit.fake_quantize(x, "e4m3fn", margin=1)
    with pytest.raises(ValueError, match=r"^margin, pow2: only with a scaling granularity, not "
                                         "with MX"):
        lowbit.fake_quantize(x, "e4m3fn", "mx", pow2=True)
    with pytest.raises(ValueError, match=r"^granularity: MX is written"):
        lowbit.fake_quantize(x, "e4m3fn", ("mx", 32, 2))
    with pytest.raises(ValueError, match=r"^granularity 'bogus'"):
        lowbit.fake_quantize(x, "e4m3fn", "bogus")
    with pytest.raises(TypeError, match=r"^x: expected float32, float16 or bfloat16 values .*got "
                                        "uint8"):
        lowbit.fake_quantize(np.zeros(3, np.uint8), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: expected .*got float8_e4m3fn"):
        lowbit.fake_quantize(np.zeros(3, ml_dtypes.float8_e4m3fn), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: float64 with a granularity"):
        lowbit.fake_quantize(np.zeros((2, 2)), "e4m3fn", "rows")
    with pytest.raises(TypeError, match=r"^straight_through: only for torch tensors"):
        lowbit.fake_quantize(x, "e4m3fn", straight_through=True)
    with pytest.raises(TypeError, match=r"^straight_through: expected True or False"):
        lowbit.fake_quantize(x, "e4m3fn", straight_through="yes")


# ---- torch ---------------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("granularity", [None, ("blocks", 4), ("mx", 8)])
def test_torch_cpu_equals_numpy(torch, dtype, granularity):
    x = torch.from_numpy(sample((5, 16), seed=8, specials=granularity is None)).to(
        getattr(torch, dtype))
    got = lowbit.fake_quantize(x, "e5m2", granularity)
    assert isinstance(got, torch.Tensor) and got.dtype == x.dtype and got.shape == x.shape
    if dtype == "bfloat16":
        want = lowbit.fake_quantize(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16), "e5m2",
                                    granularity)
        assert np.array_equal(got.view(torch.int16).numpy(), want.view(np.int16))
    else:
        same(got.numpy(), lowbit.fake_quantize(x.numpy(), "e5m2", granularity))


@pytest.mark.torch
def test_torch_dtype_as_format(torch):
    x = torch.from_numpy(sample())
    assert torch.equal(lowbit.fake_quantize(x, torch.float8_e4m3fn).nan_to_num(),
                       x.to(torch.float8_e4m3fn).float().nan_to_num())


@pytest.mark.torch
@pytest.mark.parametrize("granularity", [None, "rows", "mx"])
def test_straight_through_gradient_is_the_identity(torch, granularity):
    base = sample((4, 32), seed=12, specials=False)
    base[0, :3] = [1e6, -1e6, np.nan]  # saturated, and NaN: the gradient passes there too
    x = torch.from_numpy(base).requires_grad_()
    y = lowbit.fake_quantize(x, "e4m3fn", granularity, saturate=True, straight_through=True)
    assert y.requires_grad and y.grad_fn is not None
    with torch.no_grad():
        same(y.detach().numpy(), lowbit.fake_quantize(x, "e4m3fn", granularity,
                                                      saturate=True).numpy())
    g = torch.from_numpy(sample((4, 32), seed=13, specials=False))
    y.backward(g)
    assert torch.equal(x.grad, g)


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_straight_through_in_a_graph(torch, dtype):
    t = getattr(torch, dtype)
    x = torch.linspace(-3, 3, 12, dtype=t).requires_grad_()
    w = torch.arange(12, dtype=t)
    (lowbit.fake_quantize(x * 2, "e2m1fn", straight_through=True) * w).sum().backward()
    assert x.grad.dtype == t and torch.equal(x.grad, 2 * w)


@pytest.mark.torch
def test_a_tensor_that_requires_grad_needs_straight_through(torch):
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(ValueError, match=r"^x requires grad.*straight_through=True"):
        lowbit.fake_quantize(x, "e4m3fn")
    with torch.no_grad():
        assert lowbit.fake_quantize(x, "e4m3fn").tolist() == [1.0] * 3
    with pytest.raises(ValueError, match=r"^out: not with straight_through=True"):
        lowbit.fake_quantize(x, "e4m3fn", straight_through=True, out=torch.empty(3))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_out(torch, dtype):
    t = getattr(torch, dtype)
    x = torch.from_numpy(sample((3, 32))).to(t)
    out = torch.empty(3, 32, dtype=t)
    assert lowbit.fake_quantize(x, "e4m3fn", "mx", out=out) is out
    want = lowbit.fake_quantize(x, "e4m3fn", "mx")
    assert torch.equal(out.view(torch.int16 if dtype == "bfloat16" else torch.int32),
                       want.view(torch.int16 if dtype == "bfloat16" else torch.int32))
    with pytest.raises(TypeError, match=r"^out: expected a torch tensor"):
        lowbit.fake_quantize(x, "e4m3fn", out=np.empty((3, 32), np.float32))
    with pytest.raises(TypeError, match=rf"^out: expected {dtype} \(x's dtype\), got float16"):
        lowbit.fake_quantize(x, "e4m3fn", out=torch.empty(3, 32, dtype=torch.float16))


# ---- CUDA (marker gpu: skipped without a device) -------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("granularity", [None, "rows", ("tiles", 3, 5), "mx"])
def test_cuda_equals_cpu(torch, dtype, granularity):
    t = getattr(torch, dtype)
    x = torch.from_numpy(sample((6, 64), seed=14, specials=granularity is None)).to(t)
    want = lowbit.fake_quantize(x, "e4m3fn", granularity, rounding="stochastic", seed=2)
    got = lowbit.fake_quantize(x.cuda(), "e4m3fn", granularity, rounding="stochastic", seed=2)
    assert got.device.type == "cuda" and got.dtype == t
    k = torch.int32 if dtype == "float32" else torch.int16
    assert torch.equal(got.cpu().view(k), want.view(k))


@pytest.mark.gpu
def test_cuda_straight_through(torch):
    x = torch.randn(4, 64, device="cuda", requires_grad=True)
    y = lowbit.fake_quantize(x, "e5m2", "mx", straight_through=True)
    assert y.device == x.device
    g = torch.randn(4, 64, device="cuda")
    y.backward(g)
    assert torch.equal(x.grad, g)
    out = torch.empty(4, 64, device="cuda")
    assert lowbit.fake_quantize(x.detach(), "e5m2", out=out) is out
