"""The Python API: formats and their facts, decode, array handling (strides, shapes, dtypes)."""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import lowbit
import oracle

REPO = Path(__file__).resolve().parents[2]

NAMED = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4", "e8m0fnu",
         "e3m2fn", "e2m3fn", "e2m1fn", "float16", "bfloat16", "tfloat32", "float32"]
USER = ["e3m3b2_fn_unsigned", "e4m2_none_nozero", "e3m1_ieee", "e5m0_fn", "e6m9b40_fnuz"]


def test_formats_lists_the_named_formats_in_order():
    assert lowbit.formats() == NAMED


def test_version_matches_pyproject():
    text = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^version = "([^"]+)"', text, re.M).group(1) == lowbit.__version__


def test_format_info_of_wide_formats():
    # Too wide for the oracle's enumeration: numpy's own facts about float32.
    f32 = np.finfo(np.float32)
    info = lowbit.format_info("float32")
    assert (info.max, info.min_normal, info.min_subnormal, info.epsilon) == (
        float(f32.max), float(f32.tiny), float(f32.smallest_subnormal), float(f32.eps))
    assert info.nan_ranges == ((0x7F800001, 0x7FFFFFFF), (0xFF800001, 0xFFFFFFFF))
    tf32 = lowbit.format_info("tfloat32")
    assert (tf32.max, tf32.min_subnormal, tf32.bits) == ((2 - 2.0**-10) * 2.0**127, 2.0**-136, 19)


@pytest.mark.parametrize("name", [n for n in NAMED + USER if lowbit.parse_format(n).bits <= 16])
def test_format_info_against_the_oracle_grid(name):
    info = lowbit.format_info(name)
    spec = oracle.Spec.of(info.fmt)
    g = oracle.grid(spec)
    assert info.name == (name if name in NAMED else lowbit.parse_format(name).name)
    assert info.bits == int(spec.signed) + spec.exp_bits + spec.man_bits
    assert info.max == float(g.max)
    assert info.min_subnormal == float(g.min_positive)
    assert info.min_normal == 2.0**info.emin
    assert info.epsilon == 2.0**-info.man_bits
    assert math.frexp(info.max)[1] - 1 == info.emax
    assert info.has_inf == (spec.specials == "ieee")
    assert info.has_nan == (spec.specials != "none")
    want_dtype = "uint8" if info.bits <= 8 else "uint16" if info.bits <= 16 else "uint32"
    assert info.code_dtype == want_dtype
    assert (info.spec is not None) == (name in NAMED)


@pytest.mark.parametrize("name", [n for n in NAMED + USER if lowbit.parse_format(n).bits <= 16])
def test_decode_every_code(name):
    """decode() of every code against the layout table; NaN and Inf codes against format_info."""
    info = lowbit.format_info(name)
    spec = oracle.Spec.of(info.fmt)
    codes = np.arange(1 << info.bits, dtype=info.code_dtype)
    got = lowbit.decode(codes, name, "float64")
    want = [oracle.value_of_code(spec, c) for c in range(1 << info.bits)]
    nan_want = np.array([w is None for w in want])
    assert np.array_equal(np.isnan(got), nan_want)
    assert set(np.nonzero(nan_want)[0].tolist()) == set(info.nan_codes)
    values = np.array([0.0 if w is None else w for w in want])
    finite = ~nan_want
    assert np.array_equal(got[finite], values[finite])  # exact; -0.0 == 0.0 so check signs too
    assert np.array_equal(np.signbit(got[finite]), np.signbit(values[finite]))
    assert set(np.nonzero(np.isinf(got))[0].tolist()) == set(info.inf_codes)
    # NaN codes decode with their sign (fnuz has none).
    nan_codes = np.array(info.nan_codes, dtype=info.code_dtype)
    signs = np.signbit(lowbit.decode(nan_codes, name, "float64"))
    if info.specials == "fnuz" or not info.signed:
        assert not signs.any()
    else:
        assert np.array_equal(signs, (nan_codes >> (info.bits - 1)) == 1)
    if info.fmt.fits_float:
        assert np.array_equal(lowbit.decode(codes, name).astype(np.float64), got, equal_nan=True)


@pytest.mark.parametrize("name", NAMED + USER)
def test_round_trip_of_every_value(name):
    info = lowbit.format_info(name)
    if info.bits > 16:
        codes = np.random.default_rng(0).integers(0, 1 << info.bits, 1 << 16)
        codes = codes.astype(info.code_dtype)
    else:
        codes = np.arange(1 << info.bits, dtype=info.code_dtype)
    values = lowbit.decode(codes, name, "float64")
    keep = ~np.isnan(values)
    again = lowbit.cast(values[keep], name)
    # Every code that is not a NaN comes back unchanged (NaN codes would become the canonical
    # NaN, so they are left out).
    assert np.array_equal(again, codes[keep])


def test_format_objects():
    f = lowbit.Format(4, 3, bias=7, specials="fn")
    assert f == lowbit.parse_format("e4m3fn") and f.name == "e4m3fn" and str(f) == "e4m3fn"
    assert hash(f) == hash(lowbit.parse_format("e4m3fn"))
    assert f != lowbit.parse_format("e4m3") and f != "e4m3fn"
    assert lowbit.Format(5, 2).bias == 15 and lowbit.Format(5, 2).name == "e5m2"
    g = lowbit.Format(5, 3, specials="fnuz", signed=True)
    assert g.name == "e5m3b15_fnuz" and lowbit.parse_format(g.name) == g
    assert pickle.loads(pickle.dumps(g)) == g
    assert eval(repr(g), {"lowbit": lowbit}) == g
    u = lowbit.Format(8, 0, bias=127, specials="fn", signed=False, has_zero=False)
    assert u.name == "e8m0fnu" and u.spec.startswith("OCP Microscaling")
    assert lowbit.parse_format(u) is not None
    # A Format works wherever a name does.
    x = np.array([1.0, 0.1, -300.0])
    assert np.array_equal(lowbit.cast(x, lowbit.Format(4, 3, 7, "fn")), lowbit.cast(x, "e4m3fn"))


