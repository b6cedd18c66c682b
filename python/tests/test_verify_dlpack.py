"""lowbit.verify over arrays of other libraries: DLPack producers on the CPU (dlfake's, without
torch) are read in place, CUDA arrays are copied to the host on the caller's stream, and the
report is the one the same numpy arrays give. torch tests (marker `torch`) and CUDA tests
(marker `gpu`) run where PyTorch and a device are present."""

from __future__ import annotations

import contextlib
import importlib.util

import ml_dtypes
import numpy as np
import pytest

import lowbit
from dlfake import Fake, Wrapped, WrappedNamespace
from lowbit import _interop

RNG = np.random.default_rng(11)
X = (RNG.standard_normal((5, 7)) * 10).astype(np.float32)
EXACT = X.astype(np.float64) / 3  # a float64 reference ...
ROUNDED = (X / np.float32(3)).astype(np.float32)  # ... and a float32 candidate near it
ROUNDED[1, 2] = np.nextafter(ROUNDED[1, 2], np.float32(np.inf))  # one ulp off, to fail
CODES_REF = lowbit.cast(X, "e4m3fn")
CODES_CAND = lowbit.cast(X, "e4m3fn", rounding="toward_zero")
BF16 = X.astype(ml_dtypes.bfloat16)

# (candidate, reference, policy, keyword arguments); every case fails somewhere, so that the
# reports compared below list elements, inputs and a histogram.
CASES = {
    "float32-vs-float64": (ROUNDED, EXACT, "ulp:0.5", {"inputs": X.astype(np.int8)}),
    "codes": (CODES_CAND, CODES_REF, "exact", {"fmt": "e4m3fn", "inputs": X}),
    "code-inputs": (X / 2, X / 2 + 1e-3, "atol:1e-4", {"inputs": CODES_REF,
                                                          "input_fmt": "e4m3fn"}),
    "transposed-float16": (X.T.astype(np.float16), (X.T * 1.001).astype(np.float16), "ulp:1",
                           {}),
    "bfloat16": (BF16, X, "rtol:2e-3", {"inputs": BF16}),
}
# numpy cannot export bfloat16 (ml_dtypes) through __dlpack__: those go through Fake only.
PRODUCERS = {
    "wrapped": Wrapped,
    "legacy": lambda a: Wrapped(a, legacy_only=True),
    "namespace": lambda a: Wrapped(a, namespace=WrappedNamespace),
    "fake": Fake,
    "fake-unversioned": lambda a: Fake(a, versioned=False),
}


def wrap_all(case, producer):
    cand, ref, policy, kwargs = CASES[case]
    kwargs = dict(kwargs)
    if "inputs" in kwargs:
        kwargs["inputs"] = producer(kwargs["inputs"])
    return producer(cand), producer(ref), policy, kwargs


_FIELDS = ("ok", "policy", "grid", "candidate_dtype", "reference_dtype", "input_dtype", "shape",
           "total", "checked", "nan_matches", "nan_mismatches", "failed", "max_abs_error",
           "max_rel_error", "max_ulp_error", "worst", "histogram")


def fields(report):
    """What a report says, from its attributes (its text and JSON forms are made of the same
    fields; test_verify.py checks them)."""
    return {name: getattr(report, name) for name in _FIELDS}


def numpy_report(case):
    cand, ref, policy, kwargs = CASES[case]
    report = lowbit.verify(cand, ref, policy, **kwargs)
    assert not report.ok and report.worst  # the comparison has something to show
    return report


@pytest.mark.parametrize("case, producer", [
    (case, producer) for case in CASES for producer in PRODUCERS
    if case != "bfloat16" or producer.startswith("fake")])
def test_cpu_producers_give_the_numpy_report(case, producer):
    want = numpy_report(case)
    cand, ref, policy, kwargs = wrap_all(case, PRODUCERS[producer])
    got = lowbit.verify(cand, ref, policy, **kwargs)
    assert fields(got) == fields(want)
    assert got.to_json() == want.to_json() and str(got) == str(want)


