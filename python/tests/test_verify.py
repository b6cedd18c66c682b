"""lowbit.verify from Python: the C++ comparison through the binding, checked against facts
computed independently here (ml_dtypes' decoding of every code, the IEEE order of float16 bit
patterns, hand-computed cases), plus the report's Python surface and the argument errors."""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import lowbit
from dlfake import Fake
from lowbit import _core

import mlref


def codes_of(fmt: str) -> np.ndarray:
    bits = _core.parse_format(fmt).bits
    return np.arange(1 << bits, dtype=np.uint16 if bits > 8 else np.uint8)


# ---- identical arrays, single differences ----------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int32"])
def test_identical_arrays_pass_every_policy(dtype):
    rng = np.random.default_rng(1)
    width = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).itemsize
    raw = rng.integers(0, 256, size=(5, 7, width), dtype=np.uint8)
    a = raw.view(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype).reshape(5, 7)
    b = a.copy()
    for policy in ["exact", "exact:strict", "ulp:0", "atol:0", lambda r: 0.0]:
        report = lowbit.verify(a, b, policy)
        assert report.ok and bool(report)
        assert report.total == 35 and report.failed == 0
        assert report.checked + report.nan_matches == 35
        assert report.max_ulp_error == 0 and report.worst == []
        assert sum(bucket.count for bucket in report.histogram) == report.checked


def test_one_flipped_bit_is_found_with_its_index_and_bits():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8
    b = a.copy()
    b.view(np.uint32)[1, 2, 3] ^= 1 << 22
    report = lowbit.verify(b, a, "exact")
    assert not report.ok
    assert report.failed == 1
    (e,) = report.worst
    assert e.index == (1, 2, 3) and e.flat_index == 23
    assert e.candidate_hex == f"0x{int(b.view(np.uint32)[1, 2, 3]):08X}"
    assert e.reference_hex == f"0x{int(a.view(np.uint32)[1, 2, 3]):08X}"
    assert e.expected == e.reference == float(a[1, 2, 3])
    assert e.failed and not e.nan_mismatch


def test_transposed_views_report_logical_indices():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = np.ascontiguousarray(a.T).T  # same values, column-major memory
    b[2, 1] += 1
    report = lowbit.verify(b, a, "exact")
    assert [e.index for e in report.worst] == [(2, 1)]


# ---- ulp distances against independent oracles -----------------------------------------------


@pytest.mark.parametrize("fmt", mlref.EIGHT_BIT + mlref.SMALL)
def test_ulp_distance_between_codes_against_ml_dtypes(fmt):
    codes = codes_of(fmt)
    values = codes.view(mlref.ML_TYPES[fmt]).astype(np.float64)  # FP6/FP4: one code a byte
    finite = np.unique(values[np.isfinite(values)])  # ascending, -0 and +0 one point
    index = np.searchsorted(finite, values).astype(np.float64)
    index[values == np.inf] = len(finite)
    index[values == -np.inf] = -1
    # Every code against: 16 random codes, and the zeros, extremes, infinities and NaNs.
    special = np.flatnonzero((values == 0) | np.isinf(values) | np.isnan(values)
                             | (np.abs(values) == np.nanmax(np.abs(values[np.isfinite(values)])))
                             | (np.abs(values) == np.min(np.abs(values[values != 0]))))
    rng = np.random.default_rng(sum(fmt.encode()))
    firsts = np.union1d(special, rng.choice(len(codes), size=16, replace=False))
    cand = np.repeat(codes[firsts], len(codes))
    ref = np.tile(codes, len(firsts))
    report = lowbit.verify(cand, ref, "ulp:inf", fmt=fmt, worst=len(cand))
    nan = np.isnan(values)
    both_nan = nan[cand] & nan[ref]
    one_nan = nan[cand] ^ nan[ref]
    assert report.nan_matches == both_nan.sum()
    assert report.nan_mismatches == one_nan.sum() == report.failed
    expected = np.abs(index[cand] - index[ref])
    got = {e.flat_index: e.ulp_error for e in report.worst if not e.nan_mismatch}
    numeric = ~(nan[cand] | nan[ref])
    assert set(got) == set(np.flatnonzero(numeric & (expected > 0)))
    for i, d in got.items():
        assert d == expected[i], (fmt, hex(cand[i]), hex(ref[i]))
    assert report.max_ulp_error == expected[numeric].max()


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF))
def test_float16_distance_is_the_distance_of_ordered_bit_patterns(a, b):
    def ordered(bits: int) -> int:
        return -(bits & 0x7FFF) if bits & 0x8000 else bits

    pair = np.array([a, b], np.uint16).view(np.float16)
    if np.isnan(pair).any():
        return
    report = lowbit.verify(pair[:1], pair[1:], "ulp:inf")
    assert report.grid == "float16"
    assert report.max_ulp_error == abs(ordered(a) - ordered(b))


