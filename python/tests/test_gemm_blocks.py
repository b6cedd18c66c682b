"""lowbit.scaled_matmul's accumulation models and block scales against numpy replays.

Block scales: the blocked rule of kernels/include/lowbit/kernels/gemm.hpp replayed in float32
numpy, one rounding per step: each K block's partial sum (exact int64 for int8; acc = acc + p
over the block's k in order for fp8, every product exact in float32), t_j = (acc_j * sb) * sa,
T = t_0 + t_1 + ... in block order, T + bias, then the output rounding: bit-equal. With an
accumulation model the blocks' partial sums are the model's sums of each block alone, which
scaled_matmul itself gives for the block's columns (no scales, no bias): the replay composes
them and must give the blocked call's bits. quantize's ("blocks", 128), ("tiles", 128, 128)
and quantize_mx's outputs are fed to the matmul as they come."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit

ml_dtypes = pytest.importorskip("ml_dtypes")

F32 = np.float32
Acc = lowbit.Accumulation


def rng(seed):
    return np.random.default_rng(seed)


def bits(x):
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def values(codes, fmt):
    if fmt.startswith("int8"):
        return codes.astype(np.float64)
    return codes.view(getattr(ml_dtypes, "float8_" + fmt)).astype(np.float64)


def scale_at(scales, block, rows, k, m, j):
    """The operand's scale of row m and K block j (float32), as gemm.hpp reads it."""
    if scales is None:
        return F32(1)
    s = np.asarray(scales).reshape(-1)
    if block is None:
        return F32(s[0] if s.size == 1 else s[m])
    br, bk = block
    cols = -(-k // bk)
    v = s[(m // br) * cols + j]
    if s.dtype == np.uint8:  # E8M0
        return F32(np.nan) if v == 255 else F32(np.ldexp(1.0, int(v) - 127))
    return F32(v)


def replay(a, af, b, bf, sa, a_block, sb, b_block, kb, bias=None, partial=None):
    """The blocked rule in float32 numpy; partial(k0, k1) gives the (M, N) float32 block sums
    (default: exact int sums for int8, float32 k-order sums for the others)."""
    m, k = a.shape
    n = b.shape[0]
    av, bv = values(a, af), values(b, bf)
    total = None
    for j, k0 in enumerate(range(0, k, kb)):
        k1 = min(k, k0 + kb)
        if partial is not None:
            acc = partial(k0, k1)
        elif af.startswith("int8"):
            acc = (a[:, k0:k1].astype(np.int64) @ b[:, k0:k1].astype(np.int64).T).astype(F32)
        else:
            acc = np.zeros((m, n), F32)
            for kk in range(k0, k1):
                acc = acc + (av[:, kk, None] * bv[None, :, kk]).astype(F32)
        s_a = np.array([scale_at(sa, a_block, m, k, i, j) for i in range(m)], F32)
        s_b = np.array([scale_at(sb, b_block, n, k, i, j) for i in range(n)], F32)
        with np.errstate(over="ignore", invalid="ignore"):
            t = (acc * s_b[None, :]) * s_a[:, None]
        total = t if total is None else total + t
    out = total + (F32(0) if bias is None else bias.astype(F32)[None, :])
    return out.astype(F32)


def fp8_matrix(shape, seed, spread=4.0):
    return (rng(seed).standard_normal(shape) * 2.0 ** rng(seed + 1).uniform(-spread, spread,
                                                                          shape)).astype(F32)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("k", [1, 127, 128, 300])
def test_quantize_blocks_and_tiles_feed_the_matmul(fmt, k):
    m, n = 9, 130
    x, w = fp8_matrix((m, k), 1 + k), fp8_matrix((n, k), 2 + k)
    ca, sa = lowbit.quantize(x, fmt, ("blocks", 128))
    cb, sb = lowbit.quantize(w, fmt, ("tiles", 128, 128))
    bias = rng(3).standard_normal(n).astype(F32)
    got = lowbit.scaled_matmul(ca, cb, a_fmt=fmt, b_fmt=fmt, a_scales=sa, b_scales=sb, bias=bias,
                               a_block=("blocks", 128), b_block=("tiles", 128, 128))
    want = replay(ca, fmt, cb, fmt, sa, (1, 128), sb, (128, 128), 128, bias)
    assert same_bits(got, want)
    # And near the float64 matmul of the dequantized operands.
    da = values(ca, fmt) * np.repeat(np.asarray(sa, np.float64), 128, axis=1)[:, :k]
    db = values(cb, fmt) * np.repeat(np.repeat(np.asarray(sb, np.float64), 128, 0), 128, 1)[:n, :k]
    ref = da @ db.T + bias
    bound = (k + 8) * 2.0**-24 * (np.abs(da) @ np.abs(db).T + np.abs(bias)) + 1e-30
    assert (np.abs(got - ref) <= bound).all()


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_mx_scales_feed_the_matmul(fmt):
    m, n, k = 6, 5, 100  # 100 = 3 blocks of 32 and one of 4
    ca, sa = lowbit.quantize_mx(fp8_matrix((m, k), 4, 12.0), fmt)
    cb, sb = lowbit.quantize_mx(fp8_matrix((n, k), 5, 12.0), fmt)
    assert sa.dtype == np.uint8 and sa.shape == (m, 4)
    got = lowbit.scaled_matmul(ca, cb, a_fmt=fmt, b_fmt=fmt, a_scales=sa, b_scales=sb,
                               a_block=(1, 32), b_block=(1, 32))
    assert same_bits(got, replay(ca, fmt, cb, fmt, sa, (1, 32), sb, (1, 32), 32))


def test_e8m0_nan_code_and_extremes():
    m, n, k = 3, 2, 64
    a = np.full((m, k), 0x38, np.uint8)  # 1.0 in e4m3fn
    b = np.full((n, k), 0x38, np.uint8)
    sa = np.array([[127, 0], [255, 127], [254, 1]], np.uint8)  # 1, 2^-127, NaN, 2^127, 2^-126
    sb = np.full((n, 2), 127, np.uint8)
    got = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn", a_scales=sa, b_scales=sb,
                               a_block=(1, 32), b_block=(1, 32))
    assert same_bits(got, replay(a, "e4m3fn", b, "e4m3fn", sa, (1, 32), sb, (1, 32), 32))
    assert np.isnan(got[1]).all() and np.isfinite(got[0]).all()


@pytest.mark.parametrize("fmt", ["int8", "int8_sym"])
def test_int8_blocks_sum_exact_partials(fmt):
    m, n, k = 5, 4, 333
    lo = -127 if fmt == "int8_sym" else -128
    a = rng(6).integers(lo, 128, (m, k), dtype=np.int8)
    b = rng(7).integers(lo, 128, (n, k), dtype=np.int8)
    sa = rng(8).uniform(0.5, 2, (m, 3)).astype(F32)
    sb = rng(9).uniform(0.5, 2, (1, 3)).astype(F32)
    got = lowbit.scaled_matmul(a, b, a_fmt=fmt, b_fmt=fmt, a_scales=sa, b_scales=sb,
                               a_block=(1, 128), b_block=(128, 128))
    assert same_bits(got, replay(a, fmt, b, fmt, sa, (1, 128), sb, (128, 128), 128))


def test_one_operand_blocked_the_other_per_row():
    m, n, k = 4, 6, 200
    ca, sa = lowbit.quantize(fp8_matrix((m, k), 10), "e4m3fn", ("blocks", 64))
    cb, sb = lowbit.quantize(fp8_matrix((n, k), 11), "e5m2", "rows")
    got = lowbit.scaled_matmul(ca, cb, a_fmt="e4m3fn", b_fmt="e5m2", a_scales=sa, b_scales=sb,
                               a_block=("blocks", 64), out_dtype="bfloat16")
    want = replay(ca, "e4m3fn", cb, "e5m2", sa, (1, 64), sb, None, 64)
    assert same_bits(got, want.astype(ml_dtypes.bfloat16))


def test_a_single_block_is_the_unblocked_rule():
    m, n, k = 7, 5, 96
    ca, sa = lowbit.quantize(fp8_matrix((m, k), 12), "e4m3fn", ("blocks", 128))
    cb, sb = lowbit.quantize(fp8_matrix((n, k), 13), "e4m3fn", "tensor")
    bias = rng(14).standard_normal(n).astype(F32)
    blocked = lowbit.scaled_matmul(ca, cb, a_fmt="e4m3fn", b_fmt="e4m3fn", a_scales=sa,
                                   b_scales=sb, bias=bias, a_block=(1, 128))
    rows = lowbit.scaled_matmul(ca, cb, a_fmt="e4m3fn", b_fmt="e4m3fn", a_scales=sa.reshape(-1),
                                b_scales=sb, bias=bias)
    assert same_bits(blocked, rows)


HOPPERISH = [Acc.block_fixed_point(32, 13), Acc.block_fixed_point(16, 25, promote_every=4),
             Acc.block_fixed_point(8, 10, align_with_register=True, terms="nearest_even",
                                   register="toward_zero", promote_every=1),
             Acc.hopper(), Acc.hopper(fast=True)]


@pytest.mark.parametrize("model", HOPPERISH, ids=str)
def test_models_compose_per_block(model):
    m, n, k = 5, 6, 300
    ca, sa = lowbit.quantize(fp8_matrix((m, k), 15, 8.0), "e4m3fn", ("blocks", 128))
    cb, sb = lowbit.quantize(fp8_matrix((n, k), 16, 8.0), "e5m2", ("tiles", 128, 128))

    def partial(k0, k1):
        return lowbit.scaled_matmul(np.ascontiguousarray(ca[:, k0:k1]),
                                    np.ascontiguousarray(cb[:, k0:k1]), a_fmt="e4m3fn",
                                    b_fmt="e5m2", accumulation=model)

    got = lowbit.scaled_matmul(ca, cb, a_fmt="e4m3fn", b_fmt="e5m2", a_scales=sa, b_scales=sb,
                               a_block=(1, 128), b_block=(128, 128), accumulation=model)
    want = replay(ca, "e4m3fn", cb, "e5m2", sa, (1, 128), sb, (128, 128), 128,
                  partial=partial)
    assert same_bits(got, want)


def test_fp32_model_is_the_default_sum_and_blocks_of_one_at_f23_too():
    a = lowbit.quantize(fp8_matrix((8, 257), 17, 10.0), "e4m3fn", "rows")[0]
    b = lowbit.quantize(fp8_matrix((3, 257), 18, 10.0), "e4m3fn", "rows")[0]
    plain = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn")
    for model in (Acc.fp32(), "fp32", Acc.block_fixed_point(1, 23), Acc.block_fixed_point(1, 40)):
        got = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn", accumulation=model)
        assert same_bits(got, plain), model


def test_truncating_model_differs_from_fp32_within_its_bound():
    # Cancellation: large terms that cancel leave small ones that a 4-bit-fraction block
    # truncates; the error per block is below k * 2^(e_max - f) in value.
    k = 64
    a = np.full((1, k), 0x38, np.uint8)  # 1.0
    vals = np.where(np.arange(k) % 2 == 0, 1.0, -1.0) * 64
    vals[1::8] = 0.0625  # small terms the truncation loses
    b = lowbit.cast(vals.astype(F32), "e4m3fn").reshape(1, k)
    exact = values(b, "e4m3fn").sum()
    model = Acc.block_fixed_point(32, 4)
    got = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn", accumulation=model)[0, 0]
    fp32 = lowbit.scaled_matmul(a, b, a_fmt="e4m3fn", b_fmt="e4m3fn")[0, 0]
    assert fp32 == exact != got
    assert abs(got - exact) <= (k // 32) * 32 * 2.0 ** (6 - 4)


def test_accumulation_spec_round_trip_and_errors():
    for model in [Acc.fp32(), Acc.exact(), *HOPPERISH]:
        assert Acc.parse(str(model)) == model
        assert eval(repr(model), {"Accumulation": Acc}) == model
    assert Acc.parse("bfp:f=3,k=2") == Acc.block_fixed_point(2, 3)
    with pytest.raises(ValueError, match="k and f are required"):
        Acc.parse("bfp:k=2")
    with pytest.raises(ValueError, match="bad or repeated field"):
        Acc.parse("bfp:k=2,f=3,k=4")
    with pytest.raises(ValueError, match="1 <= k <= 64"):
        Acc.block_fixed_point(65, 3)
    with pytest.raises(ValueError, match="terms"):
        Acc.block_fixed_point(4, 3, terms="up")
    with pytest.raises(TypeError, match="accumulation"):
        lowbit.scaled_matmul(np.zeros((1, 4), np.uint8), np.zeros((1, 4), np.uint8),
                             a_fmt="e4m3fn", b_fmt="e4m3fn", accumulation=3)


Z8 = np.zeros((4, 64), np.uint8)
I8 = np.zeros((4, 64), np.int8)


@pytest.mark.parametrize("call, exc, message", [
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  accumulation=Acc.exact()), RuntimeError, "accumulation: exact"),
    (lambda: lowbit.scaled_matmul(I8, I8, a_fmt="int8", b_fmt="int8", accumulation="fp32"),
     ValueError, "accumulation: int8 sums are exact"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  a_scales=np.ones((4, 3), F32), a_block=(1, 32)),
     ValueError, "a_scales: 1 x 32 blocks of a 4 x 64 operand need 4 x 2 scales"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  a_scales=np.ones((4, 2), F32), a_block=(1, 32),
                                  b_scales=np.ones((4, 1), F32), b_block=(1, 64)),
     ValueError, "K blocks of 64 but a_scales has K blocks of 32"),
    (lambda: lowbit.scaled_matmul(I8, I8, a_fmt="int8", b_fmt="int8",
                                  a_scales=np.ones((4, 2), np.uint8), a_block=(1, 32)),
     ValueError, "a_scales: uint8 .E8M0. scales are for fp8 operands"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  a_scales=np.ones((4, 1), np.uint8)),
     TypeError, "a_scales: dtype uint8"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  a_scales=np.ones(4, F32), a_block=(0, 32)),
     ValueError, "block_rows >= 1 and block_k >= 1"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn",
                                  a_scales=np.ones(4, F32), a_block="rows"),
     ValueError, "a_block: block scales come from"),
    (lambda: lowbit.scaled_matmul(I8, I8, a_fmt="int8", b_fmt="int8", fast_accumulation=True),
     ValueError, "fast_accumulation: a mode of the fp8 tensor cores"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn", fast_accumulation=True),
     RuntimeError, "fast_accumulation: cuBLASLt's mode, on CUDA views only"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn", fast_accumulation=True,
                                  accumulation=Acc.hopper(fast=True)),
     RuntimeError, "fast_accumulation: cuBLASLt's hardware sum; with accumulation"),
    (lambda: lowbit.scaled_matmul(Z8, Z8, a_fmt="e4m3fn", b_fmt="e4m3fn", fast_accumulation=1),
     TypeError, "fast_accumulation: expected a bool"),
])
def test_errors_name_the_argument(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("model", [None, *HOPPERISH], ids=str)
def test_cuda_simt_blocks_equal_the_cpu_twin(model):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    m, n, k = 70, 45, 300
    ca, sa = lowbit.quantize(fp8_matrix((m, k), 20, 8.0), "e4m3fn", ("blocks", 128))
    cb, sb = lowbit.quantize(fp8_matrix((n, k), 21, 8.0), "e4m3fn", ("tiles", 128, 128))
    kw = dict(a_fmt="e4m3fn", b_fmt="e4m3fn", a_block=(1, 128), b_block=(128, 128),
              accumulation=model)
    want = lowbit.scaled_matmul(ca, cb, a_scales=sa, b_scales=sb, **kw)
    dev = [torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in (ca, cb, sa, sb)]
    for backend in ("automatic", "simt"):
        got = lowbit.scaled_matmul(dev[0], dev[1], a_scales=dev[2], b_scales=dev[3],
                                   backend=backend, **kw)
        assert same_bits(got.cpu().numpy(), want), backend
    mx_a, mx_sa = lowbit.quantize_mx(fp8_matrix((m, k), 22, 12.0), "e4m3fn")
    mx_b, mx_sb = lowbit.quantize_mx(fp8_matrix((n, k), 23, 12.0), "e4m3fn")
    kw.update(a_block=(1, 32), b_block=(1, 32))
    want = lowbit.scaled_matmul(mx_a, mx_b, a_scales=mx_sa, b_scales=mx_sb, **kw)
    dev = [torch.from_numpy(np.ascontiguousarray(v)).cuda() for v in (mx_a, mx_b, mx_sa, mx_sb)]
    got = lowbit.scaled_matmul(dev[0], dev[1], a_scales=dev[2], b_scales=dev[3], **kw)
    assert same_bits(got.cpu().numpy(), want)
    if model is None:
        for backend in ("cublaslt", "cutlass", "widened"):
            with pytest.raises(RuntimeError, match="block scales"):
                lowbit.scaled_matmul(dev[0], dev[1], a_scales=dev[2], b_scales=dev[3],
                                     backend=backend, **kw)
