"""DLPack producers for the tests of lowbit's DLPack import, without torch.

- Wrapped: forwards to a numpy array's own __dlpack__ (versioned or legacy capsules, made by
  numpy), optionally hiding max_version (a producer of the DLPack 0.x era);
- Fake: builds the capsule itself with ctypes from the DLPack ABI, so that a test can set every
  field (device, dtype code and lanes, NULL or odd strides, byte_offset, version, read-only
  flag) and count the calls of the deleter.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np


class Wrapped:
    """Any numpy array as a DLPack producer that is not a numpy array."""

    def __init__(self, a: np.ndarray, legacy_only: bool = False, namespace: Any = None) -> None:
        self.a = a
        self.shape = a.shape
        self.legacy_only = legacy_only
        if namespace is not None:  # the array API's way to find an array's library
            self.__array_namespace__ = lambda api_version=None: namespace
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, stream=None, **kwargs):
        self.calls.append(dict(stream=stream, **kwargs))
        if self.legacy_only and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.a.__dlpack__(stream=stream, **kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class WrappedNamespace:
    """A minimal array namespace: from_dlpack wraps the result back into a Wrapped."""

    @staticmethod
    def from_dlpack(x):
        return Wrapped(np.from_dlpack(x), namespace=WrappedNamespace)


# ---- the ABI, declared from the DLPack specification ----------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER_V),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]

_NUMPY_CODES = {"f": 2, "u": 1, "i": 0, "c": 5, "b": 6}


def capsule_name(capsule: Any) -> str:
    return _capsule_name(capsule).decode()


class Fake:
    """A producer whose capsule is built field by field. Defaults describe ``a`` exactly; keyword
    arguments override single fields. ``deleted`` counts the deleter's calls; ``capsules`` keeps
    the capsules handed out (to check their names afterwards)."""

    def __init__(self, a: np.ndarray, *, device=(1, 0), code=None, bits=None, lanes=1,
                 strides="numpy", byte_offset=0, versioned=True, version=(1, 0), read_only=False,
                 ndim=None, data=None, shape=None) -> None:
        self.a = a
        self.shape = a.shape if shape is None else shape
        self.device = device
        if code is None:  # ml_dtypes' bfloat16 is numpy kind 'V'; DLPack has kDLBfloat (4)
            code = 4 if a.dtype.name == "bfloat16" else _NUMPY_CODES[a.dtype.kind]
        self.code = code
        self.bits = a.dtype.itemsize * 8 if bits is None else bits
        self.lanes = lanes
        self.strides = strides
        self.byte_offset = byte_offset
        self.versioned = versioned
        self.version = version
        self.read_only = read_only
        self.ndim = a.ndim if ndim is None else ndim
        self.data = data
        self.deleted = 0
        self.dlpack_calls: list[dict[str, Any]] = []
        self.capsules: list[Any] = []
        self._keep: list[Any] = []

    def __dlpack_device__(self):
        return self.device

    def _tensor(self) -> DLTensor:
        a = self.a
        shape = (ctypes.c_int64 * max(1, len(self.shape)))(*self.shape)
        if self.strides is None:
            strides_p = ctypes.POINTER(ctypes.c_int64)()
        else:
            values = ([s // a.itemsize for s in a.strides] if self.strides == "numpy"
                      else list(self.strides))
            strides = (ctypes.c_int64 * max(1, len(values)))(*values)
            strides_p = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
            self._keep.append(strides)
        self._keep.append(shape)
        data = a.ctypes.data - self.byte_offset if self.data is None else self.data
        t = DLTensor()
        t.data = data
        t.device = DLDevice(*self.device)
        t.ndim = self.ndim
        t.dtype = DLDataType(self.code, self.bits, self.lanes)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = strides_p
        t.byte_offset = self.byte_offset
        return t

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        self.dlpack_calls.append(dict(stream=stream, max_version=max_version))
        if self.versioned and max_version is not None:
            m = DLManagedTensorVersioned()
            m.version = DLPackVersion(*self.version)
            m.flags = 1 if self.read_only else 0
            m.dl_tensor = self._tensor()

            def delete(_p):
                self.deleted += 1

            callback = DELETER_V(delete)
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor()
            m.dl_tensor = self._tensor()

            def delete(_p):
                self.deleted += 1

            callback = DELETER(delete)
            name = b"dltensor"
        m.deleter = callback
        self._keep += [m, name, callback]
        capsule = _capsule_new(ctypes.addressof(m), name, None)
        self.capsules.append(capsule)
        return capsule
