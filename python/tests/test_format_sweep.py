"""The format sweep (issue 15): every public function of lowbit that takes a format, called with
every name of lowbit.formats() (plus a few user-defined formats and the integer targets).

Each call either raises ValueError naming the format, and then the function's documentation
refuses that format (the CLAIMS table below, which quotes the docstrings and
kernels/include/lowbit/kernels/*.hpp), or returns results that equal an independent computation
from lowbit.cast / lowbit.decode and the equations of docs/techniques/quantization.md. Format
arguments are passed positionally where the signature allows (they are being renamed).
"""

import math

import numpy as np
import pytest

import lowbit

F32 = np.float32
OCP_MX = {"e4m3fn", "e5m2", "e3m2fn", "e2m3fn", "e2m1fn", "int8"}
USER = ["e8m23b0", "e5m11", "e6m9", "e8m7b150", "e5m10_unsigned", "e4m3_fn_nozero",
        "e8m0b0_fn_unsigned_nozero", "e3m1_none_unsigned", "e1m0_none"]
INTS = ["int8", "int8_sym", "uint8", "int4", "int4_sym", "uint4"]
FORMATS = lowbit.formats() + USER


def fits_float(name):
    info = lowbit.format_info(name)
    # format.hpp's fits_float: emax <= 127 and emin - man_bits >= -149.
    return info.emax <= 127 and info.emin - info.man_bits >= -149


def is_target(name):
    """quantize.hpp, struct target: a format whose values fit float32, with codes of at most 16
    bits (uint8/uint16), or an integer target of at most 8 bits."""
    if name in INTS:
        return True
    return fits_float(name) and lowbit.format_info(name).bits <= 16


CLAIMS = {
    # cast.hpp / lowbit.cast: "a format name or a Format", codes uint8/uint16/uint32.
    "cast": lambda n: True,
    # lowbit.decode: "float64 is required for formats whose values do not all fit float32".
    "decode_float32": fits_float,
    "decode_float64": lambda n: True,
    "format_info": lambda n: True,
    "parse_format": lambda n: True,
    # lowbit.quantize: "a float format whose values fit float32 ... or an integer target".
    "quantize": is_target,
    "cast_scaled": is_target,
    "dequantize": is_target,
    "quantize_delayed": is_target,
    "target_info": is_target,
    # quantize.hpp, quantize_mx: "Element targets: e4m3fn, e5m2 (MXFP8), e3m2fn, e2m3fn
    # (MXFP6), e2m1fn (MXFP4), int8 (MXINT8)".
    "quantize_mx": lambda n: n in OCP_MX,
    "dequantize_mx": lambda n: n in OCP_MX,
    # Codebook.from_format: "a format of at most 8 bits" (values divided in float32).
    "codebook_from_format": lambda n: lowbit.format_info(n).bits <= 8 and fits_float(n),
    # lowbit.verify: "format: the format of code arrays (uint8/uint16/uint32)".
    "verify": lambda n: True,
}


def sample(shape=(3, 37)):
    """Magnitudes over 2^-20 .. 2^20 with both signs and zeros; row 1 all zeros, a NaN in row 2
    (a poisoned group)."""
    rng = np.random.default_rng(15)
    x = (rng.uniform(1, 2, shape) * np.exp2(rng.integers(-20, 21, shape))
         * rng.choice([-1, 1], shape)).astype(F32)
    x[rng.uniform(size=shape) < 0.08] = 0
    x[1] = 0
    x[2, 5] = np.nan
    return x


def outcome(name, fn_name, call):
    """Runs call(); returns its result, or None when it raised ValueError that names the format
    (after checking that the claims table refuses it)."""
    claimed = CLAIMS[fn_name](name)
    try:
        result = call()
    except (ValueError, TypeError) as e:
        assert not claimed, f"{fn_name}({name}) is claimed but raised {e!r}"
        # A float32 decode beyond float32 is a dtype refusal; every other refusal names the format.
        if fn_name != "decode_float32":
            assert isinstance(e, ValueError), f"{fn_name}({name}): {e!r}"
            assert name in str(e) or lowbit.parse_format(name).name in str(e), (
                f"{fn_name}({name}): the error does not name the format: {e}")
        return None
    assert claimed, f"{fn_name}({name}) is accepted but not claimed"
    return result


def same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got[~nan], want[~nan])


def code_values(codes, name):
    """Values of target codes as float64 (integer targets: the integers)."""
    if name in INTS:
        return np.asarray(codes).astype(np.float64)
    return lowbit.decode(codes, name, "float64")


def target_facts(name):
    """(code dtype, max) of lowbit.target_info (a TargetInfo, or the older tuple)."""
    info = lowbit.target_info(name)
    return (info.code_dtype, info.max) if hasattr(info, "max") else (info[1], info[2])


