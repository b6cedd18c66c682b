"""Formats as dtypes (lowbit._dtypes): every accepted spelling of a format, every refused one,
codes_of and typed round trips, and the agreement of each mapped dtype with its lowbit format on
every code (decoded both ways) and on finfo's max, eps and smallest values."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import lowbit
from lowbit._dtypes import codes_of, resolve_format, typed

# ml_dtypes' name -> lowbit's spelling of the same format.
ML = {
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
}
NUMPY = {"float16": "float16", "float32": "float32"}


def _names(names):
    # ml_dtypes added its types over time (float8_e5m3fnu in 0.7): the others are skipped.
    return [pytest.param(n, marks=pytest.mark.skipif(
        not hasattr(ml_dtypes, n) and not hasattr(np, n),
        reason=f"ml_dtypes {ml_dtypes.__version__} has no {n}")) for n in names]


NAMES = _names(list(ML) + list(NUMPY))
TORCH = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
         "bfloat16", "float16", "float32"]


def np_type(name):
    return getattr(ml_dtypes, name, None) or getattr(np, name)


def all_codes(fmt):
    f = lowbit.parse_format(fmt)
    return np.arange(2**f.bits, dtype=np.int64).astype(f.code_dtype)


def same_values(a, b):
    """Equal float64 values, NaN where the other is NaN (NaN payloads and signs aside: lowbit's
    NaN decode is checked against its own spec elsewhere), and equal signs of zeros."""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    keep = ~nan_a
    return (np.array_equal(nan_a, nan_b) and np.array_equal(a[keep], b[keep])
            and np.array_equal(np.signbit(a[keep]), np.signbit(b[keep])))


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="PyTorch is not installed")


# ---- accepted spellings ----------------------------------------------------------------------


@pytest.mark.parametrize("name", lowbit.formats())
def test_lowbit_names_resolve_to_themselves(name):
    f = resolve_format(name)
    assert f == lowbit.parse_format(name) and f.name == name
    assert resolve_format(f) is f


@pytest.mark.parametrize("name", NAMES)
def test_dtype_spellings_resolve_to_the_same_format(name):
    want = lowbit.parse_format({**ML, **NUMPY}[name])
    t = np_type(name)
    for spelling in (name, t, np.dtype(t)):
        assert resolve_format(spelling) == want, spelling


@pytest.mark.parametrize("name", NAMES)
def test_dtype_agrees_with_format_on_every_code(name):
    fmt = resolve_format(name)
    if fmt.bits <= 16:
        codes = all_codes(fmt)
    else:  # float32: every code is too many; the codes around each binade's edges
        edges = np.arange(256, dtype=np.uint32) << np.uint32(23)
        codes = np.unique(np.concatenate([edges, edges - np.uint32(1), edges + np.uint32(1)]))
        codes = np.concatenate([codes, codes | np.uint32(1 << 31)])
    with np.errstate(invalid="ignore"):
        theirs = codes.view(np_type(name)).astype(np.float64)
    assert same_values(lowbit.decode(codes, fmt, "float64"), theirs)


@pytest.mark.parametrize("name", NAMES)
def test_format_info_agrees_with_finfo(name):
    info = lowbit.format_info(resolve_format(name))
    fi = ml_dtypes.finfo(np_type(name))
    assert info.max == float(fi.max)
    assert info.epsilon == float(fi.eps)
    assert info.min_normal == float(fi.smallest_normal)
    smallest = getattr(info, "min_subnormal", None) or info.fmt.min_positive
    assert smallest == float(fi.smallest_subnormal)
    assert info.bits == fi.bits or (info.bits < 8 and fi.bits == 8)  # ml_dtypes: one byte each


@pytest.mark.torch
@pytest.mark.parametrize("name", TORCH)
def test_torch_dtypes_resolve_and_agree(torch, name):
    dtype = getattr(torch, name)
    fmt = resolve_format(dtype)
    assert fmt == resolve_format(name)
    info = lowbit.format_info(fmt)
    fi = torch.finfo(dtype)
    assert info.max == fi.max and info.min_normal == fi.smallest_normal
    # torch 2.x's finfo(float8_e5m2fnuz).eps is 0.125, but its own values step from 1 to 1.25:
    # the spacing is taken from the values themselves.
    one = torch.ones(1, dtype=dtype).view(getattr(torch, fmt.code_dtype))
    after_one = torch.tensor([one.item() + 1], dtype=one.dtype).view(dtype).item()
    assert info.epsilon == after_one - 1
    if name != "float8_e5m2fnuz":
        assert info.epsilon == fi.eps
    if fmt.bits <= 16:
        codes = all_codes(fmt)
        theirs = torch.from_numpy(codes).view(dtype).to(torch.float64).numpy()
        assert same_values(lowbit.decode(codes, fmt, "float64"), theirs)


def test_an_ml_dtypes_name_needs_no_ml_dtypes_import():
    # Names and numpy dtypes are resolved by name; neither torch nor ml_dtypes gets imported.
    code = ("import sys, lowbit\n"
            "from lowbit._dtypes import resolve_format, codes_of\n"
            "import numpy as np\n"
            "assert resolve_format('float8_e4m3fn').name == 'e4m3fn'\n"
            "assert resolve_format(np.float16).name == 'float16'\n"
            "assert codes_of(np.zeros(2, np.float32)) [1] is None\n"
            "assert 'torch' not in sys.modules and 'ml_dtypes' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- refused spellings -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, 3, 1.5, [], {}, b"e4m3fn", np.zeros(2, np.uint8)])
def test_values_of_other_types_are_type_errors(value):
    with pytest.raises(TypeError, match=r"^target: expected a format"):
        resolve_format(value, arg="target")


@pytest.mark.parametrize("value, why", [
    ("bogus", "unknown name"),
    ("float8_e4m3fnx", "unknown name"),
    ("float64", "unknown name"),  # not a lowbit name, and a string is not parsed as a dtype
    (np.float64, "dtype float64 has no lowbit format"),
    (np.dtype("complex64"), "dtype complex64 has no lowbit format"),
    (np.int8, "dtype int8 is an integer dtype"),
    (ml_dtypes.int4, "dtype int4 is an integer dtype"),
    (np.bool_, "dtype bool has no lowbit format"),
    (float, "dtype float64 has no lowbit format"),
])
def test_names_and_dtypes_without_a_format_are_value_errors(value, why):
    with pytest.raises(ValueError, match=rf"^elem: .*{why}"):
        resolve_format(value, arg="elem")


@pytest.mark.torch
@pytest.mark.parametrize("name, why", [
    ("float64", "has no lowbit format"),
    ("complex64", "has no lowbit format"),
    ("int8", "is an integer dtype"),
    ("uint8", "is an integer dtype"),
    ("float4_e2m1fn_x2", "packs two e2m1fn codes into each byte"),
])
def test_torch_dtypes_without_a_format_are_value_errors(torch, name, why):
    with pytest.raises(ValueError, match=rf"^fmt: torch\.{name} {why}"):
        resolve_format(getattr(torch, name))


# ---- codes_of and typed ------------------------------------------------------------------------


def sample(n=37, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, n))).astype(np.float32)


@pytest.mark.parametrize("name", _names(list(ML) + ["float16"]))
def test_codes_of_numpy_is_a_view_and_typed_inverts_it(name):
    fmt = resolve_format(name)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(sample()).astype(np_type(name))[::2]  # strided; abs: e8m0fnu is unsigned
    codes, got = codes_of(a)
    assert got == fmt
    assert codes.dtype == np.dtype(fmt.code_dtype) and codes.shape == a.shape
    assert np.shares_memory(codes, a)
    back = typed(codes, fmt)
    assert back.dtype == a.dtype and np.shares_memory(back, a)
    assert np.array_equal(back.view(codes.dtype), codes)
    # The codes are the format's: lowbit's decode of them is ml_dtypes' value.
    with np.errstate(invalid="ignore"):
        assert same_values(lowbit.decode(codes, fmt, "float64"), a.astype(np.float64))


@pytest.mark.parametrize("a", [np.zeros(3, np.uint8), np.zeros(3, np.float32),
                               np.zeros(3, np.float64), np.zeros(3, ml_dtypes.int4), [1, 2], 3.0])
def test_codes_of_leaves_other_inputs_alone(a):
    got, fmt = codes_of(a)
    assert got is a and fmt is None


def test_codes_of_narrow_only():
    a = np.zeros(3, ml_dtypes.bfloat16)
    assert codes_of(a, wide=False) == (a, None)
    assert codes_of(np.zeros(3, np.float16), wide=False)[1] is None
    assert codes_of(np.zeros(3, ml_dtypes.float8_e5m2), wide=False)[1] == resolve_format("e5m2")


def test_typed_numpy_float32_and_float16_are_numpy_types():
    assert typed(np.zeros(2, np.uint32), "float32").dtype == np.float32
    assert typed(np.zeros(2, np.uint16), np.float16).dtype == np.float16
    assert typed(np.zeros(2, np.uint16), "bfloat16").dtype == ml_dtypes.bfloat16


def test_typed_refuses_what_has_no_dtype():
    with pytest.raises(TypeError, match="has no dtype in ml_dtypes or torch"):
        typed(np.zeros(2, np.uint8), lowbit.Format(3, 3, 2, "fn"))
    with pytest.raises(TypeError, match="has no dtype in ml_dtypes or torch"):
        typed(np.zeros(2, np.uint32), "tfloat32")
    with pytest.raises(TypeError, match=r"^typed: e4m3fn codes are uint8, got uint16"):
        typed(np.zeros(2, np.uint16), "e4m3fn")
    with pytest.raises(TypeError, match="numpy .ml_dtypes. arrays or torch tensors"):
        typed([1, 2], "e4m3fn")
    with pytest.raises(ValueError, match=r"^fmt: .*unknown name"):
        typed(np.zeros(2, np.uint8), "bogus")


@pytest.mark.torch
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz", "float8_e8m0fnu", "bfloat16", "float16"])
def test_codes_of_torch_is_a_view_and_typed_inverts_it(torch, name):
    dtype = getattr(torch, name)
    fmt = resolve_format(dtype)
    t = torch.from_numpy(np.abs(sample())).to(dtype)[1::3]
    codes, got = codes_of(t)
    assert got == fmt
    assert codes.dtype == getattr(torch, fmt.code_dtype) and codes.shape == t.shape
    assert codes.data_ptr() == t.data_ptr() and codes.stride() == t.stride()
    back = typed(codes, fmt)
    assert back.dtype == dtype and back.data_ptr() == t.data_ptr()
    values = lowbit.decode(codes, fmt, "float64")
    assert same_values(values.numpy(), t.to(torch.float64).numpy())


@pytest.mark.torch
def test_codes_of_torch_other_tensors(torch):
    for t in (torch.zeros(3), torch.zeros(3, dtype=torch.uint8), torch.zeros(3, dtype=torch.int16)):
        got, fmt = codes_of(t)
        assert got is t and fmt is None
    assert codes_of(torch.zeros(3, dtype=torch.bfloat16), wide=False)[1] is None
    with pytest.raises(ValueError, match=r"^codes: a tensor of torch.float4_e2m1fn_x2, which "
                                         "packs two"):
        codes_of(torch.zeros(3, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))


@pytest.mark.torch
def test_codes_of_a_tensor_that_requires_grad(torch):
    t = torch.ones(3, dtype=torch.bfloat16, requires_grad=True)
    codes, fmt = codes_of(t)
    assert not codes.requires_grad and fmt == resolve_format("bfloat16")
    assert codes.tolist() == [0x3F80] * 3


@pytest.mark.torch
def test_typed_torch_refusals(torch):
    with pytest.raises(TypeError, match=r"has no dtype for e2m1fn \(no torch.float4_e2m1fn\)"):
        typed(torch.zeros(2, dtype=torch.uint8), "e2m1fn")
    with pytest.raises(TypeError, match=r"e4m3fn codes are torch.uint8, got torch.int8"):
        typed(torch.zeros(2, dtype=torch.int8), "e4m3fn")
    assert typed(torch.zeros(2, dtype=torch.uint32), "float32").dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float8_e4m3fn", "bfloat16"])
def test_codes_of_cuda_tensor_stays_on_its_device(torch, name):
    dtype = getattr(torch, name)
    t = torch.linspace(0, 4, 9, device="cuda").to(dtype)
    codes, fmt = codes_of(t)
    assert codes.device == t.device and codes.data_ptr() == t.data_ptr()
    assert typed(codes, fmt).dtype == dtype
    assert torch.equal(lowbit.decode(codes, fmt).cpu(), t.float().cpu())
