"""Every policy (rounding modes, saturation, subnormal flush, NaN sign) against the independent
Fraction oracle of oracle.py, on edge values and on hypothesis-generated inputs."""

from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
import oracle

# Named formats of every kind plus user-defined ones that reach the corners of the rules: an
# unsigned format, one without zero (and signed, unlike E8M0), M = 1 and M = 0 with a zero.
FORMATS = [
    "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3", "e3m4", "e8m0fnu", "e3m2fn", "e2m3fn",
    "e2m1fn", "float16", "bfloat16",
    "e3m3b2_fn_unsigned", "e4m2_none_nozero", "e3m1_ieee", "e5m0_fn", "e4m3b3_fn_nozero",
    "e8m3b1023_ieee",  # the smallest normal of double: double subnormals are below it
]
SMALL_FORMATS = [f for f in FORMATS if lowbit.parse_format(f).bits <= 8]

POLICIES = [
    oracle.Policy(r, s, sub, nan)
    for r, s, sub, nan in itertools.product(
        oracle.DETERMINISTIC_ROUNDINGS, (False, True), ("keep", "flush"), ("preserve", "positive")
    )
]


def spec_of(name: str) -> oracle.Spec:
    return oracle.Spec.of(lowbit.parse_format(name))


def lowbit_cast(x: np.ndarray, name: str, pol: oracle.Policy) -> np.ndarray:
    return lowbit.cast(x, name, rounding=pol.rounding, saturate=pol.saturate,
                       subnormals=pol.subnormals, nan_sign=pol.nan_sign)


def check(x: np.ndarray, name: str, pol: oracle.Policy) -> None:
    got = lowbit_cast(x, name, pol)
    spec = spec_of(name)
    values = x.astype(np.float64).ravel()  # exact for every source dtype
    want = [oracle.encode(spec, float(v), pol) for v in values]
    bad = [(float(v), hex(int(g)), hex(w)) for v, g, w in zip(values, got.ravel(), want) if g != w]
    assert not bad, f"{name} {pol}: (x, lowbit, oracle) {bad[:10]} ({len(bad)} of {len(values)})"


def edge_values(name: str) -> np.ndarray:
    """Every grid point, every midpoint, values just beside each midpoint (at double's
    resolution), beyond max, both signs, zeros, infinities and NaNs."""
    g = oracle.grid(spec_of(name))
    pts = g.points  # 0 included where the format has a zero
    out = []
    for a, b in zip(pts, pts[1:]):
        m = (a + b) / 2
        out += [float(a), float(m), math.nextafter(float(m), 0), math.nextafter(float(m), math.inf)]
    out += [float(g.above_max), float(g.above_max) * 2, float(g.min_positive) / 4, 1e300, 1e-300]
    out += [-v for v in out]
    out += [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan]
    return np.array(out, np.float64)


@pytest.mark.parametrize("name", SMALL_FORMATS)
def test_edges_under_every_policy(name):
    x = edge_values(name)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    x32 = x32[(x32.astype(np.float64) == x) | np.isnan(x)]  # those exact in float32
    for pol in POLICIES:
        check(x, name, pol)
        # The float32 path, under each rounding and overflow mode (the other settings act
        # after the source is read and are covered by the float64 checks).
        if pol.subnormals == "keep" and pol.nan_sign == "preserve":
            check(x32, name, pol)


# ---- hypothesis ---------------------------------------------------------------------------------


@st.composite
def near_grid(draw, name: str) -> float:
    """A grid point, a midpoint, or a midpoint moved by a few units of double's last place."""
    g = oracle.grid(spec_of(name))
    i = draw(st.integers(1, len(g.points) - 1))
    lo, hi = g.points[i - 1], g.points[i]
    kind = draw(st.sampled_from(["point", "mid", "near_mid", "between"]))
    if kind == "point":
        v = float(hi)
    elif kind == "mid":
        v = float((lo + hi) / 2)
    elif kind == "near_mid":
        v = float((lo + hi) / 2)
        for _ in range(draw(st.integers(1, 3))):
            v = math.nextafter(v, draw(st.sampled_from([0.0, math.inf])))
    else:
        t = draw(st.fractions(min_value=0, max_value=1, max_denominator=1 << 20))
        v = float(lo + (hi - lo) * t)
    return -v if draw(st.booleans()) else v


def inputs(name: str):
    info = lowbit.format_info(name)
    anywhere = st.floats(allow_nan=True, allow_infinity=True)
    in_range = st.floats(min_value=-4 * info.max, max_value=4 * info.max)
    tiny = st.floats(min_value=-4 * info.min_normal, max_value=4 * info.min_normal)
    specials = st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan])
    return st.one_of(near_grid(name), near_grid(name), in_range, tiny, anywhere, specials)


