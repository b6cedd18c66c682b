"""PyTorch tensors in and out: CPU tensors (marker `torch`) and CUDA tensors on the caller's
current stream (marker `gpu`). Results must be torch tensors on the input's device, bit-equal to
the numpy path (the CUDA kernels and the CPU twin agree bit for bit). PyTorch's own casts are
also an outside oracle for lowbit's, within a tested torch range (the last section)."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import lowbit
import oracle_versions
from dlfake import Wrapped

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

GRANULARITIES = ["tensor", "rows", "columns", ("blocks", 4), ("tiles", 3, 5)]


def sample(shape, seed=0, dtype=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.rand(shape, generator=g) * 6 - 3)
    return x if dtype is None else x.to(dtype)


def np_of(t):
    return t.detach().cpu().numpy()


def same(a, b):
    """Bit equality of a torch result and a numpy result (NaNs compared as bits)."""
    a = np_of(a)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if a.dtype.kind == "f":
        return np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
    return np.array_equal(a, b)


# ---- CPU tensors ---------------------------------------------------------------------------------


@pytest.mark.torch
def test_cast_and_decode_cpu_tensors():
    x = sample((5, 7))
    codes = lowbit.cast(x, "e4m3fn", saturate=True)
    assert isinstance(codes, torch.Tensor)
    assert codes.dtype == torch.uint8 and codes.device == x.device and codes.shape == x.shape
    assert same(codes, lowbit.cast(np_of(x), "e4m3fn", saturate=True))
    values = lowbit.decode(codes, "e4m3fn")
    assert isinstance(values, torch.Tensor) and values.dtype == torch.float32
    assert same(values, lowbit.decode(np_of(codes), "e4m3fn"))
    wide = lowbit.decode(codes, "e4m3fn", dtype=torch.float64)
    assert wide.dtype == torch.float64


@pytest.mark.torch
def test_cpu_tensor_layouts_and_dtypes():
    x = sample((6, 8))
    for view in (x.t(), x[:, ::2], x[2:4], x.flip(0)):
        assert same(lowbit.cast(view, "e5m2"), lowbit.cast(np_of(view), "e5m2"))
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        xs = x.to(dtype)
        assert same(lowbit.cast(xs, "e4m3fn"), lowbit.cast(np_of(xs.to(torch.float64)), "e4m3fn"))
    w = x.clone().requires_grad_(True)  # tensors that require grad are read through .detach()
    assert same(lowbit.cast(w, "e4m3fn"), lowbit.cast(np_of(x), "e4m3fn"))
    codes16 = lowbit.cast(x, "bfloat16")
    assert codes16.dtype == torch.uint16
    assert same(lowbit.decode(codes16, "bfloat16"), lowbit.decode(lowbit.cast(np_of(x),
                                                                              "bfloat16"),
                                                                  "bfloat16"))
    with pytest.raises(TypeError, match=r"^x: dtype int64 is not supported"):
        lowbit.cast(torch.arange(4), "e4m3fn")


@pytest.mark.torch
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
def test_quantize_cpu_tensors(granularity):
    x = sample((7, 12), seed=1)
    codes, scales = lowbit.quantize(x, "int8_sym", granularity)
    want_codes, want_scales = lowbit.quantize(np_of(x), "int8_sym", granularity)
    assert codes.dtype == torch.int8 and scales.dtype == torch.float32
    assert same(codes, want_codes) and same(scales, want_scales)
    out = lowbit.dequantize(codes, scales, "int8_sym", granularity)
    assert isinstance(out, torch.Tensor)
    assert same(out, lowbit.dequantize(want_codes, want_scales, "int8_sym", granularity))


@pytest.mark.torch
def test_delayed_and_mx_cpu_tensors():
    x = sample((4, 40), seed=2)
    history = torch.zeros(3)
    history[0] = 2.0
    h = np_of(history).copy()
    codes, pair = lowbit.quantize_delayed(x, history, "e4m3fn")
    want_codes, want_pair = lowbit.quantize_delayed(np_of(x), h, "e4m3fn")
    assert same(codes, want_codes) and same(pair, want_pair) and same(history, h)
    codes, scales = lowbit.quantize_mx(x, "e2m1fn")
    want = lowbit.quantize_mx(np_of(x), "e2m1fn")
    assert same(codes, want[0]) and same(scales, want[1])
    assert same(lowbit.dequantize_mx(codes, scales, "e2m1fn"),
                lowbit.dequantize_mx(*want, "e2m1fn"))
    assert same(lowbit.cast_scaled(x, 4.0, "e4m3fn"), lowbit.cast_scaled(np_of(x), 4.0, "e4m3fn"))


@pytest.mark.torch
def test_torch_cuda_tensor_in_a_build_without_cuda():
    if lowbit._core.cuda_built() or not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA and a lowbit build without CUDA kernels")
    with pytest.raises(RuntimeError, match=r"^x: a CUDA array \(cuda:0\), but this lowbit build"):
        lowbit.cast(torch.ones(3, device="cuda"), "e4m3fn")


# ---- CUDA tensors --------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cast_and_decode_cuda_tensors():
    x = sample((33, 65)).cuda()
    codes = lowbit.cast(x, "e4m3fn", rounding="stochastic", seed=3)
    assert codes.is_cuda and codes.device == x.device and codes.dtype == torch.uint8
    assert same(codes, lowbit.cast(np_of(x), "e4m3fn", rounding="stochastic", seed=3))
    values = lowbit.decode(codes, "e4m3fn")
    assert values.is_cuda and same(values, lowbit.decode(np_of(codes), "e4m3fn"))
    xt = x.t()  # strided on the device
    assert same(lowbit.cast(xt, "e5m2"), lowbit.cast(np_of(xt), "e5m2"))
    assert same(lowbit.cast(x.bfloat16(), "e4m3fn"), lowbit.cast(np_of(x.bfloat16().float()),
                                                                 "e4m3fn"))


@pytest.mark.gpu
@pytest.mark.parametrize("granularity", GRANULARITIES, ids=str)
@pytest.mark.parametrize("target", ["e4m3fn", "int8_sym", "e2m1fn"])
def test_quantize_cuda_tensors(granularity, target):
    x = sample((37, 70), seed=4)
    x[3] = 0
    x[5, 9] = float("nan")
    xc = x.cuda()
    codes, scales = lowbit.quantize(xc, target, granularity, pow2=True)
    want_codes, want_scales = lowbit.quantize(np_of(x), target, granularity, pow2=True)
    assert codes.is_cuda and scales.is_cuda
    assert same(codes, want_codes) and same(scales, want_scales)
    assert same(lowbit.dequantize(codes, scales, target, granularity),
                lowbit.dequantize(want_codes, want_scales, target, granularity))


@pytest.mark.gpu
def test_transpose_delayed_and_mx_cuda_tensors():
    x = sample((20, 48), seed=5)
    xc = x.cuda()
    c, s = lowbit.quantize(xc, "e4m3fn", "columns", transpose=True)
    want = lowbit.quantize(np_of(x), "e4m3fn", "columns", transpose=True)
    assert same(c, want[0]) and same(s, want[1])
    history = torch.tensor([3.0, 1.0], device="cuda")
    h = np.array([3.0, 1.0], np.float32)
    codes, pair = lowbit.quantize_delayed(xc, history, "e5m2", reduce="most_recent")
    want_codes, want_pair = lowbit.quantize_delayed(np_of(x), h, "e5m2", reduce="most_recent")
    assert same(codes, want_codes) and same(pair, want_pair) and same(history, h)
    codes, scales = lowbit.quantize_mx(xc, "e4m3fn")
    want = lowbit.quantize_mx(np_of(x), "e4m3fn")
    assert same(codes, want[0]) and same(scales, want[1])
    assert same(lowbit.dequantize_mx(codes, scales, "e4m3fn"),
                lowbit.dequantize_mx(*want, "e4m3fn"))
    q = torch.tensor([2.0], device="cuda")
    assert same(lowbit.cast_scaled(xc, q, "int8"), lowbit.cast_scaled(np_of(x), 2.0, "int8"))
    assert same(lowbit.cast_scaled(xc, 2.0, "int8"), lowbit.cast_scaled(np_of(x), 2.0, "int8"))


@pytest.mark.gpu
def test_work_runs_on_the_callers_current_stream():
    # On a side stream: a GPU-side spin, then the copy that fills x, then lowbit. Only a kernel
    # that is ordered after the copy on the same stream can see the filled x; one launched on
    # another stream would read the unfilled memory while the side stream still spins.
    src = sample((256, 1024), seed=6).cuda()
    want = lowbit.cast(np_of(src), "e4m3fn", saturate=True)
    want_q = lowbit.quantize(np_of(src), "int8_sym", "rows")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.zeros_like(src)
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        codes = lowbit.cast(x, "e4m3fn", saturate=True)
        torch.cuda._sleep(100_000_000)
        q_codes, q_scales = lowbit.quantize(x, "int8_sym", "rows")
    side.synchronize()
    assert same(codes, want)
    assert same(q_codes, want_q[0]) and same(q_scales, want_q[1])


@pytest.mark.gpu
def test_producers_are_told_the_stream():
    side = torch.cuda.Stream()
    x = sample((4, 8)).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        w = Wrapped(x)  # a non-torch producer of CUDA memory: results are allocated with torch
        codes = lowbit.cast(w, "e4m3fn")
    side.synchronize()
    assert isinstance(codes, torch.Tensor) and codes.is_cuda
    assert same(codes, lowbit.cast(np_of(x), "e4m3fn"))
    assert w.calls and all(c["stream"] == side.cuda_stream for c in w.calls)
    w = Wrapped(x)
    lowbit.cast(w, "e4m3fn")  # the default stream is announced as 1 (the legacy default stream)
    torch.cuda.synchronize()
    default = torch.cuda.current_stream().cuda_stream
    assert all(c["stream"] == (default if default else 1) for c in w.calls)


@pytest.mark.gpu
def test_mixed_devices_are_refused():
    x = sample((4, 8)).cuda()
    with pytest.raises(ValueError, match=r"^history is on cpu but x is on cuda:0"):
        lowbit.quantize_delayed(x, torch.zeros(2), "e4m3fn")
    with pytest.raises(ValueError, match=r"^scales is on cpu but codes is on cuda:0"):
        lowbit.dequantize(torch.zeros(4, 8, dtype=torch.uint8, device="cuda"), np.ones(1,
                                                                                      np.float32),
                          "e4m3fn")


# ---- PyTorch's casts as an outside oracle (docs/ml_dtypes.md, "PyTorch's casts") ---------------
#
# Which differences each torch release has is data (oracle_versions.TORCH): for a tested release
# exactly the listed classes must occur; any other release gets a report (a warning and an
# xfail), not a failure. lowbit's own result on every class input is checked in any case.

TORCH_TYPES = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
               "e5m2fnuz": "float8_e5m2fnuz", "e8m0fnu": "float8_e8m0fnu",
               "bfloat16": "bfloat16", "float16": "float16"}


def torch_classes(name, x):
    """P1-P5 of docs/ml_dtypes.md, recognized from the input: key -> (mask, lowbit's code, or
    None where another test checks lowbit: correct rounding of doubles, test_ml_dtypes.py)."""
    import mlref

    with np.errstate(invalid="ignore"):
        v = x.astype(np.float64)
    out = {}
    if name == "e8m0fnu":
        low = 2.0**-127
        out.update({"P1": (v < 0, 0xFF), "P2": (v == 0, 0xFF),
                    "P3": ((v > low) & (v < 1.5 * low), 0)})
    if x.dtype == np.float64:  # rounded twice where float32(x) != x lands on a tie
        with np.errstate(over="ignore", invalid="ignore"):
            y = x.astype(np.float32).astype(np.float64)
        moved = (y != x) & ~np.isnan(x)
        out["P4"] = (moved & mlref.on_tie(name, y), None)
    if name == "bfloat16":  # the canonical NaN with the input's sign
        nan = np.isnan(v)
        out["P5"] = (nan, np.where(np.signbit(v), 0xFFFF, 0x7FFF)[nan])
    return out


def torch_inputs(name):
    """Every float16 and bfloat16 code, and float32 / float64 inputs: random bits and values
    spread over the format's range, both signs; for float64 also the double-rounding traps."""
    import ml_dtypes
    import mlref

    info = lowbit.format_info(name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    every = np.arange(1 << 16, dtype=np.uint16)
    mags = np.ldexp(1 + rng.random(1 << 19), rng.integers(int(np.log2(info.min_subnormal)) - 3,
                                                          int(np.log2(info.max)) + 2, 1 << 19))
    mags *= rng.choice([-1.0, 1.0], len(mags))
    bits32 = rng.integers(0, 1 << 32, 1 << 19, dtype=np.uint64).astype(np.uint32)
    bits64 = rng.integers(0, 2**63, 1 << 19, dtype=np.int64) * rng.choice([-1, 1], 1 << 19)
    with np.errstate(over="ignore"):
        return {"float16": every.view(np.float16), "bfloat16": every.view(ml_dtypes.bfloat16),
                "float32": np.concatenate([bits32.view(np.float32), mags.astype(np.float32)]),
                "float64": np.concatenate([bits64.view(np.float64), mags, mlref.traps(name)[0]])}


def torch_codes(x, name):
    if x.dtype.itemsize == 2 and x.dtype != np.float16:  # ml_dtypes' bfloat16
        t = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(x.copy())
    out = t.to(getattr(torch, TORCH_TYPES[name]))
    code = lowbit.format_info(name).code_dtype
    if np.dtype(code).itemsize == 1:
        return out.view(torch.uint8).numpy()
    return out.view(torch.int16).numpy().view(np.uint16)


def codes_agree(name, ours, theirs):
    """Equal codes, or NaN codes of the same sign (where the format's NaNs have one)."""
    ok = ours == theirs
    a = lowbit.decode(ours, name, "float64")
    b = lowbit.decode(theirs, name, "float64")
    both_nan = np.isnan(a) & np.isnan(b)
    info = lowbit.format_info(name)
    if info.signed and info.specials in ("ieee", "fn"):
        shift = info.exp_bits + info.man_bits
        both_nan &= (ours >> shift) == (theirs >> shift)
    return ok | both_nan


@pytest.mark.torch
@pytest.mark.parametrize("name", list(TORCH_TYPES))
def test_torch_casts_as_an_oracle(name):
    if not hasattr(torch, TORCH_TYPES[name]):
        pytest.skip(f"this PyTorch has no torch.{TORCH_TYPES[name]}")
    tv = oracle_versions.TORCH
    version = oracle_versions.installed_version(torch)
    seen, exercised, problems = set(), set(), []
    for source, x in torch_inputs(name).items():
        ours, theirs = lowbit.cast(x, name), torch_codes(x, name)
        differs = ~codes_agree(name, ours, theirs)
        known = np.zeros(x.shape, bool)
        for key, (mask, code) in torch_classes(name, x).items():
            # lowbit's documented result, whatever PyTorch does
            if code is not None:
                assert (ours[mask] == code).all(), f"{name} from {source}: lowbit not {key}'s"
            known |= mask
            exercised |= {key} if mask.any() else set()
            seen |= {key} if (differs & mask).any() else set()
        idx = np.nonzero(differs & ~known)[0]
        rows = [f"x={float(x[i])!r} lowbit={int(ours[i]):#x} torch={int(theirs[i]):#x}"
                for i in idx[:10]]
        if len(idx):
            problems += oracle_versions.class_problems(
                tv, version, f"{name} from {source}", set(), set(), len(idx),
                ", e.g.\n  " + "\n  ".join(rows))
    problems += oracle_versions.class_problems(tv, version, name, seen, exercised, 0)
    oracle_versions.judge(tv, version, problems)


@pytest.mark.torch
def test_torch_version_table():
    tv = oracle_versions.TORCH
    assert tv.is_tested("2.11.0+cu130") and tv.is_tested("2.11.0") and not tv.is_tested("2.12.0")
    assert {r.key for r in tv.rows} == {"P1", "P2", "P3", "P4", "P5"}
    assert tv.expected("2.12.0") == tv.expected("2.11.0")  # compared with the nearest below