def test_fractional_distances_off_the_grid():
    c = np.float32([1.0, 1.0, 2.0**-149])
    r = np.array([1 + 2.0**-24, 1 + 3 * 2.0**-25, 0.0])
    report = lowbit.verify(c, r, "ulp:0.5", worst=3)
    assert report.grid == "float32"
    assert sorted(e.ulp_error for e in report.worst) == [0.5, 0.75, 1.0]
    assert report.failed == 2
    # Named grid: 1 and 1.25 are two e4m3fn steps apart whatever the arrays' dtype.
    assert lowbit.verify(np.float32([1.25]), np.float64([1.0]), "ulp:2@e4m3fn").max_ulp_error == 2


def test_infinities_and_the_top_of_the_grid():
    # float16: 65504 (max) and Inf are neighbours; e4m3fn has no Inf.
    report = lowbit.verify(np.float16([np.inf]), np.float16([65504]), "ulp:1")
    assert report.ok and report.max_ulp_error == 1
    report = lowbit.verify(np.float32([np.inf]), np.float32([448]), "ulp:1000@e4m3fn")
    assert not report.ok and report.max_ulp_error == math.inf
    assert report.histogram[-1].label == "inf"


def test_ml_dtypes_arrays_are_codes_of_their_format():
    x = np.float32([0.1, 1.7, 300.0])
    mine = x.astype(ml_dtypes.float8_e4m3fn)
    expected = lowbit.cast(x, "e4m3fn")
    report = lowbit.verify(mine, expected, "exact")
    assert report.ok and report.grid == "e4m3fn" and report.candidate_dtype == "uint8"
    report = lowbit.verify(mine, x, "ulp:1", inputs=x.astype(ml_dtypes.float4_e2m1fn))
    assert report.ok and report.worst[0].input_hex.startswith("0x")
    with pytest.raises(ValueError, match="holds e4m3fn codes, but fmt is e5m2"):
        lowbit.verify(mine, expected, "exact", fmt="e5m2")
    with pytest.raises(ValueError, match="reference: dtype float8_e5m2 holds e5m2 codes"):
        lowbit.verify(mine, x.astype(ml_dtypes.float8_e5m2), "ulp:1")


# ---- tolerances and bounds -----------------------------------------------------------------------


def test_tolerance_boundary_and_infinities():
    r = np.array([1.0, 1.0, 1.0, np.inf, 2.0])
    c = np.array([1.25, 1.25 + 2.0**-52, 0.75, np.inf, np.inf])
    report = lowbit.verify(c, r, "atol:0.125,rtol:0.125", worst=5)
    assert [e.flat_index for e in report.worst if e.failed] == [4, 1]
    assert report.failed == 2
    allowed = {e.flat_index: e.allowed for e in report.worst}
    assert allowed[0] == allowed[2] == 0.25


def test_nan_rules():
    c = np.float32([np.nan, np.nan, 1.0])
    r = np.float32([-np.nan, 1.0, np.nan])
    report = lowbit.verify(c, r, "ulp:1")
    counts = (report.checked, report.nan_matches, report.nan_mismatches, report.failed)
    assert counts == (0, 1, 2, 2)
    assert all(e.nan_mismatch and math.isnan(e.ulp_error) for e in report.worst)
    assert lowbit.verify(c[:1], r[:1], "exact").ok
    assert not lowbit.verify(c[:1], r[:1], "exact:strict").ok


