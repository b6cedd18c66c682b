"""Stochastic rounding: only the two neighbours appear, the mean is unbiased within a stated
binomial bound, and the exact results follow docs/rounding.md with the Philox stream."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lowbit
import oracle

# A deviation of more than Z standard deviations fails. For a binomial count the normal
# approximation puts the chance of that at about 2e-9 per check, so a failure means a biased
# rounding, not bad luck; the seeds are fixed, so the outcome is also reproducible.
Z = 6.0


def neighbours(name: str, x: float) -> tuple[float, float, float]:
    """lo, hi (magnitudes around |x|, exact) and t = (|x| - lo) / (hi - lo)."""
    g = oracle.grid(oracle.Spec.of(lowbit.parse_format(name)))
    lo, hi = g.neighbours(abs(Fraction(x)))
    return float(lo), float(hi), float((abs(Fraction(x)) - lo) / (hi - lo))


def assert_binomial(count: int, n: int, p: float, what: str) -> None:
    sd = math.sqrt(n * p * (1 - p))
    assert abs(count - n * p) <= Z * sd + 1, (
        f"{what}: {count} of {n}, expected {n * p:.1f} +- {Z} * {sd:.1f}")


@pytest.mark.parametrize(
    "name, x", [("e4m3fn", 0.3), ("e4m3fn", -3.3), ("e5m2", 1e-5), ("e2m1fn", 2.2),
                ("bfloat16", 1.0 + 2.0**-9 + 2.0**-12), ("e8m0fnu", 3.0)])
def test_only_neighbours_and_unbiased_over_seeds(name, x):
    lo, hi, t = neighbours(name, x)
    n = 4000
    xs = np.full(1, x, np.float64)
    values = np.array([lowbit.decode(lowbit.cast(xs, name, rounding="stochastic", seed=s), name,
                                     "float64")[0] for s in range(n)])
    mags = np.abs(values)
    assert set(np.unique(mags)) <= {lo, hi}, np.unique(mags)
    # 32 random bits: P(hi) = floor(t * 2^32) / 2^32, t to within 2^-32.
    ups = int(np.sum(mags == hi))
    assert_binomial(ups, n, t, f"{name} x={x} over seeds")
    # The mean, from the same count: |mean - x| <= Z sd (hi - lo) / n, the bound above rescaled.
    mean = float(np.mean(mags))
    sd = math.sqrt(n * t * (1 - t))
    assert abs(mean - abs(x)) <= (Z * sd + 1) * (hi - lo) / n


@pytest.mark.parametrize("k", [1, 2, 5, 32])
def test_probability_with_k_random_bits(k):
    # With k bits the probability of rounding up is floor(t * 2^k) / 2^k exactly (rounding.md):
    # t = 0.3 gives 0 with one bit, 0.25 with two, 9/32 with five.
    name, x = "e2m1fn", 2.3  # between 2 and 3, t = 0.3 (to double's precision)
    lo, hi, t = neighbours(name, x)
    p = math.floor(t * 2**k) / 2**k
    n = 100_000
    codes = lowbit.cast(np.full(n, x), name, rounding="stochastic", random_bits=k, seed=12345)
    ups = int(np.sum(lowbit.decode(codes, name) == hi))
    if p == 0:
        assert ups == 0
    else:
        assert_binomial(ups, n, p, f"k={k}")


@settings(max_examples=40)
@given(
    name=st.sampled_from(["e4m3fn", "e5m2", "e2m1fn", "e8m0fnu", "bfloat16", "e4m3fnuz"]),
    values=st.lists(st.floats(min_value=-1e5, max_value=1e5, allow_subnormal=True), min_size=1,
                    max_size=40),
    k=st.integers(1, 32),
    seed=st.integers(0, 2**64 - 1),
    offset=st.integers(0, 2**64 - 1),
    saturate=st.booleans(),
)
def test_exact_bits_follow_the_philox_stream(name, values, k, seed, offset, saturate):
    x = np.array(values, np.float64)
    got = lowbit.cast(x, name, rounding="stochastic", random_bits=k, seed=seed, offset=offset,
                      saturate=saturate)
    spec = oracle.Spec.of(lowbit.parse_format(name))
    pol = oracle.Policy("stochastic", saturate, random_bits=k)
    want = [oracle.encode(spec, float(v), pol, oracle.stream_bits(seed, offset, i))
            for i, v in enumerate(x)]
    assert [int(c) for c in got] == want


def test_philox_known_answers():
    # Random123's published answers for Philox4x32-10 (the C++ checks the same words).
    assert oracle.philox4x32_10((0, 0, 0, 0), (0, 0))[0] == 0x6627E8D5
    pi = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert oracle.philox4x32_10(pi, (0xA4093822, 0x299F31D0))[3] == 0x24126EA1


def test_bits_follow_the_logical_index_not_the_layout():
    # Element i of the row-major order draws stream word i, whatever the strides and threads.
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 48))
    at = np.asfortranarray(a)
    kw = dict(rounding="stochastic", random_bits=32, seed=99, offset=3)
    base = lowbit.cast(a, "e4m3fn", **kw)
    assert np.array_equal(lowbit.cast(at, "e4m3fn", **kw), base)
    assert np.array_equal(lowbit.cast(a, "e4m3fn", threads=1, **kw), base)
    # A transposed view is a different logical order: its codes are the transpose of a cast of
    # the transposed copy, not of base.
    assert np.array_equal(lowbit.cast(a.T, "e4m3fn", **kw), lowbit.cast(a.T.copy(), "e4m3fn", **kw))
    # Different offsets give different streams.
    assert not np.array_equal(lowbit.cast(a, "e4m3fn", **{**kw, "offset": 4}), base)


def test_large_array_threads_agree():
    x = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    kw = dict(rounding="stochastic", seed=5)
    one = lowbit.cast(x, "e5m2", threads=1, **kw)
    assert np.array_equal(lowbit.cast(x, "e5m2", threads=3, **kw), one)
