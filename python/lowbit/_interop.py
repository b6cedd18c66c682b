"""Array interop: where each array argument lives, who allocates the results, which CUDA stream
the work runs on.

Every public function takes numpy arrays and DLPack producers (PyTorch, CuPy, JAX, ...). The
compiled module reads them without copies (numpy through the buffer protocol, the others through
DLPack capsules) and writes into results that this module allocates in the caller's library:

- numpy arrays, lists, Python scalars: numpy results;
- torch.Tensor: torch tensors on the same device (``torch.empty``); CUDA work runs on
  ``torch.cuda.current_stream(device)``;
- cupy.ndarray: cupy arrays on the same device; CUDA work runs on
  ``cupy.cuda.get_current_stream()``;
- any other DLPack producer: results allocated by numpy (CPU) or by torch, else cupy (CUDA; on
  that library's current stream), then handed to the producer's array namespace
  (``type(x).__array_namespace__().from_dlpack``) when it has one, so that a JAX array in gives
  a JAX array out; without a namespace the numpy/torch/cupy result is returned. A namespace that
  would change the results' dtype (JAX without jax_enable_x64 holds no float64) is a TypeError.

Arguments updated in place (``quantize_delayed``'s history) are never JAX arrays: JAX arrays are
immutable, and their legacy DLPack capsules carry no read-only flag that the compiled module could
check, so they are refused with a ValueError here.

torch and cupy are never imported by ``import lowbit``: an argument can only be a torch tensor
when torch is already imported (``sys.modules``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from lowbit import _core

def torch_stream(torch: Any, index: Optional[int]) -> int:
    """The raw handle of torch's current stream on CUDA device `index` (None: the current
    device, as in a torch.device("cuda") without an index), as an int: from
    torch._C._cuda_getCurrentRawStream where this torch has it (under a microsecond; building
    the torch.cuda.Stream object of torch.cuda.current_stream costs about 6 us of host time a
    call, several times per layer step), else through the public API."""
    if index is None:
        index = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(index))
    return int(torch.cuda.current_stream(index).cuda_stream)


# DLPack device types (the DLDeviceType enum of the DLPack ABI).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
             10: "ROCm", 11: "ROCmHost", 12: "ExtDev", 13: "CUDAManaged", 14: "OneAPI",
             15: "WebGPU", 16: "Hexagon", 17: "MAIA"}


@dataclass(frozen=True)
class Device:
    """Where an argument's memory is: ("cpu", 0) or ("cuda", index)."""

    type: str
    index: int = 0

    def __str__(self) -> str:
        return "cpu" if self.type == "cpu" else f"{self.type}:{self.index}"


CPU = Device("cpu")


def _module(name: str) -> Any:
    # The library of an argument is imported already if the argument is one of its arrays.
    return sys.modules.get(name)