def test_bound_functions_see_values_and_inputs():
    x = np.float32([[1, 2], [3, 4]])
    ref = np.float64(x) ** 2
    cand = np.float32(ref) + np.float32([[0, 0.5], [0, 0]])
    seen = {}

    def within(reference, inputs):
        seen["reference"], seen["inputs"] = reference, inputs
        return 0.25 * inputs

    report = lowbit.verify(cand, ref, within, inputs=x)
    assert report.ok and report.policy == "bound:within"
    assert seen["reference"].dtype == np.float64 and seen["inputs"].shape == (2, 2)
    assert not lowbit.verify(cand, ref, lambda r: 0.25).ok  # a scalar broadcasts
    codes = lowbit.cast(np.float32([1.0, 1.1]), "e4m3fn")
    report = lowbit.verify(codes, codes, lambda r: r * 0, fmt="e4m3fn")
    assert report.ok
    with pytest.raises(ValueError, match=r"bound function returned nan at index \[1\]"):
        lowbit.verify(cand[0], ref[0], lambda r: np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match=r"does not broadcast to the arrays' shape \(2, 2\)"):
        lowbit.verify(cand, ref, lambda r: np.zeros(3))


def test_assert_verified():
    a = np.float32([1, 2, 3])
    assert lowbit.assert_verified(a, a).ok
    with pytest.raises(AssertionError) as info:
        lowbit.assert_verified(a + 1, a, "atol:0.5")
    text = str(info.value)
    assert "verify FAILED: 3 of 3 elements outside atol:0.5" in text
    assert "[0]" in text and "0x40000000" in text


# ---- the report ----------------------------------------------------------------------------


def test_report_text_json_and_repr():
    c = np.float32([1.0, np.inf, 3.0])
    r = np.float32([1.0, 2.0, 3.5])
    report = lowbit.verify(c, r, "atol:0.25", inputs=np.int8([7, 8, 9]))
    text = str(report)
    assert text.startswith("verify FAILED: 2 of 3 elements outside atol:0.25\n")
    assert "inputs int8" in text and "8 (0x08)" in text and "inf (0x7F800000)" in text
    assert not text.endswith("\n")
    assert repr(report) == "<lowbit.verify.Report FAILED 2/3 policy='atol:0.25' grid='float32'>"
    data = json.loads(report.to_json())
    assert data["worst"][0]["abs_error"] == "inf"  # JSON has no Inf
    assert data["input_dtype"] == "int8" and data["shape"] == [3]
    d = report.to_dict()
    assert d["worst"][0]["abs_error"] == math.inf and d["max_abs_error"] == math.inf
    assert d["worst"][0]["index"] == [1] and d["worst"][0]["input"] == 8.0
    assert json.loads(report.to_json(indent=2)) == data
    assert report.shape == (3,) and report.input_dtype == "int8"
    assert lowbit.verify(c, c).input_dtype is None


def test_histogram_buckets():
    r = np.zeros(9, np.int32)
    c = np.int32([0, 1, 1, 2, 3, 4, 5, 8, 9])
    report = lowbit.verify(c, r, "ulp:100")
    assert report.grid == "integers"
    assert [(b.label, b.count) for b in report.histogram] == [
        ("0", 1), ("(0, 1]", 2), ("(1, 2]", 1), ("(2, 4]", 2), ("(4, 8]", 2), ("(8, 16]", 1)]
    assert (report.histogram[3].lo, report.histogram[3].hi) == (2, 4)


