"""The quantization API against an independent numpy computation of the equations of
docs/techniques/quantization.md.

The scale rule is float32 arithmetic that numpy reproduces exactly (one correctly rounded
division, then a multiplication by a power of two; pow2 scales from exact fractions), and the
element conversion is taken from ml_dtypes (floats) or np.rint (integers, half to even), so codes
and scales are compared bit for bit. Shapes, dtypes, transposition, empty tensors and the
NaN/zero group rules are checked too.
"""

from __future__ import annotations

import inspect
import math
import re
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
from lowbit import Granularity

F32 = np.float32
FLOAT_TARGETS = {  # name -> (ml_dtypes type, max)
    "e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
    "e3m2fn": (ml_dtypes.float6_e3m2fn, 28.0),
    "e2m3fn": (ml_dtypes.float6_e2m3fn, 7.5),
    "e2m1fn": (ml_dtypes.float4_e2m1fn, 6.0),
}
INT_TARGETS = {  # name -> (min, max, code dtype)
    "int8": (-128, 127, np.int8),
    "int8_sym": (-127, 127, np.int8),
    "uint8": (0, 255, np.uint8),
    "int4": (-8, 7, np.int8),
    "int4_sym": (-7, 7, np.int8),
    "uint4": (0, 15, np.uint8),
}
GRANULARITIES = ["tensor", "rows", "columns", ("blocks", 3), ("blocks", 32), ("tiles", 2, 3)]
MX_EMAX = {"e4m3fn": 8, "e5m2": 15, "e3m2fn": 4, "e2m3fn": 2, "e2m1fn": 2, "int8": 0}


# ---- the oracle ----------------------------------------------------------------------------------


def target_max(target: str) -> float:
    return FLOAT_TARGETS[target][1] if target in FLOAT_TARGETS else INT_TARGETS[target][1]


def group_index(m: int, n: int, g: Granularity) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """For every element of an m x n matrix, the (row, column) of its scale; and the scale grid."""
    i, j = np.indices((m, n))
    k, size = g.kind, g.size
    if k == "tensor":
        return 0 * i, 0 * j, (1, 1)
    if k == "rows":
        return i, 0 * j, (m, 1)
    if k == "columns":
        return 0 * i, j, (1, n)
    if k == "blocks":
        return i, j // size[0], (m, -(-n // size[0]))
    return i // size[0], j // size[1], (-(-m // size[0]), -(-n // size[1]))


def floor_log2(v: Fraction) -> int:
    e = v.numerator.bit_length() - v.denominator.bit_length()
    return e if Fraction(2) ** e <= v else e - 1


def scale_rule(amax: float, tmax: float, margin: int, pow2: bool) -> tuple[float, float]:
    """(q, d) of a group with absolute maximum amax (docs: "Scale rule")."""
    if math.isnan(amax) or math.isinf(amax):
        return math.nan, math.nan
    if amax == 0:
        return 1.0, 1.0
    if pow2:
        e = floor_log2(Fraction(tmax) / Fraction(amax)) - margin
        e = min(max(e, -126), 127)
        return 2.0**e, 2.0**-e
    with np.errstate(over="ignore"):
        ratio = F32(tmax) / F32(amax)
    if math.isinf(ratio):
        ratio = np.finfo(F32).max
    q = F32(ratio * F32(2.0**-margin))
    d = F32(F32(F32(amax) / F32(tmax)) * F32(2.0**margin))
    return float(q), float(d)


def encode(y: np.ndarray, target: str) -> np.ndarray:
    """Codes of the float32 values y (already scaled), rounded to nearest-even, saturating."""
    if target in INT_TARGETS:
        lo, hi, dt = INT_TARGETS[target]
        with np.errstate(invalid="ignore"):
            r = np.clip(np.rint(y.astype(np.float64)), lo, hi)
        return np.where(np.isnan(y), 0, r).astype(dt)
    ml, tmax = FLOAT_TARGETS[target]
    finite = np.clip(y, -tmax, tmax)
    return np.where(np.isnan(y), y, finite).astype(F32).astype(ml).view(np.uint8)


def value(codes: np.ndarray, target: str) -> np.ndarray:
    if target in INT_TARGETS:
        return codes.astype(F32)
    return codes.view(FLOAT_TARGETS[target][0]).astype(F32)