def is_torch(value: Any) -> bool:
    torch = _module("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def is_numpy(value: Any) -> bool:
    np = _module("numpy")
    return np is not None and isinstance(value, np.ndarray)


def is_cupy(value: Any) -> bool:
    cupy = _module("cupy")
    return cupy is not None and isinstance(value, cupy.ndarray)


def is_jax(value: Any) -> bool:
    array = getattr(_module("jax"), "Array", None)  # jax.Array arrived in JAX 0.4.1
    return array is not None and isinstance(value, array)


def is_torch_dtype(value: Any) -> bool:
    torch = _module("torch")
    return torch is not None and isinstance(value, torch.dtype)


def is_array(value: Any) -> bool:
    """A numpy array or a DLPack producer (passed to the compiled module as is)."""
    return isinstance(value, np.ndarray) or hasattr(type(value), "__dlpack__")


def _dl_device(name: str, kind: int, index: int) -> Device:
    if kind in (_DL_CPU, _DL_CUDA_HOST):
        return CPU
    if kind in (_DL_CUDA, _DL_CUDA_MANAGED):
        return Device("cuda", int(index))
    raise TypeError(f"{name}: memory on {_DL_NAMES.get(kind, 'an unknown device')} (DLPack "
                    f"device type {kind}) is not supported; expected CPU or CUDA memory")


def device_of(name: str, value: Any) -> Device:
    """The device of an array argument; TypeError (naming it) for devices lowbit cannot use."""
    if isinstance(value, np.ndarray):
        return CPU
    if is_torch(value):
        dev = value.device
        if dev.type == "cpu":
            return CPU
        if dev.type == "cuda":
            return Device("cuda", dev.index if dev.index is not None else 0)
        raise TypeError(f"{name}: torch tensors on {dev.type} are not supported; expected CPU or "
                        "CUDA tensors")
    if is_cupy(value):
        return Device("cuda", int(value.device.id))
    get = getattr(value, "__dlpack_device__", None)
    if get is None:
        return CPU  # a producer without __dlpack_device__ is taken to be on the CPU
    try:
        kind, index = get()
        kind, index = int(kind), int(index)
    except Exception as e:  # a broken producer: report it against the argument
        raise TypeError(f"{name}: {type(value).__name__}.__dlpack_device__() did not return "
                        f"(device_type, id): {e}") from None
    return _dl_device(name, kind, index)


def shape_of(name: str, value: Any) -> tuple[int, ...]:
    shape = getattr(value, "shape", None)
    if shape is None:
        raise TypeError(f"{name}: a DLPack producer without a .shape attribute "
                        f"({type(value).__name__}); pass a numpy, torch or cupy array")
    return tuple(int(s) for s in shape)


class OutOfRange(OverflowError, ValueError):
    """A Python number that does not fit the array's dtype (both an OverflowError, as numpy
    raises it, and a ValueError, as lowbit reports values outside their domain)."""


def as_numpy(name: str, value: Any, dtype: Any = None) -> np.ndarray:
    """A non-array argument (list, Python scalar) as a numpy array."""
    if isinstance(value, np.ndarray) and dtype is None:
        return value
    try:
        if dtype is not None:
            given = np.asarray(value).dtype
            kind = given.kind
            if kind == "V" and given.name.startswith(("float", "bfloat")):
                kind = "f"  # ml_dtypes' floats (float8_e4m3fn, bfloat16, ...): real numbers
            want = np.dtype(dtype).kind
            # numpy would truncate floats (and drop imaginary parts) without a word.
            if (want in "iu" and kind not in "iu") or (want == "f" and kind not in "iuf"):
                raise TypeError(f"{name}: expected {'integers' if want in 'iu' else 'real numbers'}"
                                f" for a {np.dtype(dtype).name} array, got {type(value).__name__}"
                                f" of {np.asarray(value).dtype}")
        with np.errstate(over="ignore"):  # float32 overflow gives +-Inf, like any float32 cast
            return np.asarray(value, dtype=dtype)
    except OverflowError as e:
        raise OutOfRange(f"{name}: {e}") from None
    except (TypeError, ValueError) as e:
        if str(e).startswith(f"{name}: "):
            raise
        raise TypeError(f"{name}: expected an array, got {type(value).__name__} that numpy "
                        f"cannot convert ({e})") from None


# ---- who allocates results -------------------------------------------------------------------


class _Backend:
    """Allocates the results of one call and knows the stream its CUDA work runs on."""

    device: Device = CPU

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def stream(self) -> int:
        return 0

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        raise NotImplementedError

    def asarray(self, name: str, value: Any, dtype: str) -> Any:
        raise NotImplementedError

    def result(self, value: Any) -> Any:
        return value

    def to_host(self, value: Any) -> Any:
        """A host copy of a CUDA array of this device, made on the current stream."""
        raise NotImplementedError


class _Numpy(_Backend):
    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return np.empty(tuple(shape), dtype=dtype)

    def asarray(self, name: str, value: Any, dtype: str) -> Any:
        return as_numpy(name, value, dtype)


class _Torch(_Backend):
    def __init__(self, device: Device) -> None:
        self.torch = _module("torch")
        if self.torch is None:
            import torch  # only reached for CUDA arrays of other libraries

            self.torch = torch
        self.device = device
        self.torch_device = self.torch.device(str(device))

    def context(self) -> contextlib.AbstractContextManager[Any]:
        if self.device.type == "cuda":
            return self.torch.cuda.device(self.device.index)
        return contextlib.nullcontext()

    def stream(self) -> int:
        if self.device.type != "cuda":
            return 0
        return torch_stream(self.torch, self.device.index)

    def _dtype(self, dtype: str) -> Any:
        t = getattr(self.torch, dtype, None)
        if t is None:  # torch.uint16 and torch.uint32 arrived in PyTorch 2.3
            raise TypeError(f"results of dtype {dtype} need PyTorch >= 2.3 (this is "
                            f"{self.torch.__version__}, without torch.{dtype})")
        return t

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.torch.empty(tuple(shape), dtype=self._dtype(dtype), device=self.torch_device)

    def asarray(self, name: str, value: Any, dtype: str) -> Any:
        try:
            return self.torch.as_tensor(value, dtype=self._dtype(dtype), device=self.torch_device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{name}: expected an array, got {type(value).__name__} that torch "
                            f"cannot convert ({e})") from None

    def to_host(self, value: Any) -> Any:
        # from_dlpack hands the producer the current stream; .cpu() copies on it and waits.
        tensor = value if is_torch(value) else self.torch.from_dlpack(value)
        return tensor.cpu()


class _Cupy(_Backend):
    def __init__(self, device: Device) -> None:
        self.cupy = _module("cupy")
        if self.cupy is None:
            import cupy  # only reached for CUDA arrays of other libraries

            self.cupy = cupy
        self.device = device

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return self.cupy.cuda.Device(self.device.index)

    def stream(self) -> int:
        return int(self.cupy.cuda.get_current_stream().ptr)

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.cupy.empty(tuple(shape), dtype=dtype)

    def asarray(self, name: str, value: Any, dtype: str) -> Any:
        try:
            with self.cupy.cuda.Device(self.device.index):
                return self.cupy.asarray(value, dtype=dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{name}: expected an array, got {type(value).__name__} that cupy "
                            f"cannot convert ({e})") from None

    def to_host(self, value: Any) -> Any:
        array = value if is_cupy(value) else self.cupy.from_dlpack(value)
        stream = self.cupy.cuda.get_current_stream()
        host = self.cupy.asnumpy(array, stream=stream)
        stream.synchronize()
        return host


class _Foreign(_Backend):
    """Another DLPack producer: results come back through its array namespace, if any."""

    def __init__(self, inner: _Backend, like: Any) -> None:
        self.inner = inner
        self.device = inner.device
        namespace = getattr(like, "__array_namespace__", None)
        self.from_dlpack = None
        self.library = type(like).__name__
        if namespace is not None:
            ns = namespace()
            self.from_dlpack = getattr(ns, "from_dlpack", None)
            self.library = getattr(ns, "__name__", self.library)

    def context(self) -> contextlib.AbstractContextManager[Any]:
        return self.inner.context()

    def stream(self) -> int:
        return self.inner.stream()

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.inner.empty(shape, dtype)

    def asarray(self, name: str, value: Any, dtype: str) -> Any:
        return self.inner.asarray(name, value, dtype)

    def result(self, value: Any) -> Any:
        if self.from_dlpack is None:
            return value
        converted = self.from_dlpack(value)
        # A namespace may turn a dtype it cannot hold into another one: JAX without
        # jax_enable_x64 makes float64 results float32 (flushing subnormals on the way). Other
        # values than the computed ones are never handed back.
        want, got = _dtype_name(value.dtype), _dtype_name(getattr(converted, "dtype", None))
        if want is not None and got is not None and got != want:
            raise TypeError(f"dtype {want}: {self.library}.from_dlpack turned the {want} results "
                            f"into {got}; ask for a dtype that {self.library} holds (JAX holds "
                            "float64 only with jax_enable_x64)")
        return converted

    def to_host(self, value: Any) -> Any:
        return self.inner.to_host(value)


def _dtype_name(dtype: Any) -> str | None:
    """numpy's name of a numpy, JAX or torch dtype; None for dtypes numpy cannot describe (they
    are not compared)."""
    if dtype is None:
        return None
    if is_torch_dtype(dtype):
        return str(dtype).removeprefix("torch.")
    try:
        return np.dtype(dtype).name
    except (TypeError, ValueError):
        return None


def _cuda_allocator(name: str, device: Device) -> _Backend:
    # For CUDA arrays of a library that lowbit cannot allocate with (JAX, ...).
    for make in (_Torch, _Cupy):
        try:
            return make(device)
        except ImportError:
            continue
    raise TypeError(f"{name}: lowbit allocates results for CUDA arrays of other libraries, and "
                    "copies them, with torch or cupy, and neither is installed; install one, or "
                    "pass torch or cupy arrays")


def _backend(name: str, value: Any, device: Device) -> _Backend:
    if isinstance(value, np.ndarray):
        return _Numpy()
    if is_torch(value):
        return _Torch(device)
    if is_cupy(value):
        return _Cupy(device)
    inner = _Numpy() if device.type == "cpu" else _cuda_allocator(name, device)
    return _Foreign(inner, value)


# ---- one call ----------------------------------------------------------------------------------


def _usable(name: str, device: Device, first: bool = True) -> Device:
    # Checked before anything is allocated (allocating CUDA results would need torch or cupy).
    # The device number only for the first array: the others must be on its device.
    if device.type == "cuda" and not _core.cuda_built():
        raise RuntimeError(f"{name}: a CUDA array ({device}), but this lowbit build has no CUDA "
                           "kernels; rebuild with LOWBIT_ENABLE_CUDA=ON or pass CPU arrays")
    if device.type == "cuda" and first:
        count = _core.cuda_device_count()
        if not 0 <= device.index < count:
            raise ValueError(f"{name}: a CUDA array on {device}, but this process sees {count} "
                             f"CUDA device{'' if count == 1 else 's'}")
    return device


def _strided_layout(value: Any) -> tuple[int, tuple, tuple, int] | None:
    """(pointer, shape, byte strides, item size) of a numpy array, a torch tensor or an array
    with __cuda_array_interface__ (CuPy, Numba; strides None there means C order), or None."""
    if is_numpy(value):
        return value.__array_interface__["data"][0], tuple(value.shape), tuple(value.strides), \
            value.itemsize
    if is_torch(value):
        item = value.element_size()
        return value.data_ptr(), tuple(value.shape), tuple(st * item for st in value.stride()), \
            item
    cai = getattr(value, "__cuda_array_interface__", None)
    if not isinstance(cai, dict):
        return None
    import numpy as np

    shape = tuple(cai["shape"])
    item = np.dtype(cai["typestr"]).itemsize
    strides = cai.get("strides")
    if strides is None:
        strides, step = [], item
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    return cai["data"][0], shape, tuple(strides), item


def _byte_range(value: Any) -> tuple[int, int] | None:
    """[first, last + 1) byte addresses that a numpy, torch or CUDA-array-interface array's
    elements span, or None for empty and other arrays (their overlap is not checked)."""
    layout = _strided_layout(value)
    if layout is None:
        return None
    start, shape, strides, item = layout
    if any(n == 0 for n in shape):
        return None
    low = sum((n - 1) * st for n, st in zip(shape, strides) if st < 0)
    high = sum((n - 1) * st for n, st in zip(shape, strides) if st > 0)
    return start + low, start + high + item


def _check_output(name: str, out: Any, others: list[tuple[str, Any]]) -> None:
    """An array written in place must not overlap itself (a zero stride: several elements in
    one place) nor any other argument of the call (the kernels would read what they already
    wrote): refused, as the results would depend on the order of the writes."""
    _, shape, strides, _ = _strided_layout(out) or (0, (), (), 0)
    if any(st == 0 and n > 1 for n, st in zip(shape, strides)):
        raise ValueError(f"{name}: its elements overlap (a stride of 0, as in a broadcast or "
                         "expanded array); pass an array with a place for each element")
    mine = _byte_range(out)
    if mine is None:
        return
    for other_name, other in others:
        theirs = _byte_range(other)
        if theirs is not None and mine[0] < theirs[1] and theirs[0] < mine[1]:
            raise ValueError(f"{name} overlaps {other_name} in memory; pass an array that "
                             f"shares no memory with the inputs")


class Call:
    """The array arguments of one call: resolved, on one device, with the backend that allocates
    the results. The first argument decides the result type ("the caller's array type").

    ``arrays`` are (name, value, dtype) triples; dtype (or None) converts non-array values of
    the first argument with numpy and of the others with the backend (so that a Python float
    scale next to a CUDA tensor becomes a CUDA tensor).
    """

    def __init__(self, *arrays: tuple[str, Any, str | None], inplace: Sequence[str] = (),
                 any_layout: Sequence[str] = ()) -> None:
        self._any_layout = tuple(any_layout)
        first_name, first, first_dtype = arrays[0]
        if not is_array(first):
            first = as_numpy(first_name, first, first_dtype)
        self.device = _usable(first_name, device_of(first_name, first))
        self.values: dict[str, Any] = {first_name: self._readable(first_name, first, inplace)}
        self.backend = _backend(first_name, first, self.device)
        for name, value, dtype in arrays[1:]:
            if not is_array(value):
                if name in inplace:
                    raise TypeError(f"{name}: expected an array (it is updated in place), got "
                                    f"{type(value).__name__}")
                value = self.backend.asarray(name, value, dtype or "float32")
            dev = _usable(name, device_of(name, value), first=False)
            if dev != self.device:
                raise ValueError(f"{name} is on {dev} but {first_name} is on {self.device}; "
                                 "every array argument must be on the same device")
            self.values[name] = self._readable(name, value, inplace)
        for name in inplace:
            if name in self.values:
                _check_output(name, self.values[name],
                              [(n, v) for n, v in self.values.items() if n != name])
        self._stack: contextlib.ExitStack | None = None
        self.stream = 0

    def _readable(self, name: str, value: Any, inplace: Sequence[str]) -> Any:
        if name in inplace and is_jax(value):
            # JAX exports legacy capsules, which carry no read-only flag, so the compiled module
            # would write into the array; JAX assumes its arrays never change.
            raise ValueError(f"{name}: JAX arrays are immutable, but this function updates "
                             f"{name} in place; pass a writable numpy array (torch or cupy for "
                             "CUDA) and convert it with jax.numpy.asarray afterwards")
        # cast and decode read any layout on the CPU; the CUDA kernels read matrices whose rows
        # may be strided but whose last dimension is contiguous. So that the same call works on
        # both, CUDA arguments named in `any_layout` with another layout are copied to C order
        # first (on the caller's stream, by the array's own library). Results do not depend on
        # layout: elements are indexed in logical row-major order. Other arguments are passed as
        # they are and unsupported layouts get the kernels' ValueError.
        if name in inplace and is_torch(value) and value.is_neg():
            raise ValueError(f"{name}: a torch negative view (is_neg()); write into a plain "
                             "tensor")
        value = self._plain(value)
        if self.device.type != "cuda" or name in inplace or name not in self._any_layout:
            return value
        shape = getattr(value, "shape", ())
        if len(shape) == 0 or shape[-1] <= 1:
            return value
        if is_torch(value):
            return value if value.stride(-1) == 1 else value.contiguous()
        if is_cupy(value):
            item = value.dtype.itemsize
            if value.strides[-1] != item:
                import cupy

                return cupy.ascontiguousarray(value)
        return value

    @staticmethod
    def _plain(value: Any) -> Any:
        if is_torch(value):
            # Tensors that require grad refuse to export through DLPack; the data is the same.
            if value.requires_grad:
                value = value.detach()
            # A lazily negated view (x.conj().imag, torch._neg_view) holds -x in its memory,
            # which DLPack exports as it is: read its values instead.
            if value.is_neg():
                value = value.resolve_neg()
        return value

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return shape_of(name, self.values[name])

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.backend.empty(shape, dtype)

    def result(self, value: Any) -> Any:
        return self.backend.result(value)

    def __enter__(self) -> Call:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(self.backend.context())
        self.stream = self.backend.stream()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._stack is not None
        self._stack.close()


call = Call  # `with _interop.call(("x", x, None)) as c:`


# ---- host copies -------------------------------------------------------------------------------


def to_host(name: str, value: Any) -> Any:
    """An array argument in host memory: numpy arrays and CPU producers as they are (read in
    place later), CUDA arrays copied on the caller's current stream, waiting for the copy: torch
    tensors to CPU tensors, cupy arrays to numpy arrays, other producers through torch (else
    cupy). TypeError, naming the argument, for memory on other devices."""
    if isinstance(value, np.ndarray):
        return value
    value = Call._plain(value)
    device = device_of(name, value)
    if device.type == "cpu":
        return value
    backend = _backend(name, value, device)
    with backend.context():
        return backend.to_host(value)


def to_numpy(name: str, value: Any) -> np.ndarray:
    """A host array (numpy or a CPU DLPack producer) as a numpy array, read in place; bfloat16,
    which numpy's DLPack import does not know, becomes its float32 values (exact)."""
    if isinstance(value, np.ndarray):
        return value
    value = Call._plain(value)
    # The module's own intake first: its errors name the argument, as everywhere else.
    if _core._describe(value, name)["dtype"] != "bfloat16":
        return np.from_dlpack(value)
    if is_torch(value):
        return value.float().numpy()
    from lowbit._api import cast  # float32 codes are the float32 bits

    return to_numpy(name, cast(value, "float32")).view(np.float32)