def test_formats_beyond_float_need_float64():
    name = "e8m3b100_ieee"  # values up to 2^154 * 1.875: beyond float32
    assert not lowbit.parse_format(name).fits_float
    codes = np.array([1, 2, 0x7F0], np.uint16)
    got = lowbit.decode(codes, name, "float64")
    assert list(got) == [2.0 ** (1 - 100 - 3), 2.0 ** (2 - 100 - 3), 2.0**154]
    with pytest.raises(ValueError, match="dtype"):
        lowbit.decode(codes, name)
    assert lowbit.decode(codes, name, np.float64).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_input_dtypes_agree(dtype):
    # Values exact in every input type give the same codes from each.
    x = np.array([0.0, -0.0, 1.0, -1.5, 0.375, 448.0, 1e-3, np.inf, np.nan], np.float32)
    x = x.astype(dtype)
    want = lowbit.cast(x.astype(np.float64), "e4m3fn")
    assert np.array_equal(lowbit.cast(x, "e4m3fn"), want)


def test_code_dtypes_and_shapes():
    x = np.linspace(-3, 3, 24).reshape(2, 3, 4)
    for name, dt in [("e2m1fn", np.uint8), ("e5m2", np.uint8), ("float16", np.uint16),
                     ("tfloat32", np.uint32), ("float32", np.uint32)]:
        codes = lowbit.cast(x, name)
        assert codes.dtype == dt and codes.shape == x.shape
        assert np.array_equal(lowbit.decode(codes, name, "float64"),
                              lowbit.decode(codes.ravel(), name, "float64").reshape(x.shape))
    # float16 and float32 targets reproduce numpy's own (correctly rounded) casts.
    r = np.random.default_rng(3).standard_normal(10_000) * 1e3
    assert np.array_equal(lowbit.cast(r, "float16"), r.astype(np.float16).view(np.uint16))
    assert np.array_equal(lowbit.cast(r, "float32"), r.astype(np.float32).view(np.uint32))


def test_empty_and_zero_dimensional():
    e = lowbit.cast(np.zeros((0, 3), np.float32), "e4m3fn")
    assert e.shape == (0, 3) and e.dtype == np.uint8
    assert lowbit.decode(e, "e4m3fn").shape == (0, 3)
    s = lowbit.cast(np.float32(1.0), "e4m3fn")
    assert s.shape == () and int(s) == 0x38
    s = lowbit.cast(np.array(-2.0), "e5m2")
    assert s.shape == () and int(s) == 0xC0
    assert lowbit.decode(np.array(0x38, np.uint8), "e4m3fn").shape == ()
    assert lowbit.cast(0.5, "e2m1fn") == 0x1  # a Python float becomes a 0-d float64 array
    assert list(lowbit.cast([1.0, 2.0], "e2m1fn")) == [0x2, 0x4]
    assert list(lowbit.decode([0x2, 0x4], "e2m1fn")) == [1.0, 2.0]


def test_non_contiguous_views():
    rng = np.random.default_rng(11)
    base = rng.standard_normal((40, 30, 6)).astype(np.float32) * 100
    views = [base[::3, 1::2, ::-1], base.transpose(2, 0, 1), base[:, 5, :], base[::-1, ::-2, 3],
             np.broadcast_to(base[0, 0, :], (7, 6)), base[..., np.newaxis, 2]]
    for v in views:
        got = lowbit.cast(v, "e4m3fn")
        assert np.array_equal(got, lowbit.cast(np.ascontiguousarray(v), "e4m3fn")), v.strides
        codes = lowbit.cast(np.ascontiguousarray(v), "e5m2")
        assert np.array_equal(lowbit.decode(codes.T, "e5m2"), lowbit.decode(codes, "e5m2").T)
    # More dimensions than the C++ views take: fine while contiguous, refused when strided.
    deep = np.ones((1,) * 9 + (2,), np.float32)
    assert lowbit.cast(deep, "e4m3fn").shape == deep.shape
    with pytest.raises(ValueError, match="x: .*at most 8 dimensions"):
        lowbit.cast(np.ones((2,) * 10, np.float32)[..., ::2], "e4m3fn")


def test_read_only_and_byte_swapped_inputs():
    x = np.arange(10, dtype=np.float32)
    x.flags.writeable = False
    assert lowbit.cast(x, "e4m3fn").shape == (10,)
    with pytest.raises(TypeError, match="x: .*byte order"):
        lowbit.cast(x.astype(">f4"), "e4m3fn")


def test_threads_do_not_change_results():
    x = np.random.default_rng(2).standard_normal(300_001)
    one = lowbit.cast(x, "e4m3fn", threads=1)
    assert np.array_equal(lowbit.cast(x, "e4m3fn", threads=7), one)
    assert np.array_equal(lowbit.cast(x, "e4m3fn"), one)


def test_roundings_names():
    assert lowbit.roundings() == ["nearest_even", "nearest_away", "toward_zero", "up", "down",
                                  "odd", "stochastic"]