def ref_quantize(x: np.ndarray, target: str, g: Granularity, margin=0, pow2=False):
    m, n = (math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim else (1, 1)
    xm = x.astype(F32).reshape(m, n)
    gi, gj, (sr, sc) = group_index(m, n, g)
    amax = np.zeros((sr, sc))
    bad = np.zeros((sr, sc), bool)
    np.maximum.at(amax, (gi, gj), np.abs(np.nan_to_num(xm.astype(np.float64), posinf=0, neginf=0,
                                                      nan=0)))
    np.logical_or.at(bad, (gi, gj), ~np.isfinite(xm))
    q = np.empty((sr, sc), F32)
    d = np.empty((sr, sc), F32)
    for a in range(sr):
        for b in range(sc):
            q[a, b], d[a, b] = scale_rule(math.inf if bad[a, b] else amax[a, b],
                                          target_max(target), margin, pow2)
    with np.errstate(invalid="ignore", over="ignore"):
        y = xm * q[gi, gj]
    codes = encode(y, target).reshape(x.shape)
    return codes, d.reshape(g.scale_shape(x.shape))


def ref_dequantize(codes: np.ndarray, scales: np.ndarray, target: str, g: Granularity):
    m, n = (math.prod(codes.shape[:-1]), codes.shape[-1]) if codes.ndim else (1, 1)
    gi, gj, (sr, sc) = group_index(m, n, g)
    d = scales.reshape(sr, sc)
    with np.errstate(invalid="ignore"):
        return (value(codes, target).reshape(m, n) * d[gi, gj]).reshape(codes.shape)


def sample(shape, seed=0, zero_row=True):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))).astype(F32)
    if zero_row and x.ndim == 2 and x.shape[0] > 2:
        x[1] = 0
        x[2, 1::2] = 0
    return x


# ---- exact agreement with the equations ----------------------------------------------------------


@pytest.mark.parametrize("target", list(FLOAT_TARGETS) + list(INT_TARGETS))
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
@pytest.mark.parametrize("pow2", [False, True])
def test_quantize_matches_the_equations(target, granularity, pow2):
    x = sample((7, 37), seed=len(target))
    g = Granularity.of(granularity)
    codes, scales = lowbit.quantize(x, target, granularity, pow2=pow2)
    want_codes, want_scales = ref_quantize(x, target, g, pow2=pow2)
    assert codes.dtype == want_codes.dtype and codes.shape == x.shape
    assert scales.dtype == np.float32 and scales.shape == g.scale_shape(x.shape)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(codes, want_codes)
    out = lowbit.dequantize(codes, scales, target, granularity)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_array_equal(out, ref_dequantize(codes, scales, target, g))


@pytest.mark.parametrize("margin", [-3, 0, 2])
def test_margin(margin):
    x = sample((4, 9), seed=3)
    for pow2 in (False, True):
        codes, scales = lowbit.quantize(x, "e4m3fn", "rows", margin=margin, pow2=pow2)
        want_codes, want_scales = ref_quantize(x, "e4m3fn", Granularity.rows(), margin, pow2)
        np.testing.assert_array_equal(scales, want_scales)
        np.testing.assert_array_equal(codes, want_codes)


@settings(max_examples=40)
@given(
    m=st.integers(1, 6), n=st.integers(1, 40),
    g=st.sampled_from(GRANULARITIES),
    target=st.sampled_from(["e4m3fn", "e5m2", "e2m1fn", "int8_sym", "uint4"]),
    pow2=st.booleans(), seed=st.integers(0, 2**32 - 1),
)
def test_quantize_random_shapes(m, n, g, target, pow2, seed):
    x = sample((m, n), seed, zero_row=False)
    codes, scales = lowbit.quantize(x, target, g, pow2=pow2)
    want_codes, want_scales = ref_quantize(x, target, Granularity.of(g), pow2=pow2)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(codes, want_codes)


def test_int8_symmetric_absmax_is_the_switchback_rule():
    x = np.array([[0.5, -2.0, 1.0], [3.0, 0.0, -3.0]], F32)
    codes, scales = lowbit.quantize(x, "int8_sym", "rows")
    # q = 127 / absmax: row 0 -> 63.5, row 1 -> 42.333
    assert codes.tolist() == [[32, -127, 64], [127, 0, -127]]  # 31.75 -> 32, 63.5 -> 64 (even)
    np.testing.assert_array_equal(scales, np.array([[2 / 127], [3 / 127]], F32))