def test_producers_mix_with_numpy_arrays_and_are_read_in_place():
    ref = Fake(CODES_REF)
    report = lowbit.verify(CODES_CAND, ref, "ulp:1", fmt="e4m3fn")
    assert fields(report) == fields(lowbit.verify(CODES_CAND, CODES_REF, "ulp:1",
                                                  fmt="e4m3fn"))
    assert ref.deleted == 1  # one capsule taken and given back: no copy was made
    assert [c["stream"] for c in ref.dlpack_calls] == [None]  # CPU producers get no stream
    assert lowbit.verify(Fake(X, read_only=True), X).ok  # verify only reads


def test_bound_functions_see_numpy_values_of_producers():
    seen = {}

    def within(reference, inputs):
        seen.setdefault("calls", []).append((reference, inputs))
        return np.abs(reference) * 2.0**-7

    cand = (X * 1.005).astype(ml_dtypes.bfloat16)
    want = lowbit.verify(cand, BF16, within, inputs=CODES_REF, input_fmt="e4m3fn")
    # bfloat16 reference through Fake (numpy's DLPack import has no bfloat16: lowbit reads it),
    # code inputs through a producer with an array namespace.
    got = lowbit.verify(Fake(cand), Fake(BF16), within,
                        inputs=Wrapped(CODES_REF, namespace=WrappedNamespace),
                        input_fmt="e4m3fn")
    assert fields(got) == fields(want) and not got.ok and got.policy == "bound:within"
    (ref_np, in_np), (ref_dl, in_dl) = seen["calls"]
    for a, b in ((ref_np, ref_dl), (in_np, in_dl)):
        assert type(b) is np.ndarray and b.dtype == np.float64 and b.shape == X.shape
        assert np.array_equal(a, b)
    assert np.array_equal(ref_dl, BF16.astype(np.float64))
    assert np.array_equal(in_dl, lowbit.decode(CODES_REF, "e4m3fn", dtype="float64"))


class _HostCopies(_interop._Backend):
    """Stands in for torch/cupy: 'copies' a Fake CUDA producer by taking its host array, and
    records which device was current and which arrays were copied."""

    def __init__(self, device):
        self.device = device
        self.current = None
        self.copied = []

    def context(self):
        @contextlib.contextmanager
        def current():
            self.current = self.device
            yield
            self.current = None

        return current()

    def to_host(self, value):
        self.copied.append((value, self.current))
        return value.a.copy()


def test_cuda_producers_are_copied_to_the_host_first(monkeypatch):
    made = []

    def allocator(name, device):
        made.append((name, _HostCopies(device)))
        return made[-1][1]

    monkeypatch.setattr(_interop, "_cuda_allocator", allocator)
    cand, ref, policy, kwargs = CASES["codes"]
    on_gpu = Fake(cand, device=(2, 1))
    got = lowbit.verify(on_gpu, ref, policy, **kwargs)
    assert fields(got) == fields(numpy_report("codes"))
    [(name, backend)] = made
    assert name == "candidate" and backend.copied == [(on_gpu, _interop.Device("cuda", 1))]
    assert on_gpu.dlpack_calls == []  # lowbit's intake only saw the host copy
    # The bound path reads the same copies (CUDA managed memory is CUDA memory too).
    def half_ulp(r):
        return np.abs(r) * 2.0**-25

    got = lowbit.verify(Fake(ROUNDED, device=(2, 0)), Fake(EXACT, device=(13, 0)), half_ulp)
    assert fields(got) == fields(lowbit.verify(ROUNDED, EXACT, half_ulp))
    assert not got.ok and [n for n, _ in made[1:]] == ["candidate", "reference"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None
                    or importlib.util.find_spec("cupy") is not None,
                    reason="checks the message given when neither torch nor cupy is installed")
def test_cuda_producers_without_torch_or_cupy():
    with pytest.raises(TypeError, match=r"^candidate: lowbit allocates results for CUDA arrays "
                                        r"of other libraries, and copies them, with torch or "
                                        r"cupy, and neither is installed"):
        lowbit.verify(Fake(X, device=(2, 0)), X)


class _Broken:
    shape = (3,)

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kwargs):
        raise RuntimeError("the producer broke")