def cast_target(y, name):
    """encode(target, y) with saturation: lowbit.cast for formats; for integer targets
    round-to-nearest-even, clamped to the target's range (NaN -> 0)."""
    if name in INTS:
        code_dtype, hi = target_facts(name)
        lo = 0 if name.startswith("uint") else (-hi if name.endswith("_sym") else -hi - 1)
        r = np.clip(np.rint(np.nan_to_num(y.astype(np.float64), nan=0.0)), lo, hi)
        return r.astype(np.dtype(code_dtype))
    return lowbit.cast(y, name, saturate=True)


ALL_TARGETS = FORMATS + INTS


# ---- formats themselves --------------------------------------------------------------------

@pytest.mark.parametrize("name", FORMATS)
def test_format_info_and_parse(name):
    info = outcome(name, "format_info", lambda: lowbit.format_info(name))
    f = outcome(name, "parse_format", lambda: lowbit.parse_format(name))
    assert f.bits == info.bits == (1 if info.signed else 0) + info.exp_bits + info.man_bits
    assert info.code_dtype == ("uint8" if info.bits <= 8 else
                               "uint16" if info.bits <= 16 else "uint32")


@pytest.mark.parametrize("name", FORMATS)
def test_cast_and_decode(name):
    info = lowbit.format_info(name)
    bits = info.bits
    n = 1 << bits if bits <= 12 else 4096
    codes = (np.arange(n, dtype=np.uint64) * ((1 << bits) // n)).astype(info.code_dtype)
    v64 = outcome(name, "decode_float64", lambda: lowbit.decode(codes, name, "float64"))
    v32 = outcome(name, "decode_float32", lambda: lowbit.decode(codes, name, "float32"))
    if v32 is not None:
        same(v32.astype(np.float64), v64)
    # Every non-NaN value casts back to its code (the code of a zero: either zero code).
    keep = ~np.isnan(v64) & (v64 != 0)
    back = outcome(name, "cast", lambda: lowbit.cast(v64[keep], name))
    np.testing.assert_array_equal(back, codes[keep])
    x = sample()
    c = lowbit.cast(x, name, saturate=True)
    assert c.dtype == np.dtype(info.code_dtype) and c.shape == x.shape
    # float32 inputs read as float64 give the same codes (each is rounded once, directly).
    np.testing.assert_array_equal(c, lowbit.cast(x.astype(np.float64), name, saturate=True))


# ---- scaled quantization -------------------------------------------------------------------

def expected_scale(amax, tmax):
    """(q, d) of quantize.hpp's rule with margin 0, in float32."""
    amax, tmax = F32(amax), F32(tmax)
    if not np.isfinite(amax):
        return F32(np.nan), F32(np.nan)
    if amax == 0:
        return F32(1), F32(1)
    with np.errstate(over="ignore"):
        q = tmax / amax
    return (F32(np.finfo(F32).max) if np.isinf(q) else q), amax / tmax


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_quantize_per_row(name):
    x = sample()
    got = outcome(name, "quantize", lambda: lowbit.quantize(x, name, "rows"))
    if got is None:
        return
    codes, scales = got
    tmax = target_facts(name)[1]
    for r in range(x.shape[0]):
        amax = np.nan if np.isnan(x[r]).any() else np.abs(x[r]).max()
        q, d = expected_scale(amax, tmax)
        same(scales.reshape(-1)[r], d)
        with np.errstate(over="ignore"):
            y = np.full(x.shape[1], np.nan, F32) if np.isnan(q) else (x[r] * q).astype(F32)
        np.testing.assert_array_equal(codes[r], cast_target(y, name))
    out = outcome(name, "dequantize", lambda: lowbit.dequantize(codes, scales, name, "rows"))
    v = code_values(codes, name)
    with np.errstate(invalid="ignore"):
        want = np.where(np.isnan(v), v, (v.astype(F32) * scales.reshape(-1, 1)))
    same(out, want.astype(F32))


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_cast_scaled_and_delayed(name):
    x = sample()
    x[2, 5] = 1.5  # the delayed history keeps a finite amax
    codes = outcome(name, "cast_scaled", lambda: lowbit.cast_scaled(x, 0.75, name))
    if codes is not None:
        np.testing.assert_array_equal(codes, cast_target((x * F32(0.75)).astype(F32), name))
    history = np.array([2.0, 5.0], F32)
    got = outcome(name, "quantize_delayed", lambda: lowbit.quantize_delayed(x, history, name))
    if got is None:
        np.testing.assert_array_equal(history, [2.0, 5.0])  # a refusal leaves the history
        return
    codes, pair = got
    q, d = expected_scale(5.0, target_facts(name)[1])
    same(pair, np.array([q, d], F32))
    with np.errstate(over="ignore"):  # +-Inf products saturate like the kernel's
        y = (x * q).astype(F32)
    np.testing.assert_array_equal(codes, cast_target(y, name))
    np.testing.assert_array_equal(history, [np.abs(x).max(), 2.0])


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_target_info(name):
    info = outcome(name, "target_info", lambda: lowbit.target_info(name))
    if info is not None and name not in INTS:
        assert target_facts(name)[1] == lowbit.format_info(name).max


# ---- OCP MX --------------------------------------------------------------------------------

def mx_emax(name):
    return 0 if name == "int8" else lowbit.format_info(name).emax


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_quantize_mx(name):
    x = sample()
    got = outcome(name, "quantize_mx", lambda: lowbit.quantize_mx(x, name))
    if got is None and is_target(name):
        # The defect (float16, bfloat16, other 8-bit formats, int8_sym, int4): a target
        # that quantize takes is refused by MX outright, with the message that names it.
        with pytest.raises(ValueError, match=r"is not an OCP MX element format \(e4m3fn, e5m2, "
                                             r"e3m2fn, e2m3fn, e2m1fn, int8\)"):
            lowbit.quantize_mx(x, name)
    if got is None:
        return
    codes, scales = got
    assert scales.shape == (3, 2) and scales.dtype == np.uint8
    for r in range(3):
        for j, (c0, c1) in enumerate([(0, 32), (32, 37)]):
            blk = x[r, c0:c1].astype(np.float64)
            amax = np.abs(blk).max() if not np.isnan(blk).any() else np.nan
            if np.isnan(amax):
                assert scales[r, j] == 0xFF
                want = (np.zeros(c1 - c0, np.int8) if name == "int8" else
                        lowbit.cast(np.full(c1 - c0, np.nan, F32), name, saturate=True))
            else:
                s = -127 if amax == 0 else max(-127, min(127, math.frexp(amax)[1] - 1
                                                         - mx_emax(name)))
                assert scales[r, j] == s + 127
                if name == "int8":
                    want = np.clip(np.rint(blk * 2.0 ** (6 - s)), -128, 127).astype(np.int8)
                else:
                    want = lowbit.cast(blk * 2.0 ** -s, name, saturate=True)  # exact in float64
            np.testing.assert_array_equal(codes[r, c0:c1], want)
    out = outcome(name, "dequantize_mx", lambda: lowbit.dequantize_mx(codes, scales, name))
    v = code_values(codes, name) * (2.0 ** -6 if name == "int8" else 1.0)
    s = np.repeat(scales.astype(np.float64), 32, axis=1)[:, :37] - 127
    with np.errstate(over="ignore"):
        want = np.where(np.repeat(scales, 32, axis=1)[:, :37] == 0xFF, np.nan, v * 2.0 ** s)
    same(out, want.astype(F32))


@pytest.mark.parametrize("name", ALL_TARGETS)
def test_dequantize_mx_every_target(name):
    if name in INTS:
        dt = "uint8" if name.startswith("uint") else "int8"
    else:
        dt = lowbit.format_info(name).code_dtype
    codes = np.zeros((2, 32), dt)
    scales = np.full((2, 1), 127, np.uint8)
    out = outcome(name, "dequantize_mx", lambda: lowbit.dequantize_mx(codes, scales, name))
    if out is not None:
        same(out, code_values(codes, name).astype(F32))  # code 0 is zero; scale 2^0


# ---- host-only functions -------------------------------------------------------------------

@pytest.mark.parametrize("name", FORMATS)
def test_codebook_from_format(name):
    cb = outcome(name, "codebook_from_format", lambda: lowbit.Codebook.from_format(name))
    if cb is None:
        return
    bits = lowbit.format_info(name).bits
    v = lowbit.decode(np.arange(1 << bits, dtype=np.uint8), name, "float32")
    v = v[np.isfinite(v)]
    want = set((v / np.abs(v).max()).astype(F32).tolist()) | {0.0}
    got = cb.values
    assert len(got) == 256 and (np.diff(got) >= 0).all()
    assert set(got.tolist()) == want


@pytest.mark.parametrize("name", FORMATS)
def test_verify_codes(name):
    x = sample()
    c = lowbit.cast(x, name, saturate=True)
    r = outcome(name, "verify", lambda: lowbit.verify(c, c, "exact", fmt=name))
    assert r.ok and r.total == c.size
    vs_values = lowbit.verify(c, lowbit.decode(c, name, "float64"), "ulp:0", fmt=name)
    assert vs_values.ok
    bad = c.copy()
    bad.flat[0] = 0 if c.flat[0] != 0 else 1  # x[0, 0] is finite: neither code is a NaN
    assert lowbit.verify(bad, c, "exact", fmt=name).failed == 1


def test_claims_table():
    """The MX claim is exactly the five OCP floating-point formats plus int8, all present in
    lowbit.formats(); no 16-bit format is an MX element."""
    assert {n for n in ALL_TARGETS if CLAIMS["quantize_mx"](n)} == OCP_MX
    assert not CLAIMS["quantize_mx"]("float16") and not CLAIMS["quantize_mx"]("bfloat16")
    assert CLAIMS["quantize"]("bfloat16") and not CLAIMS["quantize"]("tfloat32")