def test_special_groups():
    x = np.array([[0, 0, 0, 0], [1, np.nan, 2, 3], [1, -np.inf, 2, 3], [0, -0.0, 0, 5]], F32)
    for target, has_nan in [("e4m3fn", True), ("e5m2", True), ("e2m1fn", False),
                            ("int8", False)]:
        codes, scales = lowbit.quantize(x, target, "rows")
        assert scales[0, 0] == 1 and (codes[0] == 0).all()  # zero group: q = d = 1
        assert np.isnan(scales[1:3]).all()
        if has_nan:
            assert np.isnan(lowbit.decode(codes[1:3], target)).all()
        else:
            assert (codes[1:3] == 0).all()  # +0 for formats without NaN, 0 for integers
        out = lowbit.dequantize(codes, scales, target, "rows")
        assert np.isnan(out[1:3]).all() and (out[0] == 0).all()
        assert out[3, 3] == 5 and scales[3, 0] > 0


def test_nan_signs_follow_the_product_rule():
    # docs/techniques/quantization.md: a NaN code carries sign(x) * sign(q), except that a NaN
    # scale (a group holding a NaN or Inf) makes every code of its group the positive NaN.
    x = np.array([-np.nan, 1.0], F32)
    assert lowbit.cast_scaled(x, 2.0, "e4m3fn").tolist() == [0xFF, 0x40]
    assert lowbit.cast_scaled(x, 2.0, "e4m3fn", nan_sign="positive").tolist() == [0x7F, 0x40]
    codes, scales = lowbit.quantize(x, "e4m3fn")
    assert np.isnan(scales) and codes.tolist() == [0x7F, 0x7F]
    codes, scales = lowbit.quantize(np.array([[-np.nan, 1.0], [-1.0, 2.0]], F32), "e4m3fn", "rows")
    assert np.isnan(scales[0, 0]) and codes[0].tolist() == [0x7F, 0x7F]
    assert codes[1].tolist() == [0xF6, 0x7E]  # -224 and 448: the other row is untouched


def test_tiny_amax_gives_the_largest_multiplier():
    tiny = np.array([1e-45, -1e-45], F32)  # max / amax overflows float32
    codes, scales = lowbit.quantize(tiny, "e4m3fn")
    want_codes, want_scales = ref_quantize(tiny, "e4m3fn", Granularity.tensor())
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scales, want_scales)
    codes, scales = lowbit.quantize(tiny, "e4m3fn", pow2=True)
    assert scales == F32(2.0**-127)


def test_input_dtypes_give_the_codes_of_their_float32_values():
    x = sample((5, 8))
    for dt in (np.float16, ml_dtypes.bfloat16):
        xs = x.astype(dt)
        a = lowbit.quantize(xs, "e4m3fn", ("blocks", 4))
        b = lowbit.quantize(xs.astype(F32), "e4m3fn", ("blocks", 4))
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(TypeError, match=r"^x: dtype float64 is not supported; expected float32, "
                                        r"float16 or bfloat16"):
        lowbit.quantize(x.astype(np.float64), "e4m3fn")


def test_16_bit_targets():
    x = sample((3, 5))
    for target in ("float16", "bfloat16"):
        codes, scales = lowbit.quantize(x, target, "rows", pow2=True)
        assert codes.dtype == np.uint16
        out = lowbit.dequantize(codes, scales, target, "rows")
        np.testing.assert_allclose(out, x, rtol=2**-7)


# ---- shapes, transposes, strides, empty tensors ----------------------------------------------


def test_scale_shapes_follow_the_leading_dimensions():
    x = sample((2, 3, 10), zero_row=False)
    cases = {"tensor": (), "rows": (2, 3, 1), "columns": (10,), ("blocks", 4): (2, 3, 3),
             ("tiles", 4, 4): (2, 3)}
    for g, shape in cases.items():
        codes, scales = lowbit.quantize(x, "e4m3fn", g)
        assert codes.shape == x.shape and scales.shape == shape, g
        want = ref_quantize(x, "e4m3fn", Granularity.of(g))
        np.testing.assert_array_equal(codes, want[0])
        np.testing.assert_array_equal(scales, want[1])
    # rows keep a trailing 1 so that scales broadcast against x
    codes, scales = lowbit.quantize(x, "int8_sym", "rows")
    np.testing.assert_allclose(lowbit.dequantize(codes, scales, "int8_sym", "rows"),
                               codes.astype(F32) * scales)


