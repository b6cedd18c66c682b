"""ml_dtypes as an outside oracle: its types, its codes, and the inputs where it is known to differ
from lowbit (docs/ml_dtypes.md lists them; lowbit follows docs/rounding.md there).

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
EIGHT_BIT = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4", "e8m0fnu"]
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


@lru_cache(maxsize=None)
def tie_points(name: str) -> frozenset[Fraction]:
    """Midpoints between consecutive grid points (0 and the point above max included)."""
    g = oracle.grid(oracle.Spec.of(lowbit.parse_format(name)))
    return frozenset((a + b) / 2 for a, b in zip(g.points, g.points[1:]))


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
    ties = tie_points(name)
    on_tie = np.array(
        [bool(np.isfinite(v)) and Fraction(abs(float(v))) in ties for v in y.flat], bool
    ).reshape(y.shape)
    out = moved & on_tie
    if name == "e8m0fnu":
        out |= moved & ((y == 0) | class_b(name, y))
    return out
