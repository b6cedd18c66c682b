"""The DLPack import of lowbit._core, on the CPU: numpy's own capsules (versioned and legacy) and
capsules built field by field with ctypes (dlfake.Fake), so that every rule of the protocol is
exercised without torch: capsule renaming, one deleter call, NULL strides, byte_offset, devices,
dtypes, versions, the read-only flag, and results in the caller's array type."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowbit
from dlfake import Fake, Wrapped, WrappedNamespace, capsule_name
from lowbit import _core

RNG = np.random.default_rng(7)
X = (RNG.standard_normal((6, 10)) * 100).astype(np.float32)


def test_versioned_capsule_from_a_producer_that_is_not_numpy():
    w = Wrapped(X)
    got = lowbit.cast(w, "e4m3fn")
    assert type(got) is np.ndarray and got.dtype == np.uint8
    assert np.array_equal(got, lowbit.cast(X, "e4m3fn"))
    # CPU producers are not given a stream (the protocol requires None for CPU).
    assert w.calls == [{"stream": None, "max_version": (1, 0)}]


def test_legacy_producer_is_called_again_without_max_version():
    w = Wrapped(X, legacy_only=True)
    assert np.array_equal(lowbit.cast(w, "e5m2"), lowbit.cast(X, "e5m2"))
    assert [sorted(c) for c in w.calls] == [["max_version", "stream"], ["stream"]]
    assert _core._describe(Wrapped(X, legacy_only=True))["versioned"] is False
    assert _core._describe(Wrapped(X))["versioned"] is True


def test_results_come_back_through_the_producers_namespace():
    got = lowbit.cast(Wrapped(X, namespace=WrappedNamespace), "e4m3fn")
    assert isinstance(got, Wrapped)
    assert np.array_equal(got.a, lowbit.cast(X, "e4m3fn"))
    codes, scales = lowbit.quantize(Wrapped(X, namespace=WrappedNamespace), "int8_sym", "rows")
    assert isinstance(codes, Wrapped) and isinstance(scales, Wrapped)
    assert scales.shape == (6, 1)


@pytest.mark.parametrize(
    "view",
    [X[:, ::2], X[::-1], X[::2, 3:], X.T, X[:, 0], X[1:2, :], X.reshape(2, 3, 10)[:, 1]],
    ids=["every-other-column", "reversed-rows", "row-and-column-slice", "transposed",
         "one-column", "one-row", "middle-of-3d"],
)
def test_strided_views(view):
    for legacy in (False, True):
        got = lowbit.cast(Wrapped(view, legacy_only=legacy), "e4m3fn", rounding="toward_zero")
        assert np.array_equal(got, lowbit.cast(np.ascontiguousarray(view), "e4m3fn",
                                               rounding="toward_zero"))


def test_many_dimensions_when_contiguous():
    x = RNG.standard_normal((2,) * 10).astype(np.float32)
    assert np.array_equal(lowbit.cast(Wrapped(x), "e4m3fn"), lowbit.cast(x, "e4m3fn"))
    with pytest.raises(ValueError, match=r"^x: a non-contiguous array has at most 8 dimensions"):
        lowbit.cast(Wrapped(x[..., ::-1]), "e4m3fn")


def test_capsule_is_renamed_and_the_deleter_runs_once():
    for versioned in (True, False):
        f = Fake(X, versioned=versioned)
        assert np.array_equal(lowbit.cast(f, "e4m3fn"), lowbit.cast(X, "e4m3fn"))
        assert f.deleted == 1
        assert [capsule_name(c) for c in f.capsules] == [
            "used_dltensor_versioned" if versioned else "used_dltensor"]


def test_null_strides_mean_row_major():
    f = Fake(X, strides=None)
    assert np.array_equal(lowbit.cast(f, "e5m2"), lowbit.cast(X, "e5m2"))
    d = _core._describe(Fake(X, strides=None))
    assert d["shape"] == (6, 10) and d["strides"] == (10, 1) and d["contiguous"]
    scalar = np.array(3.0, np.float32)
    assert lowbit.cast(Fake(scalar, strides=None), "e4m3fn").shape == ()


def test_byte_offset_is_added_to_data():
    f = Fake(X, byte_offset=64)
    d = _core._describe(Fake(X, byte_offset=64))
    assert d["data"] == X.ctypes.data
    assert np.array_equal(lowbit.cast(f, "e4m3fn"), lowbit.cast(X, "e4m3fn"))


def test_dtypes_from_dlpack():
    bf = X.astype(ml_dtypes.bfloat16)
    f = Fake(bf, code=4, bits=16)  # kDLBfloat
    assert _core._describe(Fake(bf, code=4, bits=16))["dtype"] == "bfloat16"
    assert np.array_equal(lowbit.cast(f, "e4m3fn"), lowbit.cast(bf, "e4m3fn"))
    for dt, name in [(np.float16, "float16"), (np.float64, "float64"), (np.uint8, "uint8"),
                     (np.int8, "int8"), (np.uint16, "uint16"), (np.uint32, "uint32"),
                     (np.int64, "int64")]:
        assert _core._describe(Fake(X.astype(dt)))["dtype"] == name
    codes = lowbit.cast(X, "float16")
    assert np.array_equal(lowbit.decode(Fake(codes), "float16"), lowbit.decode(codes, "float16"))


@pytest.mark.parametrize(
    "fields, pattern",
    [
        (dict(lanes=4), r"^x: dtype float32x4 is not supported"),
        (dict(code=5, bits=64), r"^x: dtype complex64 is not supported; expected float32, "
                                r"float64, float16 or bfloat16"),
        (dict(code=6, bits=8), r"^x: dtype bool8 is not supported"),
        (dict(code=2, bits=8), r"^x: dtype float8 is not supported"),
        (dict(version=(2, 0)), r"^x: the producer's DLPack 2\.0 is newer than this lowbit"),
    ],
)
def test_refused_after_the_capsule_is_taken_still_deletes_it(fields, pattern):
    f = Fake(X, **fields)
    with pytest.raises(TypeError, match=pattern):
        lowbit.cast(f, "e4m3fn")
    assert f.deleted == 1
    assert capsule_name(f.capsules[0]).startswith("used_")


def test_misaligned_and_odd_tensors():
    with pytest.raises(ValueError, match=r"^x: the data is not aligned to its 4-byte items"):
        lowbit.cast(Fake(X, data=X.ctypes.data + 1), "e4m3fn")
    with pytest.raises(ValueError, match=r"^x: the DLPack tensor has no valid shape"):
        lowbit.cast(Fake(X, ndim=-1), "e4m3fn")
    empty = np.empty((0, 3), np.float32)
    f = Fake(empty, data=0)
    got = lowbit.cast(f, "e4m3fn")
    assert got.shape == (0, 3) and f.deleted == 1


def test_read_only_tensors_are_read_but_never_written():
    f = Fake(X, read_only=True)
    assert _core._describe(Fake(X, read_only=True))["read_only"] is True
    codes, pair = lowbit.quantize_delayed(f, np.zeros(4, np.float32), "e4m3fn")
    assert codes.shape == X.shape and f.deleted == 1
    history = np.zeros(4, np.float32)
    h = Fake(history, read_only=True)
    with pytest.raises(ValueError, match=r"^history: the tensor is read-only"):
        lowbit.quantize_delayed(X, h, "e4m3fn")
    assert h.deleted == 1 and not history.any()
    history.flags.writeable = False
    with pytest.raises(ValueError, match=r"^history: the array is read-only"):
        lowbit.quantize_delayed(X, history, "e4m3fn")


def test_devices_other_than_cpu_and_cuda_are_refused_before_export():
    for device, name in [((8, 0), "Metal"), ((10, 1), "ROCm"), ((4, 0), "OpenCL"),
                         ((99, 0), "an unknown device")]:
        f = Fake(X, device=device)
        with pytest.raises(TypeError, match=rf"^x: memory on {name} \(DLPack device type"):
            lowbit.cast(f, "e4m3fn")
        assert f.dlpack_calls == []
    # The compiled module refuses them on its own too.
    with pytest.raises(TypeError, match=r"^codes: memory on Vulkan"):
        _core._describe(Fake(X, device=(7, 0)), "codes")
    # Pinned host memory is CPU memory.
    assert _core._describe(Fake(X, device=(3, 0)))["device"] == "cpu"


def test_the_capsule_says_where_the_memory_is():
    # A producer whose capsule disagrees with __dlpack_device__: the capsule wins.
    class Liar(Fake):
        def __dlpack_device__(self):
            return (1, 0)

    f = Liar(X, device=(9, 0))
    with pytest.raises(TypeError, match=r"^x: memory on VPI"):
        lowbit.cast(f, "e4m3fn")
    assert f.deleted == 1


@pytest.mark.skipif(_core.cuda_built(), reason="checks the CPU-only build's message")
def test_cuda_arrays_in_a_build_without_cuda():
    with pytest.raises(RuntimeError, match=r"^x: a CUDA array \(cuda:1\), but this lowbit build "
                                           r"has no CUDA kernels"):
        lowbit.cast(Fake(X, device=(2, 1)), "e4m3fn")
    with pytest.raises(RuntimeError, match=r"^history: a CUDA array \(cuda:0\)"):
        lowbit.quantize_delayed(X, Fake(np.zeros(4, np.float32), device=(2, 0)), "e4m3fn")
    with pytest.raises(RuntimeError, match=r"^x: a CUDA tensor \(cuda:0\), but this lowbit"):
        _core._describe(Fake(X, device=(2, 0)))


@pytest.mark.skipif(not _core.cuda_built(), reason="needs a build with CUDA kernels")
def test_cuda_device_numbers_the_process_does_not_see():
    n = _core.cuda_device_count()
    with pytest.raises(ValueError, match=rf"^x: a CUDA array on cuda:{n}, but this process sees "
                                         rf"{n} CUDA device"):
        lowbit.cast(Fake(X, device=(2, n)), "e4m3fn")


@pytest.mark.skipif(not _core.cuda_built(), reason="needs a build with CUDA kernels")
def test_mixed_devices_are_refused():
    with pytest.raises(ValueError, match=r"^history is on cuda:0 but x is on cpu; every array "):
        lowbit.quantize_delayed(X, Fake(np.zeros(4, np.float32), device=(2, 0)), "e4m3fn")


def test_broken_producers():
    class NotACapsule(Wrapped):
        def __dlpack__(self, stream=None, **kwargs):
            return 42

    class Raises(Wrapped):
        def __dlpack__(self, stream=None, **kwargs):
            raise RuntimeError("cannot export this")

    class BadDevice(Wrapped):
        def __dlpack_device__(self):
            return "cpu"

    with pytest.raises(TypeError, match=r"^x: NotACapsule.__dlpack__\(\) returned int, not an "
                                        r"unused DLPack capsule"):
        lowbit.cast(NotACapsule(X), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: Raises.__dlpack__\(\) failed: .*cannot export"):
        lowbit.cast(Raises(X), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: BadDevice.__dlpack_device__\(\)"):
        lowbit.cast(BadDevice(X), "e4m3fn")
    with pytest.raises(TypeError, match=r"^x: BadDevice.__dlpack_device__\(\)"):
        _core._describe(BadDevice(X))

    class NoShape(Wrapped):
        def __init__(self, a):
            super().__init__(a)
            del self.shape

    # The module reads the shape from the DLPack tensor, so the attribute is not needed.
    assert np.array_equal(lowbit.cast(NoShape(X), "e4m3fn"), lowbit.cast(X, "e4m3fn"))


def test_a_used_capsule_is_not_taken_twice():
    class Reuses(Wrapped):
        def __dlpack__(self, stream=None, **kwargs):
            if not hasattr(self, "cap"):
                self.cap = self.a.__dlpack__()
            return self.cap

    r = Reuses(X)
    lowbit.cast(r, "e4m3fn")
    with pytest.raises(TypeError, match=r"not an unused DLPack capsule"):
        lowbit.cast(r, "e4m3fn")


def test_every_function_takes_dlpack_producers():
    w = Wrapped
    x = X
    assert np.array_equal(lowbit.decode(w(lowbit.cast(x, "e5m2")), "e5m2"),
                          lowbit.decode(lowbit.cast(x, "e5m2"), "e5m2"))
    for g in ["tensor", "rows", "columns", ("blocks", 4), ("tiles", 4, 3)]:
        c1, s1 = lowbit.quantize(w(x), "e4m3fn", g)
        c2, s2 = lowbit.quantize(x, "e4m3fn", g)
        assert np.array_equal(c1, c2) and np.array_equal(s1, s2)
        assert np.array_equal(lowbit.dequantize(w(c1), w(s1), "e4m3fn", g),
                              lowbit.dequantize(c2, s2, "e4m3fn", g))
    q = np.array([3.0], np.float32)
    assert np.array_equal(lowbit.cast_scaled(w(x), w(q), "int8"), lowbit.cast_scaled(x, q, "int8"))
    h1, h2 = np.zeros(3, np.float32), np.zeros(3, np.float32)
    h1[0] = h2[0] = 50
    c1, p1 = lowbit.quantize_delayed(w(x), w(h1), "e5m2")
    c2, p2 = lowbit.quantize_delayed(x, h2, "e5m2")
    assert np.array_equal(c1, c2) and np.array_equal(p1, p2) and np.array_equal(h1, h2)
    assert h1[0] == np.abs(x).max() and h1[1] == 50  # updated in place, through DLPack
    c1, s1 = lowbit.quantize_mx(w(x), "e2m1fn", 4)
    c2, s2 = lowbit.quantize_mx(x, "e2m1fn", 4)
    assert np.array_equal(c1, c2) and np.array_equal(s1, s2)
    assert np.array_equal(lowbit.dequantize_mx(w(c1), w(s1), "e2m1fn", 4),
                          lowbit.dequantize_mx(c2, s2, "e2m1fn", 4))


def test_numpy_arrays_mix_with_other_cpu_producers():
    q = np.array([3.0], np.float32)
    assert np.array_equal(lowbit.cast_scaled(Wrapped(X), q, "int8"),
                          lowbit.cast_scaled(X, Wrapped(q), "int8"))
