"""ml_dtypes as an outside oracle: its types, its codes, and the classes of inputs where some of
its versions differ from lowbit (docs/ml_dtypes.md describes them, oracle_versions.py says which
version has which; lowbit follows docs/rounding.md there).

Comparisons use ml_dtypes' default conversion, which rounds to nearest-even and does not
saturate, so lowbit's default policy is the one to compare with.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np

import lowbit
import oracle
import oracle_versions

VERSION = oracle_versions.installed_version(ml_dtypes)

# lowbit name -> the ml_dtypes (or numpy) type of the same format.
ML_TYPES = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "e4m3": ml_dtypes.float8_e4m3,
    "e3m4": ml_dtypes.float8_e3m4,
    "e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "e3m2fn": ml_dtypes.float6_e3m2fn,
    "e2m3fn": ml_dtypes.float6_e2m3fn,
    "e2m1fn": ml_dtypes.float4_e2m1fn,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
}
# Types that not every tested release has (ml_dtypes 0.7.0 added float8_e5m3fnu).
NEWER_TYPES = {"e5m3_fn_unsigned": "float8_e5m3fnu"}
for _name, _attr in NEWER_TYPES.items():
    if hasattr(ml_dtypes, _attr):
        ML_TYPES[_name] = getattr(ml_dtypes, _attr)
EIGHT_BIT = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4", "e8m0fnu"]
NEWER = [n for n in NEWER_TYPES if n in ML_TYPES]  # of those, the ones this ml_dtypes has
SMALL = ["e3m2fn", "e2m3fn", "e2m1fn"]  # the OCP MX FP6 and FP4 element types: no NaN, no Inf

E8M0_LOW = 2.0**-127  # smallest E8M0 value; (E8M0_LOW, 1.5 * E8M0_LOW) is disagreement class B


def ml_codes(x: np.ndarray, name: str) -> np.ndarray:
    """ml_dtypes' codes for x, in lowbit's code dtype."""
    code_dtype = lowbit.format_info(name).code_dtype
    with np.errstate(invalid="ignore", over="ignore"):
        return x.astype(ML_TYPES[name]).view(code_dtype)


def as_float64(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN inputs are expected here
        return x.astype(np.float64)  # exact for every input type used here


def _nan_sign_matters(info) -> bool:
    return info.signed and info.specials in ("ieee", "fn")


def agree(name: str, x: np.ndarray, ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Elementwise: do the two codes agree? Equal codes agree; for NaN inputs into formats with
    NaN, any NaN code of the right sign agrees (ml_dtypes keeps payload bits, lowbit gives the
    canonical all-ones NaN)."""
    ok = ours == theirs
    nan_in = np.isnan(as_float64(x))
    info = lowbit.format_info(name)
    if info.has_nan and nan_in.any():
        a, b = ours[nan_in], theirs[nan_in]
        same = np.isnan(lowbit.decode(a, name, "float64"))
        with np.errstate(invalid="ignore"):
            same &= np.isnan(b.view(ML_TYPES[name]).astype(np.float64))
        if _nan_sign_matters(info):
            shift = info.exp_bits + info.man_bits
            same &= (a >> shift) == (b >> shift)
        ok[nan_in] = same
    return ok


# ---- documented disagreements (docs/ml_dtypes.md) ----------------------------------------------


def class_a(name: str, x: np.ndarray) -> np.ndarray:
    """A: NaN into the FP6/FP4 types, which have no NaN. lowbit: +0 (docs/rounding.md);
    ml_dtypes: the zero whose sign bit is the opposite of the NaN's."""
    if name not in SMALL:
        return np.zeros(x.shape, bool)
    return np.isnan(as_float64(x))


def class_b(name: str, x: np.ndarray) -> np.ndarray:
    """B: E8M0 inputs strictly between 2^-127 and 1.5 * 2^-127 (float32 and bfloat16 subnormals).
    lowbit: 2^-127 (the nearest value, code 0x00); ml_dtypes: 2^-126 (0x01)."""
    if name != "e8m0fnu":
        return np.zeros(x.shape, bool)
    v = as_float64(x)
    return (v > E8M0_LOW) & (v < 1.5 * E8M0_LOW)


def expected_for_documented(name: str, x: np.ndarray) -> np.ndarray:
    """lowbit's documented result on class A and B inputs (both are single codes)."""
    return np.zeros(x.shape, lowbit.format_info(name).code_dtype)  # +0 and 2^-127: code 0


def traps(name: str) -> tuple[np.ndarray, list[int]]:
    """Doubles 2^-40 relative beside every tie point (a float32 intermediate would land on the
    tie), with the correctly rounded codes computed here from the grid, not by the oracle's
    encode: above a tie the upper neighbour, below it the lower."""
    g = oracle.grid(oracle.Spec.of(lowbit.parse_format(name)))
    info = lowbit.format_info(name)
    pts = g.points  # 0 is a grid point where the format has a zero
    xs, codes = [], []
    for lo, hi in zip(pts, pts[1:]):
        m = (lo + hi) / 2
        for v, want in ((m * (1 + Fraction(1, 2**40)), hi), (m * (1 - Fraction(1, 2**40)), lo)):
            assert Fraction(float(v)) == v  # exact in double
            if want > g.max and info.has_nan:  # overflow: Inf, or NaN where there is no Inf
                code = info.inf_ranges[0][0] if info.has_inf else info.nan_ranges[0][0]
            elif want > g.max:  # formats without NaN saturate
                code = g.code_of[g.max]
            else:
                code = g.code_of[want]
            for sign in (1, -1):
                xs.append(sign * float(v))
                neg = sign < 0 and info.signed and not (want == 0 and info.specials == "fnuz")
                if sign < 0 and not info.signed:
                    code_s = info.nan_ranges[0][0]  # negative into unsigned (E8M0): NaN
                else:
                    code_s = code | ((1 << (info.bits - 1)) if neg else 0)
                codes.append(code_s)
    return np.array(xs, np.float64), codes


