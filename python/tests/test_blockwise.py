"""Block-wise codebook quantization and SRAM-quantiles against an independent numpy computation
of the equations of docs/techniques/blockwise.md and docs/techniques/sram-quantiles.md.

The oracle normalizes with numpy's float32 division (correctly rounded, as the kernels'), finds
the nearest entry by counting exact midpoints (pair sums of float32 entries are exact in float64
for the codebooks used here, which the oracle asserts) with the documented tie rule, and applies
the zero, NaN/Inf and partial-block rules; codes, absmax values and dequantized values are
compared bit for bit. Codebooks are rebuilt from their definitions with exact fractions; the
dynamic tree map, whose bits are those of its published float32 construction, is read from
proptests/data/dynamic_map_published.txt and held within 2 ulps of its exact definition.
Stochastic rounding is recomputed from the Philox bits (oracle.stream_bits). The quantile
estimator is recomputed with a numpy sort of the total-order keys and float64 sums in chunk
order. PyTorch tests (markers torch, gpu) check the same results through DLPack.
"""

from __future__ import annotations

import pickle
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit import Codebook, NestedAbsmax
from oracle import stream_bits

F32 = np.float32
BLOCKS = [64, 128, 256, 512, 1024, 2048, 4096]
QNAN = 0x7FC00000


# ---- exact float32 rounding and the codebooks by definition --------------------------------------


def f32_of(fr: Fraction) -> np.float32:
    """fr rounded once to the nearest float32 (ties to even), decided with exact fractions."""
    c = np.float32(float(fr))  # within one float32 ulp of fr
    best = c
    for g in (np.nextafter(c, F32(-2)), np.nextafter(c, F32(2))):
        db, dg = abs(Fraction(float(best)) - fr), abs(Fraction(float(g)) - fr)
        if dg < db or (dg == db and int(np.array(g).view(np.uint32)) % 2 == 0):
            best = g
    return F32(best)


def dynamic_tree_oracle(signed: bool) -> np.ndarray:
    v = [F32(0), F32(1)]
    for d in range(6, -1, -1):
        f1 = 2 ** ((6 - d) + (0 if signed else 1))  # F - 1
        for k in range(f1):
            x = f32_of(Fraction(2 * f1 + 9 * (2 * k + 1), 20 * f1 * 10**d))
            v.append(x)
            if signed:
                v.append(-x)
    assert len(v) == 256
    return np.sort(np.array(v, F32))


PUBLISHED_MAP = (Path(__file__).resolve().parents[2] / "proptests" / "data"
                 / "dynamic_map_published.txt")


def published_dynamic_tree(signed: bool) -> np.ndarray:
    """The dynamic tree map's float32 bits as its published construction computes them (the table
    the C++ tests check the kernels against, which PyTorch reproduces)."""
    want = "signed" if signed else "unsigned"
    rows = [line.split() for line in PUBLISHED_MAP.read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.startswith("#")]
    words = [int(h, 16) for kind, i, h in rows if kind == want]
    assert [int(i) for kind, i, _ in rows if kind == want] == list(range(256))
    return np.array(words, np.uint32).view(F32)


def linear_oracle(signed: bool) -> np.ndarray:
    return np.array([f32_of(Fraction(2 * k - 255 if signed else k, 255)) for k in range(256)], F32)


def padded(values) -> np.ndarray:
    v = np.array(values, F32)
    v = np.concatenate([v, np.zeros(256 - v.size, F32)])
    v = np.sort(v)
    return v + F32(0)  # -0 -> +0


def from_format_oracle(ml_type) -> np.ndarray:
    vals = np.arange(256, dtype=np.uint8).view(ml_type).astype(F32)
    vals = np.unique(vals[np.isfinite(vals)] + F32(0))
    m = np.abs(vals).max()
    return padded(np.unique(vals / m))


def bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a, F32)
    return a.view(np.uint32)


def ordered(a) -> np.ndarray:
    """float32 values as integers in the order of the values (adjacent floats differ by 1)."""
    b = np.asarray(a, F32).view(np.int32).astype(np.int64)
    return np.where(b < 0, -(b & 0x7FFFFFFF), b)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == F32 or b.dtype == F32:
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)


# ---- the quantization oracle ---------------------------------------------------------------------


def pair_sums(cb: np.ndarray) -> np.ndarray:
    """c_j + c_{j+1} in float64, asserted exact (so 2t compares with the exact midpoint)."""
    c = cb.astype(np.float64)
    s = c[:-1] + c[1:]
    for j in range(255):
        assert Fraction(float(s[j])) == Fraction(float(c[j])) + Fraction(float(c[j + 1])), j
    return s