def test_worst_keeps_the_worst():
    r = np.zeros(100)
    c = np.arange(100.0)
    report = lowbit.verify(c, r, "atol:50", worst=3)
    assert [e.flat_index for e in report.worst] == [99, 98, 97]
    assert lowbit.verify(c, r, "atol:50", worst=0).worst == []


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((np.zeros(3), np.zeros(4)), {}, ValueError,
     r"candidate has shape \(3,\) but reference has shape \(4,\)"),
    ((np.zeros(3, np.float32), np.zeros(3)), {}, TypeError, "exact compares bit patterns"),
    ((np.zeros(3, np.uint8), np.zeros(3, np.uint8)), {}, ValueError,
     "holds codes of a number format"),
    ((np.zeros(3, np.uint16), np.zeros(3, np.uint16), "ulp:1@e4m3fn"), {}, TypeError,
     "dtype uint16 does not hold codes of e4m3fn; expected uint8"),
    ((np.zeros(3), np.zeros(3), "close"), {}, ValueError, "unknown policy 'close'"),
    ((np.zeros(3), np.zeros(3), "atol:nan"), {}, ValueError, "atol is NaN"),
    ((np.zeros(3), np.zeros(3), "rtol:-1"), {}, ValueError, "rtol must be >= 0"),
    ((np.zeros(3), np.zeros(3), "ulp:1@e5m2"), {"fmt": "e4m3fn"}, ValueError,
     "names format e5m2 but the format argument is e4m3fn"),
    ((np.zeros(3), np.zeros(3), 3), {}, TypeError, "policy: expected a string"),
    ((np.zeros(3), np.zeros(3)), {"worst": -1}, ValueError, "worst: expected a count >= 0"),
    ((np.zeros(3), np.zeros(3)), {"worst": 1.5}, TypeError, "worst: expected an integer"),
    ((np.zeros(3), np.zeros(3)), {"fmt": 7}, TypeError, "fmt: expected a format name"),
    ((np.zeros(3), np.zeros(3)), {"fmt": "e9m9"}, ValueError, "fmt: format 'e9m9'"),
    ((np.zeros(3, np.int64), np.zeros(3, np.int64)), {}, TypeError, "int64 is not supported"),
    ((np.zeros(3, bool), np.zeros(3, bool)), {}, TypeError, "dtype bool is not supported"),
    ((np.uint8([0, 0x1F]), np.uint8([0, 0])), {"fmt": "e2m1fn"}, ValueError,
     r"candidate\[1\] = 0x1F is not a code of e2m1fn"),
    ((Fake(np.zeros(3), device=(4, 0)), np.zeros(3)), {}, TypeError,
     r"^candidate: memory on OpenCL \(DLPack device type 4\) is not supported"),
    ((np.zeros((1,) * 9), np.zeros((1,) * 9)), {}, ValueError,
     r"^candidate: at most 8 dimensions, got 9; reshape it"),
])
def test_errors(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        lowbit.verify(*args, **kwargs)


def test_package_exports():
    assert callable(lowbit.verify) and lowbit.verify.__module__ == "lowbit._verify"
    assert {"verify", "assert_verified", "Report"} <= set(lowbit.__all__)
    assert isinstance(lowbit.verify(np.zeros(1), np.zeros(1)), lowbit.Report)


def test_worst_beyond_the_array_keeps_every_element():
    r = lowbit.verify(np.float32([1, 2, 3]), np.float32([1, 3, 4]), worst=2 ** 40)
    assert len(r.worst) == 2
    r = lowbit.verify(np.float32([1, 2]), np.float32([1, 3]), worst=2 ** 70)
    assert len(r.worst) == 1


def test_a_bound_is_checked_at_nan_elements_too():
    """docs/verification.md: a bound must be >= 0 and not NaN at every element."""
    c, r = np.float32([1, np.nan, np.nan]), np.float32([1, np.nan, 2])
    for bad in ([0.1, -5, 0.1], [0.1, 0.1, np.nan]):
        with pytest.raises(ValueError, match=r"bound: the bound function returned"):
            lowbit.verify(c, r, lambda ref, b=bad: np.array(b))
    # A NaN mismatch lists the allowance of its reference value.
    rep = lowbit.verify(np.float32([np.nan]), np.float32([1.0]), "atol:0.5,rtol:0.25")
    assert rep.worst[0].allowed == 0.75


def test_a_bound_of_other_than_real_numbers_is_named():
    for ret, kind in (("x", "str"), (np.array([1j, 2j]), "ndarray")):
        with pytest.raises(TypeError, match=f"bound: the function returned {kind} values that "
                                            "are not real numbers"):
            lowbit.verify(np.float32([1, 2]), np.float32([1, 2]), lambda r, v=ret: v)
