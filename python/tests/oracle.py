"""An independent, slow oracle for lowbit's conversions, written from docs/rounding.md alone.

It enumerates a format's finite values as exact fractions (from the code layout table of
docs/rounding.md, not from lowbit's decode), finds the two grid points around a value by
bisection and applies the rules in the documented order. It shares no code and no bit tricks
with the C++ emulation; the tests compare the two on many generated inputs.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

DETERMINISTIC_ROUNDINGS = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")


@dataclass(frozen=True)
class Spec:
    """The six fields of a format (docs/rounding.md, "Formats")."""

    exp_bits: int
    man_bits: int
    bias: int
    specials: str
    signed: bool
    has_zero: bool

    @staticmethod
    def of(fmt) -> "Spec":
        return Spec(fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.specials, fmt.signed, fmt.has_zero)

    @property
    def mag_bits(self) -> int:
        return self.exp_bits + self.man_bits

    @property
    def sign_code(self) -> int:
        return 1 << self.mag_bits if self.signed else 0

    @property
    def emin(self) -> int:
        return 1 - self.bias if self.has_zero else -self.bias

    def is_finite_magnitude(self, mag: int) -> bool:
        all_ones_exp = (mag >> self.man_bits) == (1 << self.exp_bits) - 1
        if self.specials == "ieee":
            return not all_ones_exp
        if self.specials == "fn":
            return mag != (1 << self.mag_bits) - 1
        return True  # fnuz (its NaN is the -0 code, outside the magnitudes) and none

    def value_of_magnitude(self, mag: int) -> Fraction:
        e, m = mag >> self.man_bits, mag & ((1 << self.man_bits) - 1)
        if e == 0 and self.has_zero:
            return m * Fraction(2) ** (self.emin - self.man_bits)
        return ((1 << self.man_bits) + m) * Fraction(2) ** (e - self.bias - self.man_bits)


def _exponent(v: Fraction) -> int:
    """E with 2^E <= v < 2^(E+1), for v > 0."""
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if Fraction(2) ** e > v:
        e -= 1
    elif Fraction(2) ** (e + 1) <= v:
        e += 1
    return e


class Grid:
    """The finite nonnegative values of a format, their codes, and the point above max."""

    def __init__(self, spec: Spec):
        self.spec = spec
        pairs = []
        for mag in range(1 << spec.mag_bits):
            if spec.is_finite_magnitude(mag):
                pairs.append((spec.value_of_magnitude(mag), mag))
        pairs.sort()
        self.values = [v for v, _ in pairs]
        self.code_of = {v: c for v, c in pairs}
        self.max = self.values[-1]
        self.min_positive = next(v for v in self.values if v > 0)
        self.min_normal = Fraction(2) ** spec.emin
        ulp_max = Fraction(2) ** (_exponent(self.max) - spec.man_bits)
        self.above_max = self.max + ulp_max
        self.points = self.values + [self.above_max]

    def significand(self, v: Fraction) -> int:
        if v == 0:
            return 0
        s = v / Fraction(2) ** (max(_exponent(v), self.spec.emin) - self.spec.man_bits)
        assert s.denominator == 1, (v, s)
        return s.numerator

    def neighbours(self, a: Fraction) -> tuple[Fraction, Fraction]:
        """Consecutive grid points lo <= a <= hi (lo == hi when a is on the grid; beyond the
        point above max both are that point, which is an overflow either way)."""
        i = bisect.bisect_left(self.points, a)
        if i == len(self.points):
            return self.points[-1], self.points[-1]
        if self.points[i] == a:
            return a, a
        return (self.points[i - 1] if i > 0 else Fraction(0)), self.points[i]


@lru_cache(maxsize=None)
def grid(spec: Spec) -> Grid:
    return Grid(spec)


@dataclass(frozen=True)
class Policy:
    rounding: str = "nearest_even"
    saturate: bool = False
    subnormals: str = "keep"
    nan_sign: str = "preserve"
    random_bits: int = 0


def nan_code(spec: Spec, negative: bool, pol: Policy) -> int:
    if spec.specials in ("ieee", "fn"):
        keep = negative and pol.nan_sign == "preserve"
        return (1 << spec.mag_bits) - 1 | (spec.sign_code if keep else 0)
    if spec.specials == "fnuz":
        return spec.sign_code
    return 0  # no NaN: +0


def _has_nan(spec: Spec) -> bool:
    return spec.specials != "none"


def _zero(spec: Spec, negative: bool, pol: Policy) -> int:
    if not spec.has_zero:
        # docs/rounding.md: the smallest value under saturate, NaN otherwise (a positive NaN:
        # the input zero's sign is not carried into the NaN, as for overflow of a signless 0).
        return 0 if pol.saturate or not _has_nan(spec) else nan_code(spec, False, pol)
    has_negative_zero = spec.signed and spec.specials != "fnuz"
    return spec.sign_code if (negative and has_negative_zero) else 0


def _signed(spec: Spec, mag_code: int, negative: bool) -> int:
    return mag_code | (spec.sign_code if negative else 0)


def _max_or_overflow(spec: Spec, g: Grid, negative: bool, pol: Policy, toward_zero: bool) -> int:
    if pol.saturate or not _has_nan(spec) or toward_zero:
        return _signed(spec, g.code_of[g.max], negative)
    if spec.specials == "ieee":
        inf_mag = ((1 << spec.exp_bits) - 1) << spec.man_bits
        return _signed(spec, inf_mag, negative)
    return nan_code(spec, negative, pol)


def _rounds_toward_zero(rounding: str, negative: bool) -> bool:
    return rounding in ("toward_zero", "odd") or (rounding == "down" and not negative) or (
        rounding == "up" and negative
    )


def encode(spec: Spec, x: float, pol: Policy = Policy(), rbits: int = 0) -> int:
    """The code of x (a Python float, exact) under pol: docs/rounding.md, "encode(x), in order"."""
    g = grid(spec)
    negative = math.copysign(1.0, x) < 0
    # 1. NaN
    if math.isnan(x):
        return nan_code(spec, negative, pol)
    # 2. negative into unsigned
    if x < 0 and not spec.signed:
        return 0 if pol.saturate or not _has_nan(spec) else nan_code(spec, False, pol)
    # 3. infinities: the rounding mode plays no part
    if math.isinf(x):
        return _max_or_overflow(spec, g, negative, pol, toward_zero=False)
    # 4. zeros
    if x == 0:
        return _zero(spec, negative, pol)
    # 5. finite nonzero
    a = abs(Fraction(x))
    if not spec.has_zero and a < g.min_positive:
        return 0
    if pol.subnormals == "flush" and a < g.min_normal:
        return _zero(spec, negative, pol)
    lo, hi = g.neighbours(a)
    if lo == hi:
        r = lo
    else:
        r = _round_between(g, a, lo, hi, negative, pol, rbits)
    if r == 0:
        return _zero(spec, negative, pol)
    if r > g.max:
        return _max_or_overflow(spec, g, negative, pol, _rounds_toward_zero(pol.rounding, negative))
    return _signed(spec, g.code_of[r], negative)


def _round_between(g: Grid, a, lo, hi, negative: bool, pol: Policy, rbits: int) -> Fraction:
    mode = pol.rounding
    if mode in ("nearest_even", "nearest_away"):
        if a - lo != hi - a:
            return lo if a - lo < hi - a else hi
        if mode == "nearest_away":
            return hi
        lo_even, hi_even = g.significand(lo) % 2 == 0, g.significand(hi) % 2 == 0
        if lo_even != hi_even:
            return lo if lo_even else hi
        assert not lo_even, "two even neighbours cannot happen"
        return hi
    if mode == "toward_zero":
        return lo
    if mode == "up":
        return lo if negative else hi
    if mode == "down":
        return hi if negative else lo
    if mode == "odd":
        lo_odd, hi_odd = g.significand(lo) % 2 == 1, g.significand(hi) % 2 == 1
        if lo_odd != hi_odd:
            return lo if lo_odd else hi
        return lo
    if mode == "stochastic":
        k = pol.random_bits
        t = (a - lo) / (hi - lo)
        r = rbits & ((1 << k) - 1)
        return hi if math.floor(t * 2**k) + r >= 2**k else lo
    raise ValueError(mode)


def value_of_code(spec: Spec, code: int) -> float | None:
    """The value of a code as a Python float (None for a NaN), from the layout table."""
    negative = spec.signed and bool(code & spec.sign_code)
    mag = code & ((1 << spec.mag_bits) - 1)
    if spec.specials == "fnuz" and negative and mag == 0:
        return None
    if not spec.is_finite_magnitude(mag):
        if spec.specials == "ieee" and mag & ((1 << spec.man_bits) - 1) == 0:
            return -math.inf if negative else math.inf
        return None
    v = float(spec.value_of_magnitude(mag))
    return -v if negative else v


# ---- Philox4x32-10, for the exact check of stochastic rounding ---------------------------------

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, ...]:
    """The Philox4x32 generator with 10 rounds (Salmon et al., SC 2011)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _MASK32, (k1 + _W1) & _MASK32
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & _MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & _MASK32
    return c0, c1, c2, c3


def stream_bits(seed: int, offset: int, i: int) -> int:
    """Random bits of element i of random_stream{seed, offset} (docs/rounding.md)."""
    group = i // 4
    block = philox4x32_10(
        (group & _MASK32, group >> 32, offset & _MASK32, offset >> 32), (seed & _MASK32, seed >> 32)
    )
    return block[i % 4]
