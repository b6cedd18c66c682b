"""Formats as dtypes: ml_dtypes' and PyTorch's low-precision dtypes as lowbit formats.

A format argument may be a :class:`lowbit.Format`, a lowbit name ("e4m3fn"), an ml_dtypes name
("float8_e4m3fn"), a numpy dtype or dtype type (``ml_dtypes.float8_e4m3fn``,
``np.dtype("float16")``) or a torch dtype (``torch.float8_e4m3fn``). A dtype maps to a lowbit
format only where every bit pattern means the same value in both (python/tests/test_dtypes.py
decodes every code both ways). Arrays of those dtypes are codes of their format:
:func:`codes_of` views them as unsigned integers, :func:`typed` views codes as the dtype, both
without copies.

torch is never imported here: a torch object can only reach these functions when torch is
imported already (``sys.modules``). ml_dtypes is imported only by :func:`typed`, for numpy codes
of a format that numpy itself has no dtype for.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from lowbit import _core
from lowbit._core import Format

# dtype name (ml_dtypes', numpy's and torch's spelling; torch's names are ml_dtypes') -> the
# lowbit format spelled in lowbit's grammar. e5m3fnu has no lowbit name: unsigned, bias 15,
# NaN at all-ones, no Inf (ml_dtypes' float8_e5m3fnu).
_BY_DTYPE_NAME = {
    "float8_e4m3fn": "e4m3fn",
    "float8_e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz",
    "float8_e5m2fnuz": "e5m2fnuz",
    "float8_e4m3b11fnuz": "e4m3b11fnuz",
    "float8_e4m3": "e4m3",
    "float8_e3m4": "e3m4",
    "float8_e5m3fnu": "e5m3b15_fn_unsigned",
    "float8_e8m0fnu": "e8m0fnu",
    "float6_e3m2fn": "e3m2fn",
    "float6_e2m3fn": "e2m3fn",
    "float4_e2m1fn": "e2m1fn",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "float32": "float32",
}

# Names numpy itself has types for; the others need ml_dtypes.
_NUMPY_NATIVE = ("float16", "float32")

# torch dtypes that look like formats but are not one element per byte or per word.
_TORCH_PACKED = {
    "float4_e2m1fn_x2": "packs two e2m1fn codes into each byte (high and low nibble); unpack "
                        "them into one code per uint8 and pass fmt='e2m1fn'",
}

# 16-bit floats are codes or values depending on the call; float32 arrays are always values.
_WIDE = ("bfloat16", "float16")

_formats: dict[str, Format] = {}


def _format_of_dtype_name(name: str) -> Optional[Format]:
    spelled = _BY_DTYPE_NAME.get(name)
    if spelled is None:
        return None
    f = _formats.get(name)
    if f is None:
        f = _formats[name] = _core.parse_format(spelled)
    return f


def _dtype_name_of_format(fmt: Format) -> Optional[str]:
    """The dtype name (ml_dtypes' spelling) of a format, or None where no dtype holds it."""
    for name in _BY_DTYPE_NAME:
        if _format_of_dtype_name(name) == fmt:
            return name
    return None


def _torch_module() -> Any:
    return sys.modules.get("torch")


def _is_torch_dtype(value: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(value, torch.dtype)


def _is_torch_tensor(value: Any) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(value, torch.Tensor)


def _no_format(arg: str, shown: str, name: str) -> ValueError:
    if name in _TORCH_PACKED:
        return ValueError(f"{arg}: {shown} {_TORCH_PACKED[name]}")
    if name.startswith(("int", "uint", "qint", "quint")):
        return ValueError(f"{arg}: {shown} is an integer dtype, not a number format; integer "
                          "quantization targets are named: 'int8', 'int8_sym', 'uint8', 'int4', "
                          "'int4_sym', 'uint4'")
    return ValueError(f"{arg}: {shown} has no lowbit format (dtypes with one: "
                      f"{', '.join(_BY_DTYPE_NAME)}); for other formats pass a lowbit name or a "
                      "lowbit.Format")


def resolve_format(value: Any, arg: str = "fmt") -> Format:
    """The lowbit :class:`Format` that ``value`` names.

    value: a Format (returned as is); a lowbit name or format spelling (``"e4m3fn"``,
        ``"e5m2b11_fnuz"``, see :func:`lowbit.parse_format`); an ml_dtypes or numpy dtype name
        (``"float8_e4m3fn"``, ``"bfloat16"``, ``"float16"``); a numpy dtype or dtype type
        (``ml_dtypes.float8_e5m2``, ``np.float16``, ``np.dtype("float32")``); a torch dtype
        (``torch.float8_e4m3fn``, ``torch.float8_e5m2``, ``torch.float8_e4m3fnuz``,
        ``torch.float8_e5m2fnuz``, ``torch.float8_e8m0fnu``, ``torch.bfloat16``,
        ``torch.float16``, ``torch.float32``).
    arg: the argument's name, for the messages.

    TypeError for values of other types, ValueError for unknown names and for dtypes that have
    no lowbit format (float64, integer dtypes, ``torch.float4_e2m1fn_x2``, which packs two codes
    per byte).
    """
    if isinstance(value, Format):
        return value
    if isinstance(value, str):
        f = _format_of_dtype_name(value)
        if f is not None:
            return f
        try:
            return _core.parse_format(value)
        except ValueError as e:
            message = str(e)
            if message.startswith(f"{arg}:"):
                raise
            raise ValueError(f"{arg}: {message} (ml_dtypes' names are accepted too: "
                             f"{', '.join(_BY_DTYPE_NAME)})") from None
    if _is_torch_dtype(value):
        name = str(value).removeprefix("torch.")
        f = _format_of_dtype_name(name)
        if f is None:
            raise _no_format(arg, str(value), name)
        return f
    dtype = None
    if isinstance(value, np.dtype):
        dtype = value
    elif isinstance(value, type):
        # Scalar types: np.float16, ml_dtypes.float8_e4m3fn, JAX's jnp.float8_e4m3fn.
        try:
            dtype = np.dtype(value)
        except TypeError:
            dtype = None
    if dtype is not None:
        f = _format_of_dtype_name(dtype.name)
        if f is None:
            raise _no_format(arg, f"dtype {dtype.name}", dtype.name)
        return f
    raise TypeError(f"{arg}: expected a format (a name such as 'e4m3fn' or 'float8_e4m3fn', a "
                    f"lowbit.Format, a numpy/ml_dtypes dtype or a torch dtype), got "
                    f"{type(value).__name__}")


def codes_of(array: Any, arg: str = "codes", *, wide: bool = True) -> tuple[Any, Optional[Format]]:
    """An array of a low-precision dtype as its raw codes, and the format those codes are of.

    array: a numpy array of an ml_dtypes type (float8_*, float6_*, float4_*, bfloat16) or of
        float16, or a torch tensor of a float8 type, bfloat16 or float16.
    wide: also take the 16-bit floats (bfloat16, float16) as codes. Where such arrays are values
        rather than codes (verify's candidates), pass False.

    Returns ``(view, format)``: the same memory viewed as uint8 (8-bit and narrower types, one
    code per byte in the low bits) or uint16, no copy, same device and strides; or
    ``(array, None)`` for every other input (float32 and float64 arrays, which are values, integer
    code arrays, lists, other libraries). torch's
    ``float4_e2m1fn_x2`` (two codes per byte) is a ValueError: its bytes are not one code each.
    """
    if isinstance(array, np.ndarray):
        name = array.dtype.name
        f = _format_of_dtype_name(name)
        if f is None or name == "float32" or (not wide and name in _WIDE):
            return array, None
        return array.view(np.dtype(f.code_dtype)), f
    if _is_torch_tensor(array):
        torch = _torch_module()
        name = str(array.dtype).removeprefix("torch.")
        if name in _TORCH_PACKED:
            raise ValueError(f"{arg}: a tensor of {array.dtype}, which {_TORCH_PACKED[name]}")
        f = _format_of_dtype_name(name)
        if f is None or name == "float32" or (not wide and name in _WIDE):
            return array, None
        code_dtype = getattr(torch, f.code_dtype, None)
        if code_dtype is None:  # torch.uint16 and torch.uint32 arrived in PyTorch 2.3
            raise TypeError(f"{arg}: {array.dtype} codes need torch.{f.code_dtype} (PyTorch >= "
                            f"2.3; this is {torch.__version__})")
        if array.requires_grad:  # the codes of a tensor are data, not part of its graph
            array = array.detach()
        if array.is_neg():  # a lazily negated view: its values' codes, not its memory's
            array = array.resolve_neg()
        return array.view(code_dtype), f
    return array, None


def typed(codes: Any, fmt: Any, arg: str = "typed") -> Any:
    """Codes of ``fmt`` viewed as the matching dtype of their library, no copy: numpy codes as
    ml_dtypes arrays (numpy's own float16/float32 where they exist), torch codes as torch
    tensors of the torch dtype (float8 types, bfloat16, float16, float32).

    codes: uint8/uint16/uint32 codes of ``fmt`` (its ``code_dtype``), numpy or torch.
    fmt: any form :func:`resolve_format` accepts.

    TypeError where the library has no dtype for the format (torch has none for e2m1fn, e3m2fn,
    e2m3fn, e4m3, e3m4, e4m3b11fnuz; no library has one for a user-defined format), for codes of
    another dtype, and for arrays of other libraries.
    """
    f = resolve_format(fmt, "fmt")
    name = _dtype_name_of_format(f)
    if name is None:
        raise TypeError(f"{arg}: format {f.name} has no dtype in ml_dtypes or torch; use its raw "
                        "codes")
    if isinstance(codes, np.ndarray):
        if codes.dtype != np.dtype(f.code_dtype):
            raise TypeError(f"{arg}: {f.name} codes are {f.code_dtype}, got {codes.dtype}")
        if name in _NUMPY_NATIVE:
            return codes.view(np.dtype(name))
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"{arg}: numpy arrays of {f.name} are ml_dtypes.{name} arrays, and "
                            "ml_dtypes is not installed (pip install ml_dtypes)") from None
        dtype = getattr(ml_dtypes, name, None)
        if dtype is None:
            raise TypeError(f"{arg}: this ml_dtypes ({ml_dtypes.__version__}) has no {name} for "
                            f"{f.name}")
        return codes.view(dtype)
    if _is_torch_tensor(codes):
        torch = _torch_module()
        want = getattr(torch, f.code_dtype, None)
        if want is None or codes.dtype != want:
            raise TypeError(f"{arg}: {f.name} codes are torch.{f.code_dtype}, got {codes.dtype}")
        dtype = getattr(torch, name, None)
        if dtype is None:
            raise TypeError(f"{arg}: torch {torch.__version__} has no dtype for {f.name} (no "
                            f"torch.{name}); use its raw codes")
        return codes.view(dtype)
    raise TypeError(f"{arg}: typed codes are numpy (ml_dtypes) arrays or torch tensors; got "
                    f"{type(codes).__module__}.{type(codes).__name__}; use the raw codes")