@pytest.mark.parametrize("rounding", ["nearest_even", "stochastic"])
def test_transpose_writes_the_transposed_codes(rounding):
    x = sample((2, 3, 5), zero_row=False)
    codes, scales = lowbit.quantize(x, "e4m3fn", "columns", rounding=rounding, seed=5)
    codes_t, scales_t = lowbit.quantize(x, "e4m3fn", "columns", transpose=True,
                                        rounding=rounding, seed=5)
    assert codes_t.shape == (5, 6) and scales_t.shape == (5, 1)
    np.testing.assert_array_equal(codes_t, codes.reshape(6, 5).T)
    np.testing.assert_array_equal(scales_t[:, 0], scales)
    out = lowbit.dequantize(codes_t, scales_t, "e4m3fn", "rows")
    np.testing.assert_array_equal(out.T.reshape(x.shape),
                                  lowbit.dequantize(codes, scales, "e4m3fn", "columns"))
    with pytest.raises(ValueError, match=r"^transpose: only per-column quantization"):
        lowbit.quantize(x, "e4m3fn", "rows", transpose=True)


def test_strided_rows_and_refused_layouts():
    big = sample((8, 12), zero_row=False)
    view = big[::2, 2:9]  # strided rows, contiguous within a row
    a = lowbit.quantize(view, "e5m2", ("blocks", 3))
    b = lowbit.quantize(np.ascontiguousarray(view), "e5m2", ("blocks", 3))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    with pytest.raises(ValueError, match=r"^x: the last dimension must be contiguous"):
        lowbit.quantize(big[:, ::2], "e5m2")
    with pytest.raises(ValueError, match=r"^scales must be contiguous"):
        lowbit.dequantize(b[0], np.ones((4, 6), F32)[:, ::2].copy().T, "e5m2", ("blocks", 3))


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0), (2, 0, 4)])
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
def test_empty_tensors(shape, granularity):
    x = np.zeros(shape, F32)
    g = Granularity.of(granularity)
    codes, scales = lowbit.quantize(x, "int8", granularity)
    assert codes.shape == shape and codes.dtype == np.int8
    assert scales.shape == g.scale_shape(shape)
    assert (scales == 1).all()  # empty groups: q = d = 1
    assert lowbit.dequantize(codes, scales, "int8", granularity).shape == shape
    c, s = lowbit.quantize_mx(x, "e4m3fn")
    assert c.shape == shape and s.shape == shape[:-1] + (-(-shape[-1] // 32),)


def test_zero_dimensional_input():
    codes, scales = lowbit.quantize(np.array(3.0, F32), "int8_sym")
    assert codes.shape == () and scales.shape == () and codes == 127
    codes, scales = lowbit.quantize(np.array(3.0, F32), "int8_sym", "rows")
    assert scales.shape == (1,)


def test_python_scalars_and_lists():
    codes, scales = lowbit.quantize([[1.0, -2.0], [4.0, 0.5]], "int8_sym", "rows")
    assert codes.tolist() == [[64, -127], [127, 16]]
    out = lowbit.dequantize(codes.tolist(), scales.ravel().tolist(), "int8_sym", "rows")
    assert out.dtype == np.float32 and out.shape == (2, 2)
    assert lowbit.dequantize(codes, 0.5, "int8_sym").tolist() == [[32, -63.5], [63.5, 8]]


# ---- cast_scaled and delayed scaling -----------------------------------------------------------


@pytest.mark.parametrize("target", ["e4m3fn", "e2m1fn", "int8", "uint4"])
def test_cast_scaled(target):
    x = sample((3, 11))
    for q in (0.75, 3.0, np.array([5.5], F32), np.array(0.01, F32)):
        got = lowbit.cast_scaled(x, q, target)
        np.testing.assert_array_equal(got, encode(x * F32(q), target))


def test_cast_scaled_refuses_bad_multipliers():
    x = sample((2, 3))
    for q in (math.nan, math.inf, 0.0, -2.0, np.array([np.nan], F32), np.array([-1.0], F32),
              np.float32(np.nan)):
        with pytest.raises(ValueError, match=r"^scale: expected a positive finite multiplier"):
            lowbit.cast_scaled(x, q, "e4m3fn")
    with pytest.raises(ValueError, match=r"^scale: expected 1 elements"):
        lowbit.cast_scaled(x, np.ones(2, F32), "e4m3fn")
    with pytest.raises(TypeError, match=r"^scale: dtype float64"):
        lowbit.cast_scaled(x, np.ones(1), "e4m3fn")
    with pytest.raises(TypeError, match=r"^scale: expected a number"):
        lowbit.cast_scaled(x, True, "e4m3fn")


@pytest.mark.parametrize("reduce", ["max", "most_recent"])
def test_delayed_scaling_over_steps(reduce):
    history = np.zeros(3, F32)
    expect = np.zeros(3, F32)
    for step in range(5):
        x = sample((4, 6), seed=step, zero_row=False) * F32(step + 1)
        used = float(expect.max() if reduce == "max" else expect[0])
        q, d = scale_rule(used, 448.0, 0, False)
        codes, pair = lowbit.quantize_delayed(x, history, "e4m3fn", reduce=reduce)
        np.testing.assert_array_equal(pair, np.array([q, d], F32))
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(codes, encode(x * F32(q), "e4m3fn"))
        expect = np.concatenate([[np.abs(x).max()], expect[:-1]]).astype(F32)
        np.testing.assert_array_equal(history, expect)


def test_delayed_scaling_pow2_and_margin():
    history = np.array([10.0, 300.0], F32)
    x = sample((2, 5), zero_row=False)
    codes, pair = lowbit.quantize_delayed(x, history, "e5m2", margin=1, pow2=True)
    q, d = scale_rule(300.0, 57344.0, 1, True)
    assert pair.tolist() == [q, d]
    np.testing.assert_array_equal(codes, encode(x * F32(q), "e5m2"))


def test_delayed_scaling_refuses_bad_histories():
    x = sample((2, 3))
    with pytest.raises(TypeError, match=r"^history: expected an array \(it is updated in place"):
        lowbit.quantize_delayed(x, [0.0, 0.0], "e4m3fn")
    with pytest.raises(ValueError, match=r"^history: the amax history needs 1\.\.4096 entries"):
        lowbit.quantize_delayed(x, np.zeros(0, F32), "e4m3fn")
    with pytest.raises(ValueError, match=r"^history must be contiguous"):
        lowbit.quantize_delayed(x, np.zeros(8, F32)[::2], "e4m3fn")
    with pytest.raises(ValueError, match=r"^reduce 'min': expected one of max, most_recent"):
        lowbit.quantize_delayed(x, np.zeros(2, F32), "e4m3fn", reduce="min")


# ---- OCP MX ------------------------------------------------------------------------------------


def ref_mx(x: np.ndarray, elem: str, block: int):
    m, n = (math.prod(x.shape[:-1]), x.shape[-1]) if x.ndim else (1, 1)
    xm = x.astype(F32).reshape(m, n)
    nb = -(-n // block)
    scales = np.zeros((m, nb), np.uint8)
    codes = np.zeros((m, n), np.int8 if elem == "int8" else np.uint8)
    for i in range(m):
        for b in range(nb):
            seg = xm[i, b * block:(b + 1) * block]
            if not np.isfinite(seg).all():
                scales[i, b] = 0xFF
                codes[i, b * block:(b + 1) * block] = encode(np.full(seg.shape, np.nan, F32),
                                                            "int8" if elem == "int8" else elem)
                continue
            amax = float(np.abs(seg).max())
            s = -127 if amax == 0 else min(max(math.frexp(amax)[1] - 1 - MX_EMAX[elem], -127),
                                            127)
            scales[i, b] = s + 127
            if elem == "int8":
                v = np.rint(seg.astype(np.float64) * 2.0 ** (6 - s))
                codes[i, b * block:(b + 1) * block] = np.clip(v, -128, 127)
            else:
                codes[i, b * block:(b + 1) * block] = encode(
                    (seg.astype(np.float64) / 2.0**s).astype(F32), elem)
    return codes.reshape(x.shape), scales.reshape(x.shape[:-1] + (nb,) if x.ndim else (1,))


@pytest.mark.parametrize("elem", list(MX_EMAX))
@pytest.mark.parametrize("block", [32, 5])
def test_mx_matches_the_spec(elem, block):
    x = sample((6, 70), seed=block)
    x[3, 40] = np.nan
    x[4, 3] = -np.inf
    codes, scales = lowbit.quantize_mx(x, elem, block)
    want_codes, want_scales = ref_mx(x, elem, block)
    assert scales.dtype == np.uint8 and scales.shape == (6, -(-70 // block))
    np.testing.assert_array_equal(scales, want_scales)
    bad_blocks = {(3, 40 // block), (4, 3 // block)}
    nan_mask = np.zeros(x.shape, bool)
    for i, b in bad_blocks:
        nan_mask[i, b * block:(b + 1) * block] = True
    np.testing.assert_array_equal(codes[~nan_mask], want_codes[~nan_mask])
    out = lowbit.dequantize_mx(codes, scales, elem, block)
    assert np.isnan(out[nan_mask]).all()
    # dequantize: fl(value(code) * 2^s)
    s = scales.astype(np.int32) - 127
    xs = np.repeat(s, block, axis=1)[:, :70].astype(np.float64)
    vals = codes.astype(F32) * F32(2.0**-6) if elem == "int8" else value(codes, elem)
    with np.errstate(over="ignore", invalid="ignore"):  # the NaN blocks' scale code 0xFF
        want = (vals * np.exp2(xs).astype(F32)).astype(F32)
    np.testing.assert_array_equal(out[~nan_mask], want[~nan_mask])


def test_mx_zero_block_and_saturation():
    x = np.zeros((1, 64), F32)
    x[0, 32:] = 1.0
    x[0, 33] = 1.99  # amax < 2: s = 0 - 8; 1.99 / 2^-8 = 509.4 > 448 clamps to max
    codes, scales = lowbit.quantize_mx(x, "e4m3fn")
    assert scales.tolist() == [[0, 127 - 8]]
    assert (codes[0, :32] == 0).all() and codes[0, 33] == 0x7E
    codes, _ = lowbit.quantize_mx(x, "e4m3fn", saturate=False)
    assert codes[0, 33] == 0x7F  # without saturation, the overflow is NaN (e4m3fn has no Inf)


def test_mx_refusals():
    x = sample((2, 8))
    with pytest.raises(ValueError,
                       match=r"^fmt: element format int4 is not an OCP MX element"):
        lowbit.quantize_mx(x, "int4")
    with pytest.raises(ValueError, match=r"^block: must be >= 1"):
        lowbit.quantize_mx(x, "e4m3fn", 0)
    codes, scales = lowbit.quantize_mx(x, "e4m3fn", 4)
    with pytest.raises(ValueError, match=r"^scales: expected 4 elements"):
        lowbit.dequantize_mx(codes, scales[:, :1].copy(), "e4m3fn", 4)
    with pytest.raises(TypeError, match=r"^scales: dtype float32 does not hold E8M0 scale codes"):
        lowbit.dequantize_mx(codes, scales.astype(F32), "e4m3fn", 4)
    with pytest.raises(TypeError, match=r"^codes: dtype int8 does not hold codes of e4m3fn"):
        lowbit.dequantize_mx(codes.view(np.int8), scales, "e4m3fn", 4)


def test_docstrings_are_complete():
    for fn in (lowbit.quantize, lowbit.cast_scaled, lowbit.dequantize, lowbit.quantize_delayed,
               lowbit.quantize_mx, lowbit.dequantize_mx):
        doc = fn.__doc__
        assert "{policy}" not in doc
        for name in inspect.signature(fn).parameters:
            assert re.search(rf"\b{name}\b", doc), (fn.__name__, name)


@pytest.mark.parametrize("fmt,top,mlt", [("e2m1fn", 6.0, ml_dtypes.float4_e2m1fn),
                                         ("e2m3fn", 7.5, ml_dtypes.float6_e2m3fn),
                                         ("e3m2fn", 28.0, ml_dtypes.float6_e3m2fn)])
def test_mx_elements_are_exact_at_every_scale(fmt, top, mlt):
    """code_i = encode(fmt, x_i / 2^s), exact for every scale: from a block scale of 2^105 on,
    the element format shifted by it left the nearest-even short path's magic number beyond
    float (its subnormal range came out 0 or max)."""
    rng = np.random.default_rng(0)
    for e in range(90, 124):
        x = (rng.standard_normal(64) * 2.0 ** (e - 3)).astype(np.float32)
        x[0] = np.float32(top * 2.0 ** e)
        codes, scales = lowbit.quantize_mx(x, fmt, block=32)
        got = lowbit.dequantize_mx(codes, scales, fmt, block=32).astype(np.float64)
        for b in range(2):
            sc = 2.0 ** (int(scales[b]) - 127)
            want = (x[32 * b:32 * b + 32].astype(np.float64) / sc).astype(mlt).astype(
                np.float64) * sc
            assert np.array_equal(got[32 * b:32 * b + 32], want), (fmt, e, b)


class _CudaArrayLike:
    """The __cuda_array_interface__ of a CuPy array (never dereferenced here)."""

    def __init__(self, ptr, shape, typestr, strides=None):
        self.shape = shape
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                         "typestr": typestr, "strides": strides, "version": 3}


def test_cuda_array_interface_outputs_are_checked_for_overlap():
    """CuPy arrays given as out= get the overlap checks of numpy and torch arrays (the checks
    read __cuda_array_interface__: pointer, shape, byte strides)."""
    from lowbit import _interop

    x = _CudaArrayLike(0x10000, (4, 4), "<f4")  # 64 bytes from 0x10000
    assert _interop._byte_range(x) == (0x10000, 0x10040)
    assert _interop._byte_range(_CudaArrayLike(0x10000, (4, 2), "|u1", (-2, 1))) == \
        (0x10000 - 6, 0x10002)
    assert _interop._byte_range(_CudaArrayLike(0x10000, (0, 4), "<f4")) is None
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        _interop._check_output("out", _CudaArrayLike(0x1003F, (4, 4), "|u1"), [("x", x)])
    _interop._check_output("out", _CudaArrayLike(0x10040, (4, 4), "|u1"), [("x", x)])
    with pytest.raises(ValueError, match=r"out: its elements overlap \(a stride of 0"):
        _interop._check_output("out", _CudaArrayLike(0x20000, (4, 4), "|u1", (4, 0)), [])


def test_an_output_that_overlaps_an_input_or_itself_is_refused():
    buf = np.arange(9, dtype=np.float32)
    with pytest.raises(ValueError, match="out overlaps x in memory"):
        lowbit.cast(buf[:-1], "float32", out=buf[1:].view(np.uint32))
    codes = lowbit.cast(np.float32([[1, 2], [3, 4]]), "e4m3fn")
    mem = np.ones(6, np.float32)
    scales, out = mem[:2].reshape(2, 1), mem[1:5].reshape(2, 2)  # out covers scales[1]
    with pytest.raises(ValueError, match="out overlaps scales in memory"):
        lowbit.dequantize(codes, scales, "e4m3fn", "rows", out=out)
    zero = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), (4,), (0,), writeable=True)
    with pytest.raises(ValueError, match=r"out: its elements overlap \(a stride of 0"):
        lowbit.cast(np.float32([1, 2, 3, 4]), "e4m3fn", out=zero)
    out = np.zeros(8, np.uint8)
    assert np.array_equal(lowbit.cast(np.float32([1, 2, 3, 4]), "e4m3fn", out=out[::2]),
                          lowbit.cast(np.float32([1, 2, 3, 4]), "e4m3fn"))


def test_granularity_scale_shape_refuses_sizes_below_one():
    for g in (Granularity.blocks(0), Granularity.blocks(-3), Granularity.tiles(-1, 2)):
        with pytest.raises(ValueError, match="sizes must be >= 1"):
            g.scale_shape((4, 8))


def test_empty_arrays_of_many_rows_return_at_once():
    """(2^30, 2^30, 0): no element, 2^60 empty rows, which the loops of the tensor-scaled and
    MX paths walked (minutes to hours, or a failed allocation)."""
    x = np.zeros((2 ** 30, 2 ** 30, 0), np.float32)
    codes, scales = lowbit.quantize_mx(x, "e4m3fn")
    assert codes.shape == x.shape and scales.size == 0
    assert lowbit.cast_scaled(x, 2.0, "e4m3fn").shape == x.shape
    history = np.float32([3.0, 0.0])
    codes, (q, d) = lowbit.quantize_delayed(x, history, "e4m3fn")
    assert codes.shape == x.shape and history.tolist() == [0.0, 3.0]
    codes, scale = lowbit.quantize(x, "e4m3fn")
    assert codes.shape == x.shape and scale == lowbit.quantize(np.zeros((0, 4), np.float32),
                                                               "e4m3fn")[1]