@pytest.mark.parametrize("policy", ["exact", lambda r: 0 * r], ids=["string", "bound"])
def test_bad_producers_are_named(policy):
    x = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match=r"^reference: memory on OpenCL \(DLPack device type 4\)"):
        lowbit.verify(x, Fake(x, device=(4, 0)), policy)
    with pytest.raises(TypeError, match=r"^inputs: _Broken.__dlpack__\(\) failed: .*the producer "
                                        r"broke"):
        lowbit.verify(x, x, policy, inputs=_Broken())
    with pytest.raises(TypeError, match=r"^candidate: dtype complex64 is not supported"):
        lowbit.verify(Fake(x.astype(np.complex64)), x, policy)


# ---- torch --------------------------------------------------------------------------------------


def _torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


@pytest.mark.torch
def test_torch_cpu_tensors_give_the_numpy_report():
    torch = _torch()
    for case in ("float32-vs-float64", "codes", "code-inputs", "transposed-float16"):
        cand, ref, policy, kwargs = CASES[case]
        kwargs = {k: torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray)
                  else v for k, v in kwargs.items()}
        got = lowbit.verify(torch.from_numpy(cand), torch.from_numpy(ref), policy, **kwargs)
        assert fields(got) == fields(numpy_report(case)), case
    # bfloat16, and tensors that require grad
    t = torch.from_numpy(X).requires_grad_()
    b = t.detach().to(torch.bfloat16)
    assert np.array_equal(b.view(torch.int16).numpy(), BF16.view(np.int16))
    want = lowbit.verify(BF16, X, "rtol:1e-3")
    assert not want.ok and fields(lowbit.verify(b, t, "rtol:1e-3")) == fields(want)

    def tight(r):
        return np.abs(r) * 2.0**-12

    want = lowbit.verify(X, BF16, tight)
    assert not want.ok and fields(lowbit.verify(t, b, tight)) == fields(want)


@pytest.mark.torch
def test_torch_float8_tensors_are_codes_of_their_format():
    torch = _torch()
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this PyTorch has no float8 types")
    t = torch.from_numpy(X)
    cand = t.to(torch.float8_e4m3fn)
    want = lowbit.verify(cand.view(torch.uint8).numpy(), CODES_REF, "ulp:0", fmt="e4m3fn")
    got = lowbit.verify(cand, CODES_REF, "ulp:0")
    assert fields(got) == fields(want) and got.grid == "e4m3fn"
    # torch's own cast rounds to nearest-even too
    assert np.array_equal(cand.view(torch.uint8).numpy(), CODES_REF)
    with pytest.raises(ValueError, match=r"^candidate: dtype float8_e4m3fn holds e4m3fn codes, "
                                         r"but fmt is e5m2"):
        lowbit.verify(cand, CODES_REF, "exact", fmt="e5m2")


@pytest.mark.gpu
def test_cuda_tensors_are_copied_on_the_callers_stream():
    torch = _torch()

    def cuda(a):
        return torch.from_numpy(np.ascontiguousarray(a)).cuda()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Written on `side` and read there: the copy must be ordered after these kernels.
        # (Doubling and halving are exact: the values stay ROUNDED's, as torch's own division
        # by 3 on the GPU need not be correctly rounded.)
        cand = cuda(ROUNDED) * 2
        cand /= 2
        ref, x = cuda(EXACT), cuda(X.astype(np.int8))
        got = lowbit.verify(cand, ref, "ulp:0.5", inputs=x)
    assert fields(got) == fields(numpy_report("float32-vs-float64"))
    # A CUDA producer of another library goes through torch.from_dlpack.
    got = lowbit.verify(Wrapped(cand), ref.cpu(), "ulp:0.5", inputs=X.astype(np.int8))
    assert fields(got) == fields(numpy_report("float32-vs-float64"))

    # A bfloat16 reference on the GPU for a bound evaluated on the host.
    def tight(r):
        return np.abs(r) * 2.0**-12

    got = lowbit.verify(cand, cand.to(torch.bfloat16), tight)
    want = lowbit.verify(ROUNDED, ROUNDED.astype(ml_dtypes.bfloat16), tight)
    assert not want.ok and fields(got) == fields(want)
