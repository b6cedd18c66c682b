"""PyTorch tensors in and out: CPU tensors (marker `torch`) and CUDA tensors on the caller's
current stream (marker `gpu`). Results must be torch tensors on the input's device, bit-equal to
the numpy path (the CUDA kernels and the CPU twin agree bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit
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
