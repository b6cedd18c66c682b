"""lowbit.scaled_matmul against independent numpy computations.

int8 operands: the exact int64 matmul of the codes, then the epilogue as float32 numpy operations
in the rule's order (gemm_rule.scaled: acc * (sa * sb) for scalar scales, (acc * sb) * sa for
per-row ones, then + bias; numpy rounds each one to nearest-even and never fuses them), then the
output rounding by ml_dtypes / numpy: bit-equal.
fp8 and 16-bit operands: the values decoded by ml_dtypes, multiplied in float64, within the
bound of a float32 sum of K exact products in any order (gamma_{K+2} * sum |a_i b_i| |sa sb|
plus one rounding of the result: stated at `fp_bound`). Torch tensors (CPU, marker torch; CUDA,
marker gpu) give the numpy results bit for bit where the backend is bit-identical to the CPU
twin (every int8 backend; simt for the others)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import lowbit

import gemm_rule

ml_dtypes = pytest.importorskip("ml_dtypes")

F32 = np.float32
U = 2.0**-24  # unit roundoff of float32
OUT_DTYPES = {"float32": np.dtype(F32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
              "float16": np.dtype(np.float16)}


def rng(seed):
    return np.random.default_rng(seed)


def int8_codes(shape, seed, sym=False):
    lo = -127 if sym else -128
    return rng(seed).integers(lo, 128, size=shape, dtype=np.int8)


def scales_of(kind, rows, seed):
    """None, a one-element scale, or one per row; positive float32 spanning a few binades."""
    if kind == "none":
        return None
    n = 1 if kind == "tensor" else rows
    return (rng(seed).uniform(0.5, 1.0, n) * 2.0 ** rng(seed + 1).integers(-12, 4, n)).astype(F32)


def bias_of(kind, n, seed):
    if kind == "none":
        return None
    b = (rng(seed).standard_normal(n) * 100).astype(F32)
    return b if kind == "float32" else b.astype(OUT_DTYPES[kind])


def epilogue(acc, sa, sb, bias, out_dtype):
    """The rule's epilogue (gemm_rule.scaled), then out's rounding."""
    v = gemm_rule.scaled(acc, sa, sb, bias)
    with np.errstate(over="ignore"):  # float16 results may overflow to Inf, as the kernels'
        return v.astype(OUT_DTYPES[out_dtype])


def bits(x):
    x = np.asarray(x)
    return x.view(f"u{x.itemsize}")


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(bits(a), bits(b))


def int8_ref(a, b, sa, sb, bias, out_dtype):
    a2 = a.reshape(-1, a.shape[-1]).astype(np.int64)
    acc = a2 @ b.astype(np.int64).T
    assert np.abs(acc).max(initial=0) < 2**31
    out = epilogue(acc, sa, sb, bias, out_dtype)
    return out.reshape(*a.shape[:-1], b.shape[0])


# ---- int8: bit-exact ---------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int8", "int8_sym"])
@pytest.mark.parametrize("a_scale", ["none", "tensor", "rows"])
@pytest.mark.parametrize("b_scale", ["none", "tensor", "rows"])
@pytest.mark.parametrize("bias", ["none", "float32", "bfloat16", "float16"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16", "float16"])
def test_int8_is_bit_exact(fmt, a_scale, b_scale, bias, out_dtype):
    sym = fmt == "int8_sym"
    seed = zlib.crc32(f"{fmt} {a_scale} {b_scale} {bias} {out_dtype}".encode()) % 1000
    a = int8_codes((2, 5, 67), seed, sym)  # leading dimensions collapse into M = 10
    b = int8_codes((9, 67), seed + 1, sym)
    sa, sb = scales_of(a_scale, 10, seed + 2), scales_of(b_scale, 9, seed + 3)
    bv = bias_of(bias, 9, seed + 4)
    if out_dtype == "float16" and (sa is None or sb is None):
        # keep float16 results finite: unscaled int8 sums of 67 products reach 1e6
        sa = scales_of("tensor", 10, seed + 5) * F32(2.0**-8)
    got = lowbit.scaled_matmul(a, b, a_fmt=fmt, b_fmt=fmt, a_scales=sa, b_scales=sb, bias=bv,
                               out_dtype=out_dtype)
    want = int8_ref(a, b, sa, sb, bv, out_dtype)
    assert same_bits(got, want)


def test_int8_large_k_and_extreme_codes():
    # K near the exactness limit, every code at an extreme: the int32 sum is exact, its float32
    # conversion rounds (it exceeds 2^24).
    k = 131071
    a = np.full((2, k), -128, np.int8)
    a[1, ::3] = 127
    b = np.full((3, k), -128, np.int8)
    b[2] = 127
    sa = np.array([1.0, 0.5], F32)
    got = lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=sa)
    assert same_bits(got, int8_ref(a, b, sa, None, None, "float32"))
    assert not np.array_equal(got, (a.astype(np.int64) @ b.astype(np.int64).T) * sa[:, None])
    # int8_sym codes made elsewhere may hold -128: the same limit keeps them exact, one more K
    # is refused (at 133143 such codes overflowed int32 silently).
    got = lowbit.scaled_matmul(a, b, a_fmt="int8_sym", b_fmt="int8_sym", a_scales=sa)
    assert same_bits(got, int8_ref(a, b, sa, None, None, "float32"))
    wide = np.full((1, k + 1), -128, np.int8)
    with pytest.raises(ValueError, match="K = 131072 exceeds 131071"):
        lowbit.scaled_matmul(wide, wide, a_fmt="int8_sym", b_fmt="int8_sym")


def test_python_float_scales_and_strided_rows():
    big = int8_codes((8, 40), 3)
    a = big[::2, :32]  # strided rows, contiguous K
    b = int8_codes((5, 32), 4)
    got = lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=0.25, b_scales=3.0)
    want = int8_ref(np.ascontiguousarray(a), b, np.array([0.25], F32), np.array([3.0], F32),
                    None, "float32")
    assert same_bits(got, want)


def test_out_is_written_and_returned():
    a, b = int8_codes((4, 16), 5), int8_codes((3, 16), 6)
    bias = np.arange(3, dtype=F32)
    big = np.full((4, 8), 7.0, F32)
    out = big[:, :3]  # rows strided, N contiguous
    assert lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", bias=bias, out=out) is out
    assert same_bits(big[:, :3], int8_ref(a, b, None, None, bias, "float32"))
    assert (big[:, 3:] == 7.0).all()
    # out_dtype follows out when left out
    half = np.empty((4, 3), np.float16)
    lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=0.01, out=half)
    assert same_bits(half, int8_ref(a, b, np.array([0.01], F32), None, None, "float16"))


def test_bfloat16_results_are_ml_dtypes_arrays():
    a, b = int8_codes((2, 8), 7), int8_codes((2, 8), 8)
    got = lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", out_dtype="bfloat16")
    assert got.dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize("bias", [None, np.array([1.5, -2.25, 3.0], F32)])
def test_empty_problems(bias):
    want = np.zeros(3, F32) if bias is None else bias
    for m, k in ((0, 8), (4, 0)):
        a, b = np.zeros((m, k), np.int8), np.zeros((3, k), np.int8)
        got = lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", bias=bias)
        assert got.shape == (m, 3) and got.dtype == F32
        assert same_bits(got, np.broadcast_to(want, (m, 3)))


def test_nan_and_inf_scales_reach_their_rows_only():
    a, b = int8_codes((3, 16), 9), int8_codes((4, 16), 10)
    sa = np.array([1.0, np.nan, 1.0], F32)
    sb = np.array([1.0, 1.0, np.inf, 1.0], F32)
    got = lowbit.scaled_matmul(a, b, a_fmt="int8", b_fmt="int8", a_scales=sa, b_scales=sb)
    assert np.isnan(got[1]).all()
    want = int8_ref(a, b, sa, sb, None, "float32")
    assert same_bits(got, want)  # Inf * acc: +-Inf, or NaN where acc is 0, as in numpy
    assert np.isfinite(np.delete(np.delete(got, 1, 0), 2, 1)).all()


# ---- fp8 and 16-bit: within the bound of a float32 sum -------------------------------------------


def fp_codes(fmt, shape, seed):
    """Codes of every finite value of fmt (no NaN, and no Inf for e5m2), as raw uint8 codes."""
    dt = getattr(ml_dtypes, "float8_" + fmt)
    codes = rng(seed).integers(0, 256, size=shape, dtype=np.uint8)
    values = codes.view(dt).astype(np.float64)
    codes[~np.isfinite(values)] = 0x38  # 1.0 in e4m3fn, 0.5 in e5m2
    return codes


def fp_bound(a_vals, b_vals, sa, sb, bias, ref):
    k = a_vals.shape[-1]
    gamma = (k + 2) * U / (1 - (k + 2) * U)
    scale = np.ones((1, 1)) if sa is None else np.asarray(sa, np.float64).reshape(-1, 1)
    scale = scale * (1.0 if sb is None else np.asarray(sb, np.float64).reshape(1, -1))
    p = (np.abs(a_vals) @ np.abs(b_vals).T) * np.abs(scale)
    return gamma * p * (1 + U) + U * np.abs(ref) + np.finfo(F32).smallest_subnormal


def fp_ref(a_vals, b_vals, sa, sb, bias):
    ref = a_vals @ b_vals.T
    if sa is not None:
        ref = ref * np.asarray(sa, np.float64).reshape(-1, 1)
    if sb is not None:
        ref = ref * np.asarray(sb, np.float64).reshape(1, -1)
    if bias is not None:
        ref = ref + np.asarray(bias, np.float64)
    return ref


@pytest.mark.parametrize("a_fmt, b_fmt", [("e4m3fn", "e4m3fn"), ("e4m3fn", "e5m2"),
                                          ("e5m2", "e4m3fn"), ("e5m2", "e5m2")])
@pytest.mark.parametrize("scaled", [False, True])
def test_fp8_within_the_float32_sum_bound(a_fmt, b_fmt, scaled):
    m, n, k = 7, 6, 300
    a, b = fp_codes(a_fmt, (m, k), 11), fp_codes(b_fmt, (n, k), 12)
    av = a.view(getattr(ml_dtypes, "float8_" + a_fmt)).astype(np.float64)
    bv = b.view(getattr(ml_dtypes, "float8_" + b_fmt)).astype(np.float64)
    sa = scales_of("rows", m, 13) if scaled else None
    sb = scales_of("tensor", n, 14) if scaled else None
    bias = (rng(15).standard_normal(n) * 10).astype(F32)
    got = lowbit.scaled_matmul(a, b, a_fmt=a_fmt, b_fmt=b_fmt, a_scales=sa, b_scales=sb,
                               bias=bias)
    ref = fp_ref(av, bv, sa, sb, bias)
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= fp_bound(av, bv, sa, sb, bias, ref)).all(), err.max()
    # typed codes (ml_dtypes float8 arrays) name their format and give the same bits
    typed = lowbit.scaled_matmul(a.view(getattr(ml_dtypes, "float8_" + a_fmt)),
                                 b.view(getattr(ml_dtypes, "float8_" + b_fmt)), a_fmt=None,
                                 b_fmt=None, a_scales=sa, b_scales=sb, bias=bias)
    assert same_bits(typed, got)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_16bit_values_within_the_float32_sum_bound(fmt):
    dt = OUT_DTYPES[fmt]
    a = (rng(16).standard_normal((5, 129))).astype(dt)
    b = (rng(17).standard_normal((4, 129))).astype(dt)
    av, bv = a.astype(np.float64), b.astype(np.float64)
    got = lowbit.scaled_matmul(a, b, a_fmt=fmt, b_fmt=fmt)
    ref = fp_ref(av, bv, None, None, None)
    assert (np.abs(got - ref) <= fp_bound(av, bv, None, None, None, ref)).all()


def test_fp8_nan_code_makes_its_row_and_column_nan():
    a, b = fp_codes("e4m3fn", (3, 8), 18), fp_codes("e4m3fn", (4, 8), 19)
    a[1, 5] = 0x7F  # e4m3fn NaN
    got = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn")
    assert np.isnan(got[1]).all() and np.isfinite(np.delete(got, 1, 0)).all()


# ---- errors name the argument --------------------------------------------------------------------

A8, B8 = np.ones((3, 4), np.int8), np.ones((2, 4), np.int8)


@pytest.mark.parametrize("call, exc, message", [
    (lambda: lowbit.scaled_matmul(A8, np.ones((2, 5), np.int8), a_fmt="int8", b_fmt="int8"),
     ValueError, r"^b: K \(the last dimension\) is 5 but a has K 4"),
    (lambda: lowbit.scaled_matmul(A8.astype(F32), B8, a_fmt="int8", b_fmt="int8"), TypeError,
     r"^a: dtype float32 is not supported"),
    (lambda: lowbit.scaled_matmul(A8, B8.astype(np.int16), a_fmt="int8", b_fmt="int8"),
     TypeError, r"^b: dtype int16 is not supported"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="e4m3fn", b_fmt="e4m3fn"), TypeError,
     r"^a: dtype int8"),
    (lambda: lowbit.scaled_matmul(A8.view(np.uint8), B8, a_fmt="e4m3fn", b_fmt="int8"),
     ValueError, r"^b_fmt: int8 cannot be multiplied with a_fmt e4m3fn"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8",
                                  a_scales=np.ones(2, F32)), ValueError,
     r"^a_scales: expected 0 \(no scales\), 1 \(one per tensor\) or 3 \(one per row\)"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8",
                                  b_scales=np.ones(3, F32)), ValueError, r"^b_scales: expected"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8",
                                  b_scales=np.ones(2, np.float64)), TypeError,
     r"^b_scales: dtype float64 is not supported; expected float32"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8", bias=np.ones(3, F32)),
     ValueError, r"^bias: expected 2 elements"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8", out_dtype="float64"),
     ValueError, r"^out_dtype 'float64': expected one of float32, bfloat16, float16"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8", backend="fast"),
     ValueError, r"^backend 'fast': expected one of automatic"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="e2m1fn", b_fmt="int8"), ValueError,
     r"^a_fmt: format e2m1fn is not a matmul operand format"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt=3), TypeError, r"^b_fmt: "),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt=None, b_fmt="int8"), TypeError,
     r"^a_fmt: required"),
    (lambda: lowbit.scaled_matmul(A8, np.ones((1, 2, 4), np.int8), a_fmt="int8", b_fmt="int8"),
     ValueError, r"^b: expected a 2-d \(N, K\) operand"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8",
                                  out=np.empty((3, 3), F32)), ValueError,
     r"^out: expected shape \(3, 2\)"),
    (lambda: lowbit.scaled_matmul(A8, B8, a_fmt="int8", b_fmt="int8", out_dtype="float32",
                                  out=np.empty((3, 2), np.float16)), TypeError,
     r"^out: dtype float16 but out_dtype is float32"),
    (lambda: lowbit.scaled_matmul(A8, np.ones((2, 8), np.int8)[:, ::2], a_fmt="int8",
                                  b_fmt="int8"), ValueError, r"^b: .*contiguous"),
    (lambda: lowbit.scaled_matmul(np.ones((2, 4), ml_dtypes.float8_e4m3fn), B8, a_fmt="e5m2",
                                  b_fmt="int8"), ValueError,
     r"^a: an array of e4m3fn codes \(its dtype\), but a_fmt is e5m2"),
    (lambda: lowbit.scaled_matmul(np.ones((2, 200000), np.int8), np.ones((2, 200000), np.int8),
                                  a_fmt="int8", b_fmt="int8"), ValueError, r"^a: K = 200000"),
])
def test_errors_name_the_argument(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


# ---- torch tensors -------------------------------------------------------------------------------


@pytest.mark.torch
def test_torch_cpu_tensors_give_the_numpy_bits():
    torch = pytest.importorskip("torch")
    a, b = int8_codes((2, 3, 40), 20, True), int8_codes((6, 40), 21, True)
    sa, sb = scales_of("rows", 6, 22), scales_of("tensor", 6, 23)
    bias = bias_of("bfloat16", 6, 24)
    want = int8_ref(a, b, sa, sb, bias, "bfloat16")
    got = lowbit.scaled_matmul(torch.from_numpy(a), torch.from_numpy(b), a_fmt="int8_sym",
                               b_fmt="int8_sym", a_scales=torch.from_numpy(sa),
                               b_scales=torch.from_numpy(sb),
                               bias=torch.from_numpy(bias.view(np.uint16)).view(torch.bfloat16),
                               out_dtype=torch.bfloat16)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert np.array_equal(got.view(torch.int16).numpy(), want.view(np.int16))
    # torch float8 tensors are typed codes
    c = fp_codes("e4m3fn", (4, 16), 25)
    tc = torch.from_numpy(c).view(torch.float8_e4m3fn)
    assert same_bits(lowbit.scaled_matmul(tc, tc, a_fmt=None, b_fmt=None).numpy(),
                     lowbit.scaled_matmul(c, c, a_fmt="e4m3fn", b_fmt="e4m3fn"))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["automatic", "simt", "cublaslt", "cutlass"])
@pytest.mark.parametrize("out_dtype", ["float32", "bfloat16"])
def test_cuda_int8_equals_the_cpu_twin(backend, out_dtype):
    torch = pytest.importorskip("torch")
    # Shapes that tensor-core kernels take (multiples of 16) and one that some refuse.
    for m, n, k in ((256, 128, 512), (33, 40, 48)):
        a, b = int8_codes((m, k), m, True), int8_codes((n, k), n, True)
        sa, sb = scales_of("rows", m, 26), scales_of("tensor", n, 27)
        bias = bias_of("float32", n, 28)
        want = lowbit.scaled_matmul(a, b, a_fmt="int8_sym", b_fmt="int8_sym", a_scales=sa,
                                    b_scales=sb, bias=bias, out_dtype=out_dtype)
        dev = [torch.from_numpy(v).cuda() for v in (a, b, sa, sb, bias)]
        try:
            got = lowbit.scaled_matmul(dev[0], dev[1], a_fmt="int8_sym", b_fmt="int8_sym",
                                       a_scales=dev[2], b_scales=dev[3], bias=dev[4],
                                       out_dtype=out_dtype, backend=backend)
        except RuntimeError as e:
            if backend in ("automatic", "simt"):
                raise
            pytest.skip(f"{backend} does not take {m}x{n}x{k} here: {e}")
        assert got.is_cuda and got.dtype == getattr(torch, out_dtype)
        host = got.cpu().view(torch.int16 if out_dtype == "bfloat16" else torch.int32).numpy()
        assert np.array_equal(host, want.view(host.dtype)), (m, n, k)


@pytest.mark.gpu
def test_cuda_fp8_simt_equals_the_cpu_twin():
    torch = pytest.importorskip("torch")
    a, b = fp_codes("e4m3fn", (64, 96), 29), fp_codes("e5m2", (32, 96), 30)
    sa = scales_of("rows", 64, 31)
    want = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e5m2", a_scales=sa)
    got = lowbit.scaled_matmul(torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(),
                               a_fmt="e4m3fn", b_fmt="e5m2", a_scales=torch.from_numpy(sa).cuda(),
                               backend="simt")
    assert same_bits(got.cpu().numpy(), want)