SOURCE_DTYPES = [np.float64, np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("name", FORMATS)
@settings(max_examples=60)
@given(data=st.data())
def test_random_values_under_random_policies(name, data):
    values = data.draw(st.lists(inputs(name), min_size=1, max_size=64), label="values")
    pol = data.draw(st.sampled_from(POLICIES), label="policy")
    dtype = data.draw(st.sampled_from(SOURCE_DTYPES), label="dtype")
    with np.errstate(over="ignore"):
        x = np.array(values, np.float64).astype(dtype)  # the oracle sees the rounded inputs
    check(x, name, pol)


# ---- a few documented cases, written out ---------------------------------------------------------


@pytest.mark.parametrize(
    "name, x, kwargs, code",
    [
        ("e4m3fn", 464.0, {}, 0x7E),  # tie between max and the point above: to the even max
        ("e4m3fn", 465.0, {}, 0x7F),  # overflow without Inf: NaN
        ("e4m3fn", 465.0, {"saturate": True}, 0x7E),
        ("e4m3fn", 1e6, {"rounding": "toward_zero"}, 0x7E),  # IEEE 754 7.4: stops at max
        ("e4m3fn", -1e6, {"rounding": "up"}, 0xFE),
        ("e4m3fn", -1e6, {"rounding": "down"}, 0xFF),
        ("e5m2", 61440.0, {}, 0x7C),  # the tie above max overflows: max's significand is odd
        ("e5m2", -math.inf, {"saturate": True}, 0xFB),
        ("e5m2", math.inf, {"rounding": "toward_zero"}, 0x7C),  # Inf input ignores rounding
        ("e4m3fnuz", -0.0, {}, 0x00),  # no negative zero
        ("e4m3fnuz", -math.nan, {}, 0x80),
        ("e4m3fn", -math.nan, {"nan_sign": "positive"}, 0x7F),
        ("e8m0fnu", 0.0, {}, 0xFF),  # no zero: NaN, or the smallest value when saturating
        ("e8m0fnu", 0.0, {"saturate": True}, 0x00),
        ("e8m0fnu", 1.5, {}, 0x80),  # tie between two odd significands (M = 0): up
        ("e8m0fnu", -1.0, {}, 0xFF),  # negative into an unsigned format
        ("e2m1fn", math.nan, {}, 0x0),  # no NaN: +0
        ("e2m1fn", math.inf, {}, 0x7),  # no NaN: max
        ("e2m1fn", 0.25, {}, 0x0),  # tie between 0 and 0.5: to 0
        ("e2m1fn", 0.25, {"rounding": "nearest_away"}, 0x1),
        ("e2m1fn", 0.75, {"subnormals": "flush"}, 0x0),  # below min normal (1): flushed
        ("e2m1fn", -0.75, {"subnormals": "flush"}, 0x8),
        ("e2m1fn", 2.5, {"rounding": "odd"}, 0x5),  # odd: 3 has the odd significand
        ("float16", 65520.0, {}, 0x7C00),
    ],
)
def test_documented_cases(name, x, kwargs, code):
    got = lowbit.cast(np.array([x]), name, **kwargs)
    assert int(got[0]) == code
    assert oracle.encode(spec_of(name), x, oracle.Policy(**kwargs)) == code


@pytest.mark.parametrize(
    "name, x, codes",
    [
        # float32 subnormals into formats whose smallest normal is float32's (2^-126): all below
        # it, so flushed (tininess before rounding, even where rounding would reach 2^-126).
        ("bfloat16", [0x00000001, 0x006C0433, 0x807FFFFF], [0x0000, 0x0000, 0x8000]),
        ("tfloat32", [0x00000001, 0x006C0433, 0x807FFFFF], [0x00000, 0x00000, 0x40000]),
        ("float32", [0x00000001, 0x006C0433, 0x807FFFFF], [0x0, 0x0, 0x80000000]),
        ("float16", [0x00000001, 0x006C0433, 0x807FFFFF], [0x0000, 0x0000, 0x8000]),
    ],
)
def test_flush_of_float32_subnormal_sources(name, x, codes):
    x = np.array(x, np.uint32).view(np.float32)
    if lowbit.parse_format(name).bits <= 16:  # the oracle enumerates the format's codes
        pol = oracle.Policy(subnormals="flush")
        assert [oracle.encode(spec_of(name), float(v), pol) for v in x] == codes
    assert [hex(c) for c in lowbit.cast(x, name, subnormals="flush")] == [hex(c) for c in codes]


def test_flush_of_float64_subnormal_sources():
    # The same with double subnormals, for a format whose smallest normal is double's (2^-1022).
    name = "e8m3b1023_ieee"
    x = np.array([2.0**-1024, -(2.0**-1023)], np.float64)
    assert [hex(c) for c in lowbit.cast(x, name)] == ["0x2", "0x804"]  # kept: subnormal codes
    assert [hex(c) for c in lowbit.cast(x, name, subnormals="flush")] == ["0x0", "0x800"]