def nearest(cb: np.ndarray, t: np.ndarray) -> np.ndarray:
    """#{j : m_j < t} + #{j : m_j = t and m_j <= 0}, on 2t against the exact pair sums."""
    s = pair_sums(cb)
    t2 = 2.0 * np.asarray(t, F32).astype(np.float64)  # exact
    below = np.searchsorted(s, t2, side="left")
    upto = np.searchsorted(s, t2, side="right")
    return (below + np.where(t2 <= 0, upto - below, 0)).astype(np.uint8)


def block_absmax_bits(flat: np.ndarray, block: int) -> np.ndarray:
    n = flat.size
    blocks = -(-n // block)
    mag = np.zeros(blocks * block, np.uint32)
    mag[:n] = bits(flat) & 0x7FFFFFFF
    return mag.reshape(blocks, block).max(axis=1) if blocks else np.zeros(0, np.uint32)


def quantize_oracle(x, cb: np.ndarray, block: int):
    flat = np.asarray(x).astype(F32).ravel()
    n = flat.size
    amax = block_absmax_bits(flat, block)
    poisoned = amax >= 0x7F800000
    a = amax.view(F32)
    ai = np.repeat(a, block)[:n]
    with np.errstate(all="ignore"):
        t = np.where(ai == 0, flat, flat / ai).astype(F32)
    zero = nearest(cb, np.array([0.0], F32))[0]
    codes = np.where(np.repeat(poisoned, block)[:n], zero, nearest(cb, t)).astype(np.uint8)
    stored = np.where(poisoned, np.uint32(QNAN), amax).view(F32)
    return codes.reshape(np.shape(x)), stored


def decode_oracle(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        y = (values.astype(F32) * scale.astype(F32)).astype(F32)
    return np.where(np.isnan(y), np.uint32(QNAN).view(F32), y).astype(F32)


def dequantize_oracle(codes, absmax, cb, block):
    flat = np.asarray(codes).ravel()
    a = np.repeat(np.asarray(absmax, F32), block)[:flat.size]
    return decode_oracle(cb[flat], a).reshape(np.shape(codes))


def sample(rng, n, zeros=0.05, specials=False):
    """Gaussian values over a wide range of magnitudes, some zeros, optional NaN/Inf."""
    x = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(F32)
    x[rng.random(n) < zeros] = 0
    if specials and n:
        for v in (np.nan, np.inf, -np.inf, -0.0):
            x[rng.integers(n)] = v
    return x


DYNAMIC = published_dynamic_tree(True)


# ---- codebooks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("signed", [True, False])
def test_dynamic_tree_values_are_the_published_map(signed):
    cb = Codebook.dynamic_tree(signed)
    assert cb.values.dtype == F32 and cb.values.shape == (256,)
    assert same_bits(cb.values, published_dynamic_tree(signed))
    assert cb == Codebook.of("dynamic" if signed else "dynamic_unsigned")
    # within 2 ulps of the exact map rounded once (positions on the float32 line, signed)
    exact = dynamic_tree_oracle(signed)
    ulps = np.abs(ordered(cb.values) - ordered(exact))
    assert ulps.max() <= 2 and ulps.max() > 0  # the published bits are not the exact ones


def test_dynamic_tree_structure():
    s = Codebook.dynamic_tree().values
    assert np.all(np.diff(s) > 0)
    assert (s == 0).sum() == 1 and (s == 1).sum() == 1 and (s == -1).sum() == 0
    assert s[127] == 0 and s[255] == 1
    assert np.array_equal(s[:127], -s[254:127:-1])  # mirror symmetry, i < 127
    def near(a, b):  # the published bits are within 2 ulps of the decimal values
        return abs(int(ordered(a)) - int(ordered(F32(b)))) <= 2

    assert near(s[0], -0.992968738) and near(s[254], 0.992968738)
    assert near(s[126], -5.5e-7) and near(s[128], 5.5e-7)
    pos = s[128:255]
    for d, count in zip(range(6, -1, -1), [1, 2, 4, 8, 16, 32, 64]):  # per decade
        dec = pos[(pos >= 0.1 * 10.0**-d) & (pos < 10.0**-d)]
        assert dec.size == count
        if count > 1:
            steps = np.diff(dec.astype(np.float64))
            assert np.allclose(steps, 0.9 * 10.0**-d / count, rtol=0, atol=1e-6 * 10.0**-d)
    u = Codebook.dynamic_tree(signed=False).values
    assert u[0] == 0 and u[255] == 1 and np.all(np.diff(u) > 0) and np.all(u >= 0)
    assert near(u[1], 3.25e-7) and near(u[2], 7.75e-7) and near(u[254], 0.996484399)


@pytest.mark.parametrize("signed", [True, False])
def test_linear(signed):
    cb = Codebook.linear(signed=signed)
    assert same_bits(cb.values, linear_oracle(signed))
    if signed:
        assert 0 not in cb.values and cb.values[0] == -1 and cb.values[255] == 1
    else:
        assert cb.values[0] == 0 and cb.values[255] == 1


@pytest.mark.parametrize("name,ml_type,distinct", [
    ("e4m3fn", ml_dtypes.float8_e4m3fn, 253),
    ("e5m2", ml_dtypes.float8_e5m2, 247),
    ("e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 255),
    ("e2m1fn", ml_dtypes.float4_e2m1fn, 15),
])
def test_from_format(name, ml_type, distinct):
    cb = Codebook.from_format(name)
    assert same_bits(cb.values, from_format_oracle(ml_type))
    assert len(np.unique(cb.values)) == distinct
    assert cb == Codebook.from_format(lowbit.parse_format(name))


def test_from_quantiles_and_values():
    q = np.array([-3.0, -1.0, 0.5, 2.0, 6.0], F32)
    cb = Codebook.from_quantiles(q)
    assert same_bits(cb.values, padded(np.append(q / F32(6.0), F32(0))))
    assert Codebook.from_quantiles(q.tolist()) == cb
    assert Codebook.from_quantiles(q.astype(np.float64)) == cb
    v = np.linspace(-1, 1, 256, dtype=F32)
    assert same_bits(Codebook.from_values(v).values, v) and Codebook(v) == Codebook.from_values(v)
    dup = np.sort(np.concatenate([np.zeros(100, F32), np.linspace(-1, 1, 156, dtype=F32)]))
    assert same_bits(Codebook.from_values(dup).values, dup)  # equal neighbours are allowed


def test_codebook_object():
    cb = Codebook.dynamic_tree()
    assert not cb.values.flags.writeable and len(cb) == 256
    assert cb == Codebook.from_values(cb.values) and hash(cb) == hash(Codebook(cb.values))
    assert cb != Codebook.linear() and cb != "dynamic"
    neg_zero = cb.values.copy()
    neg_zero[127] = -0.0
    assert Codebook(neg_zero) == cb and hash(Codebook(neg_zero)) == hash(cb)
    assert "dynamic_tree(signed=True)" in repr(cb) and "-0.992968738" in repr(cb)
    assert "from_format('e4m3fn')" in repr(Codebook.from_format("e4m3fn"))
    assert pickle.loads(pickle.dumps(cb)) == cb
    assert repr(pickle.loads(pickle.dumps(cb))) == repr(cb)


@pytest.mark.parametrize("make,arg,match", [
    (lambda: Codebook.from_values(np.zeros(255, F32)), "v", r"^v: expected exactly 256"),
    (lambda: Codebook.from_values(np.zeros((16, 16), F32)), "v", r"^v: expected a 1-D"),
    (lambda: Codebook.from_values(np.r_[np.zeros(255, F32), F32(np.nan)]), "v",
     r"^v: entry 255 is not finite"),
    (lambda: Codebook.from_values(np.r_[np.zeros(255, F32), F32(1.5)]), "v",
     r"^v: entry 255 .*outside \[-1, 1\]"),
    (lambda: Codebook.from_values(np.r_[F32(0.5), np.zeros(255, F32)]), "v",
     r"^v: entries must be ascending, but entry 1"),
    (lambda: Codebook.from_quantiles([]), "q", r"^q: expected 1\.\.255 quantiles"),
    (lambda: Codebook.from_quantiles(np.ones(256, F32)), "q", r"^q: expected 1\.\.255"),
    (lambda: Codebook.from_quantiles([1.0, np.inf]), "q", r"^q: quantile 1 is not finite"),
    (lambda: Codebook.from_quantiles([0.0, -0.0]), "q", r"^q: every quantile is 0"),
    (lambda: Codebook.from_format("bfloat16"), "fmt", r"^fmt: format bfloat16 has more than"),
    (lambda: Codebook.from_format("e9m9"), "fmt", r"^fmt: "),
    (lambda: Codebook.of("dynamic_signed"), "codebook", r"^codebook 'dynamic_signed': expected"),
])
def test_codebook_validation_errors(make, arg, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_codebook_type_errors():
    with pytest.raises(TypeError, match="^signed: "):
        Codebook.dynamic_tree("yes")
    with pytest.raises(TypeError, match="^codebook: expected a codebook name"):
        lowbit.quantize_blockwise(np.ones(4, F32), codebook=np.zeros(256, F32))
    with pytest.raises(TypeError, match="^v: "):
        Codebook.from_values(["a"] * 256)


# ---- quantization against the oracle -------------------------------------------------------------


CODEBOOKS = {
    "dynamic": lambda: Codebook.dynamic_tree(True),
    "dynamic_unsigned": lambda: Codebook.dynamic_tree(False),
    "linear": lambda: Codebook.linear(True),
    "linear_unsigned": lambda: Codebook.linear(False),
    "e4m3fn": lambda: Codebook.from_format("e4m3fn"),
    "e2m1fn": lambda: Codebook.from_format("e2m1fn"),
    "quantiles": lambda: Codebook.from_quantiles(np.linspace(-2, 3, 200, dtype=F32) ** 3),
}


@pytest.mark.parametrize("block", BLOCKS)
def test_quantize_matches_oracle_all_blocks(block):
    rng = np.random.default_rng(block)
    cb = DYNAMIC
    for shape in [(1,), (block,), (block + 1,), (3, block // 2 + 5), (2, 3, 7 * block // 5),
                  (rng.integers(1, 3 * block),), (rng.integers(1, 9), rng.integers(1, 700))]:
        n = int(np.prod(shape))
        x = sample(rng, n, specials=(n > 100)).reshape(shape)
        codes, absmax = lowbit.quantize_blockwise(x, "dynamic", block)
        want_codes, want_absmax = quantize_oracle(x, cb, block)
        assert codes.dtype == np.uint8 and codes.shape == x.shape
        assert absmax.shape == (-(-n // block),)
        assert same_bits(codes, want_codes) and same_bits(absmax, want_absmax)
        back = lowbit.dequantize_blockwise(codes, absmax, "dynamic", block)
        assert same_bits(back, dequantize_oracle(codes, absmax, cb, block))


@pytest.mark.parametrize("name", sorted(CODEBOOKS))
@pytest.mark.parametrize("block", [64, 256, 4096])
def test_quantize_matches_oracle_all_codebooks(name, block):
    cb = CODEBOOKS[name]()
    rng = np.random.default_rng(len(name) * block)
    x = sample(rng, 3 * block + 17, specials=True)
    if name.endswith("unsigned"):
        x = np.abs(x)
    codes, absmax = lowbit.quantize_blockwise(x, cb, block)
    want_codes, want_absmax = quantize_oracle(x, cb.values, block)
    assert same_bits(codes, want_codes) and same_bits(absmax, want_absmax)
    assert same_bits(lowbit.dequantize_blockwise(codes, absmax, cb, block),
                     dequantize_oracle(codes, absmax, cb.values, block))


@pytest.mark.parametrize("name", ["dynamic", "linear", "e4m3fn", "e2m1fn"])
def test_ties_and_exact_entries(name):
    """Every representable midpoint and every entry, in a block whose absmax is 1 (t = x)."""
    cb = CODEBOOKS[name]().values
    mids = (cb[:-1].astype(np.float64) + cb[1:]) / 2
    mids = mids[mids.astype(F32) == mids].astype(F32)  # the midpoints that are float32 values
    x = np.concatenate([[F32(1.0)], mids, cb, -cb, np.nextafter(mids, F32(2)),
                        np.nextafter(mids, F32(-2)), [F32(0.0), F32(-0.0)]]).astype(F32)
    x = x[np.abs(x) <= 1]
    x = np.concatenate([x, np.zeros(-x.size % 64, F32)])
    x[::64] = 1.0  # every block of 64 has absmax 1
    codes, absmax = lowbit.quantize_blockwise(x, CODEBOOKS[name](), 64)
    assert np.all(absmax == 1)
    assert same_bits(codes, nearest(cb, x))
    # the tie rule, spelled out: smaller magnitude; at a zero midpoint the positive entry
    for j in np.flatnonzero((cb[:-1].astype(np.float64) + cb[1:]) / 2 ==
                            ((cb[:-1].astype(np.float64) + cb[1:]) / 2).astype(F32)):
        m = F32((np.float64(cb[j]) + cb[j + 1]) / 2)
        if cb[j] == cb[j + 1]:
            continue
        one = np.array([m] + [1.0] * 63, F32)
        c = cb[lowbit.quantize_blockwise(one, CODEBOOKS[name](), 64)[0][0]]
        if m == 0:
            assert c == cb[j + 1] and c > 0
        else:
            assert c in (cb[j], cb[j + 1]) and abs(c) == min(abs(cb[j]), abs(cb[j + 1]))


def test_zero_nan_inf_and_partial_blocks():
    zero_code = int(nearest(DYNAMIC, np.zeros(1, F32))[0])
    assert DYNAMIC[zero_code] == 0
    x = np.zeros(64 * 5 + 10, F32)
    x[64:128] = np.linspace(-1, 1, 64)
    x[64 + 3] = -0.0
    x[128 + 7] = np.nan
    x[128 + 9] = 2.0
    x[192] = np.inf
    x[256 + 5] = -np.inf
    x[320:] = np.arange(10, dtype=F32) - 4  # partial last block: absmax over its 10 elements
    codes, absmax = lowbit.quantize_blockwise(x, "dynamic", 64)
    assert absmax.shape == (6,) and absmax[0] == 0 and absmax[1] == 1 and absmax[5] == 5
    assert np.all(bits(absmax[2:5]) == QNAN)  # NaN, +Inf and -Inf blocks are poisoned
    assert np.all(codes[:64] == zero_code) and np.all(codes[128:320] == zero_code)
    back = lowbit.dequantize_blockwise(codes, absmax, "dynamic", 64)
    assert np.all(back[:64] == 0) and np.all(bits(back[128:320]) == QNAN)
    assert same_bits(codes, quantize_oracle(x, DYNAMIC, 64)[0])
    assert same_bits(back, dequantize_oracle(codes, absmax, DYNAMIC, 64))
    assert back[329] == 5 and DYNAMIC[codes[329]] == 1  # t = 1 in the partial block
    # an all -0 block: codes nearest(+0), dequantized +-0
    c2, a2 = lowbit.quantize_blockwise(np.full(64, -0.0, F32), "dynamic", 64)
    assert a2[0] == 0 and np.all(c2 == zero_code)
    # empty and 0-d inputs
    c3, a3 = lowbit.quantize_blockwise(np.zeros((0, 5), F32))
    assert c3.shape == (0, 5) and a3.shape == (0,)
    assert lowbit.dequantize_blockwise(c3, a3).shape == (0, 5)
    c4, a4 = lowbit.quantize_blockwise(np.float32(-0.25))
    assert c4.shape == () and a4.tolist() == [0.25] and int(c4) == 0  # t = -1: the lowest entry


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_inputs_are_widened_exactly(dtype):
    rng = np.random.default_rng(7)
    x = sample(rng, 1000).astype(dtype)
    codes, absmax = lowbit.quantize_blockwise(x, "dynamic", 256)
    want_codes, want_absmax = quantize_oracle(x.astype(F32), DYNAMIC, 256)
    assert same_bits(codes, want_codes) and same_bits(absmax, want_absmax)


def test_list_input_and_threads():
    x = [0.5, -1.0, 0.25, 0.0]
    codes, absmax = lowbit.quantize_blockwise(x, block=64)
    assert same_bits(codes, quantize_oracle(np.array(x, F32), DYNAMIC, 64)[0])
    y = sample(np.random.default_rng(1), 100000)
    one = lowbit.quantize_blockwise(y, block=128, threads=1)
    many = lowbit.quantize_blockwise(y, block=128, threads=0)
    assert same_bits(one[0], many[0]) and same_bits(one[1], many[1])


# ---- nested absmax -------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [64, 2048])
def test_nested_absmax_matches_oracle(block):
    rng = np.random.default_rng(block + 1)
    n = block * 600 + 33  # 601 blocks: 3 nested blocks, the last partial
    x = sample(rng, n)
    x[5 * block + 2] = np.nan  # poisons nested block 0
    codes, nested = lowbit.quantize_blockwise(x, "dynamic", block, nested=True)
    plain_codes, absmax = lowbit.quantize_blockwise(x, "dynamic", block)
    assert isinstance(nested, NestedAbsmax) and nested.codebook == Codebook.dynamic_tree(False)
    assert same_bits(codes, plain_codes)  # elements use the exact absmax
    cb2 = published_dynamic_tree(False)
    want2_codes, want2_absmax = quantize_oracle(absmax, cb2, 256)
    assert nested.codes.shape == (601,) and nested.absmax.shape == (3,)
    assert same_bits(nested.codes, want2_codes) and same_bits(nested.absmax, want2_absmax)
    assert np.isnan(nested.absmax[0]) and np.all(np.isfinite(nested.absmax[1:]))
    a = dequantize_oracle(nested.codes, nested.absmax, cb2, 256)
    back = lowbit.dequantize_blockwise(codes, nested, "dynamic", block)
    assert same_bits(back, dequantize_oracle(codes, a, DYNAMIC, block))
    g = rng.standard_normal(n).astype(F32)
    _, gn = lowbit.quantize_blockwise(g, "dynamic", block, nested=True)
    exact = lowbit.quantize_blockwise(g, "dynamic", block)[1]
    approx = dequantize_oracle(gn.codes, gn.absmax, cb2, 256)
    assert np.max(np.abs(approx - exact) / exact) < 0.01  # docs: within 0.72 % on Gaussian data
    lin = Codebook.linear(False)
    _, n2 = lowbit.quantize_blockwise(x, "dynamic", block, nested=True, nested_codebook=lin)
    assert n2.codebook == lin and same_bits(n2.codes, quantize_oracle(absmax, lin.values, 256)[0])


# ---- stochastic rounding -------------------------------------------------------------------------


def stochastic_oracle(x, cb, block, seed, offset):
    flat = np.asarray(x, F32).ravel()
    amax = block_absmax_bits(flat, block).view(F32)
    out = []
    for i, xi in enumerate(flat):
        a = amax[i // block]
        t = xi if a == 0 else F32(xi / a)
        n = int(np.sum(cb <= t))
        if n == 0:
            out.append(0)
            continue
        if n == 256:
            out.append(255)
            continue
        lo, hi = cb[n - 1], cb[n]
        tau = F32(F32(t - lo) / F32(hi - lo))
        f = int(F32(tau * F32(2**24)))
        r = stream_bits(seed, offset, i) >> 8
        out.append(n if f + r >= 2**24 else n - 1)
    return np.array(out, np.uint8)


@pytest.mark.parametrize("seed,offset", [(0, 0), (1234, 0), (2**64 - 1, 2**40 + 3)])
def test_stochastic_matches_philox_oracle(seed, offset):
    rng = np.random.default_rng(seed % 1000)
    x = sample(rng, 300)
    codes, absmax = lowbit.quantize_blockwise(x, "dynamic", 64, rounding="stochastic",
                                              seed=seed, offset=offset)
    assert same_bits(codes, stochastic_oracle(x, DYNAMIC, 64, seed, offset))
    assert same_bits(absmax, quantize_oracle(x, DYNAMIC, 64)[1])


def test_stochastic_gives_only_the_two_neighbours_and_is_reproducible():
    rng = np.random.default_rng(3)
    x = sample(rng, 50000)
    cb = DYNAMIC
    c1, a1 = lowbit.quantize_blockwise(x, "dynamic", 256, rounding="stochastic", seed=5)
    c2, _ = lowbit.quantize_blockwise(x, "dynamic", 256, rounding="stochastic", seed=5)
    c3, _ = lowbit.quantize_blockwise(x, "dynamic", 256, rounding="stochastic", seed=6)
    c4, _ = lowbit.quantize_blockwise(x, "dynamic", 256, rounding="stochastic", seed=5, offset=1)
    assert np.array_equal(c1, c2) and not np.array_equal(c1, c3) and not np.array_equal(c1, c4)
    a = np.repeat(a1, 256)[:x.size]
    t = np.where(a == 0, x, x / a).astype(F32)
    lo_idx = np.searchsorted(cb, t, side="right") - 1  # last entry <= t
    lo = cb[np.clip(lo_idx, 0, 255)]
    hi = cb[np.clip(lo_idx + 1, 0, 255)]
    got = cb[c1]
    assert np.all((got == lo) | (got == hi))
    assert np.all(got[t == lo] == t[t == lo])  # on an entry: that entry
    nearest_codes = lowbit.quantize_blockwise(x, "dynamic", 256)[0]
    assert 0.1 < np.mean(c1 != nearest_codes) < 0.5  # really stochastic
    # unbiased on average: mean of cb[code] over many seeds approaches t
    t0 = np.full(64, F32(0.3), F32)
    t0[0] = 1
    draws = np.stack([cb[lowbit.quantize_blockwise(t0, "dynamic", 64, rounding="stochastic",
                                                   seed=s)[0][1:]] for s in range(64)])
    assert abs(draws.mean() - 0.3) < 5 * draws.std() / np.sqrt(draws.size)


# ---- SRAM-quantiles ------------------------------------------------------------------------------


def order_keys(x: np.ndarray) -> np.ndarray:
    b = bits(x)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def key_values(k: np.ndarray) -> np.ndarray:
    b = np.where(k & 0x80000000, k & 0x7FFFFFFF, ~k).astype(np.uint32)
    return b.view(F32)


def quantiles_oracle(x, k: int) -> np.ndarray:
    # The definition's order: products summed in chunk order within groups of 256 chunks, then
    # the group sums in group order.
    flat = np.asarray(x).astype(F32).ravel()
    n = flat.size
    acc = np.zeros(k, np.float64)
    for g0 in range(0, n, 256 * 4096):
        group = np.zeros(k, np.float64)
        for c0 in range(g0, min(n, g0 + 256 * 4096), 4096):
            chunk = flat[c0:c0 + 4096]
            m = chunk.size
            s = key_values(np.sort(order_keys(chunk)))
            pos = ((2 * np.arange(k) + 1) * m) // (2 * k)
            with np.errstate(all="ignore"):
                group = group + np.float64(m) * s[pos].astype(np.float64)
        with np.errstate(all="ignore"):
            acc = acc + group
    with np.errstate(all="ignore"):
        return (acc / n).astype(F32)


@pytest.mark.parametrize("n", [1, 5, 4095, 4096, 4097, 3 * 4096 + 5, 50000])
@pytest.mark.parametrize("k", [1, 7, 255, 256, 4096])
def test_estimate_quantiles_matches_oracle(n, k):
    rng = np.random.default_rng(n * 31 + k)
    x = sample(rng, n)
    q = lowbit.estimate_quantiles(x, k)
    assert q.dtype == F32 and q.shape == (k,)
    assert same_bits(q, quantiles_oracle(x, k))
    if n <= 4096:  # one chunk: the exact order statistics
        pos = ((2 * np.arange(k) + 1) * n) // (2 * k)
        assert same_bits(q, np.sort(x)[pos])


def test_estimate_quantiles_specials_and_dtypes():
    rng = np.random.default_rng(11)
    x = sample(rng, 9000, zeros=0.2, specials=True)
    x[100] = -np.nan
    assert same_bits(lowbit.estimate_quantiles(x, 64), quantiles_oracle(x, 64))
    for dtype in (np.float16, ml_dtypes.bfloat16):
        h = sample(rng, 10000).astype(dtype)
        assert same_bits(lowbit.estimate_quantiles(h, 100), quantiles_oracle(h.astype(F32), 100))
    y = sample(rng, 20000).reshape(4, 5000)
    assert same_bits(lowbit.estimate_quantiles(y, 9, threads=1), quantiles_oracle(y, 9))
    # accuracy on Gaussian data (docs: max rank error ~ 3e-4 at n = 2^20)
    g = rng.standard_normal(1 << 17).astype(F32)
    est = lowbit.estimate_quantiles(g, 256).astype(np.float64)
    srt = np.sort(g)
    p = (2 * np.arange(256) + 1) / 512
    rank = (np.searchsorted(srt, est, "left") + np.searchsorted(srt, est, "right")) / (2 * g.size)
    assert np.abs(rank - p).max() < 0.002


def test_quantile_codebook():
    rng = np.random.default_rng(12)
    x = rng.standard_normal(30000).astype(F32)
    cb = lowbit.quantile_codebook(x)
    assert cb == Codebook.from_quantiles(lowbit.estimate_quantiles(x, 255))
    q = quantiles_oracle(x, 255)
    assert same_bits(cb.values, padded(np.append(q / np.abs(q).max(), F32(0))))
    codes, absmax = lowbit.quantize_blockwise(x, cb, 2048)
    assert same_bits(codes, quantize_oracle(x, cb.values, 2048)[0])
    # a quantile map uses its codes about evenly on the data it was made from
    counts = np.bincount(lowbit.quantize_blockwise(x, cb, 4096)[0].ravel(), minlength=256)
    assert counts.max() < 8 * x.size / 256


# ---- argument errors -----------------------------------------------------------------------------


def test_errors():
    x = np.ones(100, F32)
    with pytest.raises(ValueError, match=r"^block: must be one of 64, 128"):
        lowbit.quantize_blockwise(x, block=100)
    with pytest.raises(TypeError, match="^block: expected an integer"):
        lowbit.quantize_blockwise(x, block=64.0)
    with pytest.raises(ValueError, match="^rounding 'up': expected one of nearest_toward_zero, stochastic"):
        lowbit.quantize_blockwise(x, rounding="up")
    with pytest.raises(ValueError, match="^seed: "):
        lowbit.quantize_blockwise(x, rounding="stochastic", seed=-1)
    with pytest.raises(TypeError, match="^x: dtype int64 is not supported"):
        lowbit.quantize_blockwise(np.ones(10, np.int64))
    with pytest.raises(TypeError, match="^x: dtype float64 is not supported"):
        lowbit.quantize_blockwise(np.ones(10))
    with pytest.raises(ValueError, match="^x must be contiguous"):
        lowbit.quantize_blockwise(np.ones((10, 10), F32)[:, ::2])
    with pytest.raises(TypeError, match="^nested: expected True or False"):
        lowbit.quantize_blockwise(x, nested=1)
    codes, absmax = lowbit.quantize_blockwise(x, block=64)
    with pytest.raises(TypeError, match="^codes: dtype int8 does not hold codebook indices"):
        lowbit.dequantize_blockwise(codes.view(np.int8), absmax, block=64)
    with pytest.raises(ValueError, match=r"^absmax: expected 1 elements \(one per block\)"):
        lowbit.dequantize_blockwise(codes, absmax, block=128)
    with pytest.raises(ValueError, match="^dtype 'float64': expected float32"):
        lowbit.dequantize_blockwise(codes, absmax, block=64, dtype="float64")
    _, nested = lowbit.quantize_blockwise(x, block=64, nested=True)
    with pytest.raises(ValueError, match=r"^nested.codes: expected 1 elements"):
        lowbit.dequantize_blockwise(np.zeros(100, np.uint8), nested, block=128)
    with pytest.raises(ValueError, match=r"^k: expected 1\.\.4096 quantiles"):
        lowbit.estimate_quantiles(x, 0)
    with pytest.raises(ValueError, match=r"^k: expected 1\.\.255"):
        lowbit.quantile_codebook(x, 256)
    with pytest.raises(ValueError, match="^x: quantiles of an empty tensor are undefined"):
        lowbit.estimate_quantiles(np.zeros(0, F32))
    with pytest.raises(ValueError, match="^threads: "):
        lowbit.estimate_quantiles(x, threads=-1)


def test_block_list_matches_the_kernels():
    assert [b for b in range(1, 8193) if lowbit._core.is_blockwise_block(b)] == BLOCKS


# ---- PyTorch -------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


def np_of(t):
    return t.detach().cpu().numpy()


@pytest.mark.torch
def test_torch_cpu_tensors():
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 1000, generator=g)
    codes, absmax = lowbit.quantize_blockwise(x, "dynamic", 256)
    assert isinstance(codes, torch.Tensor) and codes.dtype == torch.uint8
    assert codes.shape == x.shape and absmax.dtype == torch.float32 and absmax.shape == (12,)
    want_codes, want_absmax = lowbit.quantize_blockwise(np_of(x), "dynamic", 256)
    assert same_bits(np_of(codes), want_codes) and same_bits(np_of(absmax), want_absmax)
    back = lowbit.dequantize_blockwise(codes, absmax, "dynamic", 256)
    assert isinstance(back, torch.Tensor) and same_bits(np_of(back),
                                                        dequantize_oracle(want_codes, want_absmax,
                                                                          DYNAMIC, 256))
    for dtype in (torch.float16, torch.bfloat16):
        xs = x.to(dtype)
        got = lowbit.quantize_blockwise(xs, "dynamic", 256)[0]
        assert same_bits(np_of(got), quantize_oracle(np_of(xs.float()), DYNAMIC, 256)[0])
    xg = x.clone().requires_grad_(True)
    assert same_bits(np_of(lowbit.quantize_blockwise(xg, "dynamic", 256)[0]), want_codes)
    q = lowbit.estimate_quantiles(x, 255)
    assert isinstance(q, torch.Tensor) and same_bits(np_of(q), quantiles_oracle(np_of(x), 255))
    assert Codebook.from_quantiles(q) == Codebook.from_quantiles(np_of(q))
    assert lowbit.quantile_codebook(x) == lowbit.quantile_codebook(np_of(x))
    codes_n, nested = lowbit.quantize_blockwise(x, "dynamic", 64, nested=True)
    assert isinstance(nested.codes, torch.Tensor) and isinstance(nested.absmax, torch.Tensor)
    back_n = lowbit.dequantize_blockwise(codes_n, nested, "dynamic", 64)
    np_codes, np_nested = lowbit.quantize_blockwise(np_of(x), "dynamic", 64, nested=True)
    assert same_bits(np_of(back_n), lowbit.dequantize_blockwise(np_codes, np_nested, "dynamic", 64))


@pytest.mark.gpu
def test_cuda_tensors_equal_the_cpu_bit_for_bit():
    torch = _torch()
    g = torch.Generator().manual_seed(1)
    host = torch.randn(5, 3001, generator=g) * torch.exp(torch.rand(5, 3001, generator=g) * 8 - 4)
    host[1, 7] = float("nan")
    for block in BLOCKS:
        for rounding in ("nearest_toward_zero", "stochastic"):
            want = lowbit.quantize_blockwise(np_of(host), "dynamic", block, rounding=rounding,
                                             seed=9)
            x = host.cuda()
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                codes, absmax = lowbit.quantize_blockwise(x, "dynamic", block, rounding=rounding,
                                                          seed=9)
                back = lowbit.dequantize_blockwise(codes, absmax, "dynamic", block)
            side.synchronize()
            assert codes.is_cuda and absmax.is_cuda and back.is_cuda
            assert same_bits(np_of(codes), want[0]) and same_bits(np_of(absmax), want[1])
            assert same_bits(np_of(back),
                             lowbit.dequantize_blockwise(want[0], want[1], "dynamic", block))
    x = host.cuda().to(torch.bfloat16)
    codes, nested = lowbit.quantize_blockwise(x, "linear", 64, nested=True)
    want_codes, want_nested = lowbit.quantize_blockwise(np_of(x.float()), "linear", 64,
                                                        nested=True)
    assert same_bits(np_of(codes), want_codes)
    assert same_bits(np_of(nested.codes), want_nested.codes)
    assert same_bits(np_of(nested.absmax), want_nested.absmax)
    back = lowbit.dequantize_blockwise(codes, nested, "linear", 64)
    torch.cuda.synchronize()
    assert same_bits(np_of(back), lowbit.dequantize_blockwise(want_codes, want_nested, "linear",
                                                              64))


@pytest.mark.gpu
def test_cuda_estimate_quantiles_equals_the_cpu():
    torch = _torch()
    g = torch.Generator().manual_seed(2)
    host = torch.randn(70000, generator=g)
    host[17] = float("inf")
    for k in (1, 255, 256, 4096):
        q = lowbit.estimate_quantiles(host.cuda(), k)
        assert q.is_cuda and q.shape == (k,)
        assert same_bits(np_of(q), quantiles_oracle(np_of(host), k))
    cb = lowbit.quantile_codebook(host.cuda())
    assert cb == lowbit.quantile_codebook(np_of(host))