@lru_cache(maxsize=None)
def tie_points(name: str) -> frozenset[Fraction]:
    """Midpoints between consecutive grid points (0 and the point above max included)."""
    g = oracle.grid(oracle.Spec.of(lowbit.parse_format(name)))
    return frozenset((a + b) / 2 for a, b in zip(g.points, g.points[1:]))


@lru_cache(maxsize=None)
def tie_array(name: str) -> np.ndarray:
    """tie_points as float64 (each is exact in double: at most 24 significant bits)."""
    ties = sorted(tie_points(name))
    assert all(Fraction(float(t)) == t for t in ties)
    return np.array([float(t) for t in ties], np.float64)


def on_tie(name: str, y: np.ndarray) -> np.ndarray:
    """Elementwise: is the float64 y (finite or not) on a tie point of the format, either sign?"""
    with np.errstate(invalid="ignore"):
        return np.isin(np.abs(y), tie_array(name))


def class_c(name: str, x64: np.ndarray) -> np.ndarray:
    """C: float64 inputs that ml_dtypes rounds twice, through float32, where that changes the
    result: float32(x) != x lands on a tie point of the format (then the tie rule decides instead
    of x's side), and for E8M0 also float32(x) == 0 (0 is not a value: ml_dtypes gives NaN where x
    rounds to 2^-127) and float32(x) in class B. float16 is exempt (numpy converts directly)."""
    if name == "float16":
        return np.zeros(x64.shape, bool)
    with np.errstate(over="ignore"):
        y = x64.astype(np.float32).astype(np.float64)
    moved = (y != x64) & ~np.isnan(x64)
    out = moved & on_tie(name, y)
    if name == "e8m0fnu":
        out |= moved & ((y == 0) | class_b(name, y))
    return out


CLASSES = {"A": class_a, "B": class_b}  # recognizable from any input
CLASSES_FLOAT64 = {"C": class_c}  # only float64 inputs can be rounded twice


def classes_of(name: str, x: np.ndarray) -> dict[str, np.ndarray]:
    """Every difference class of docs/ml_dtypes.md, whichever versions have it: key -> mask."""
    out = {k: f(name, x) for k, f in CLASSES.items()}
    if x.dtype == np.float64:
        out.update({k: f(name, x) for k, f in CLASSES_FLOAT64.items()})
    return out


def exercised_by(name: str, x: np.ndarray, masks=None) -> set[str]:
    """The classes that must show where every input of x is compared: class A needs a +NaN
    (ml_dtypes' -NaN result, +0, is lowbit's), the others any input of theirs."""
    masks = classes_of(name, x) if masks is None else masks
    v = as_float64(x)
    pos_nan = np.isnan(v) & ~np.signbit(v)
    return {k for k, m in masks.items() if (m & pos_nan).any() or (k != "A" and m.any())}


class Comparison:
    """lowbit against ml_dtypes on one input array: which documented classes show disagreements,
    which were exercised, what falls outside every class, and where lowbit is not its documented
    result (class A and B inputs: code 0, whatever the oracle says)."""

    def __init__(self, name: str, x: np.ndarray, complete: bool):
        self.name, self.x = name, x
        self.ours = lowbit.cast(x, name)
        self.theirs = ml_codes(x, name)
        differs = ~agree(name, x, self.ours, self.theirs)
        masks = classes_of(name, x)
        self.seen = {k for k, m in masks.items() if (differs & m).any()}
        # Complete: every input of a class that the array holds is compared, so that a class the
        # table gives this version must show (class A: a +NaN; the others: any input of theirs).
        self.exercised = exercised_by(name, x, masks) if complete else set()
        known = np.zeros(x.shape, bool)
        for m in masks.values():
            known |= m
        self.unexplained = np.nonzero((differs & ~known).ravel())[0]
        ab = masks["A"] | masks["B"]
        self.lowbit_wrong = np.nonzero((ab & (self.ours != 0)).ravel())[0]

    def example(self, idx) -> str:
        flat_x, a, b = self.x.ravel(), self.ours.ravel(), self.theirs.ravel()
        rows = [f"x={float(flat_x[i])!r} lowbit={int(a[i]):#x} ml_dtypes={int(b[i]):#x}"
                for i in idx[:10]]
        return ", e.g.\n  " + "\n  ".join(rows) if rows else ""

    def problems(self, where: str) -> list[str]:
        return oracle_versions.class_problems(
            oracle_versions.ML_DTYPES, VERSION, where, self.seen, self.exercised,
            len(self.unexplained), self.example(self.unexplained))
