"""lowbit._core reads torch tensors through their own attributes (no DLPack exchange): what it
reads must be what DLPack would give, and what it cannot read that way goes through DLPack."""

from __future__ import annotations

import pytest

from lowbit import _core

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

pytestmark = pytest.mark.torch

_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
          torch.bfloat16: "bfloat16", torch.uint8: "uint8", torch.int8: "int8",
          torch.int16: "int16", torch.int32: "int32", torch.int64: "int64"}


def _tensors():
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    yield base
    yield base.transpose(0, 2)                 # strided
    yield base[1:, 2:5, ::2]                   # storage offset, step
    yield base[0, 0, 0]                        # 0-d
    yield base[:, :0]                          # empty
    yield torch.nn.Parameter(base.clone(), requires_grad=False)
    for dt in _NAMES:
        yield torch.zeros(3, 7, dtype=dt)


@pytest.mark.parametrize("t", list(_tensors()), ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_attributes_match_dlpack(t):
    d = _core._describe(t, "x", False)
    assert d["dlpack"] is False  # the attribute path was taken
    assert d["dtype"] == _NAMES[t.dtype]
    assert d["shape"] == tuple(t.shape)
    assert d["strides"] == tuple(0 if n <= 1 else s for n, s in zip(t.shape, t.stride()))
    assert d["device"] == "cpu"
    if t.numel():
        assert d["data"] == t.data_ptr()
    assert d["contiguous"] == (t.is_contiguous() or t.numel() == 0)


def test_tensors_that_need_a_gradient_or_are_views_of_other_kinds_go_through_dlpack():
    x = torch.ones(3, requires_grad=True)
    with pytest.raises(Exception, match="gradient"):
        _core._describe(x, "x", False)  # DLPack's own refusal, as before
    neg = torch._neg_view(torch.ones(3))
    assert _core._describe(neg, "x", False)["dlpack"] is True  # DLPack resolves the negation


def test_subclasses_and_unsupported_dtypes_keep_the_dlpack_path():
    class Sub(torch.Tensor):
        pass

    s = torch.ones(2, 3).as_subclass(Sub)
    assert _core._describe(s, "x", False)["dlpack"] is True
    with pytest.raises(Exception):
        _core._describe(torch.ones(2, dtype=torch.complex64), "x", False)


def test_quantize_of_a_strided_tensor_equals_that_of_its_copy():
    import lowbit

    x = torch.randn(64, 96, dtype=torch.float32)[:, :40]  # rows padded
    a = lowbit.quantize(x, "int8", granularity="rows")
    b = lowbit.quantize(x.contiguous(), "int8", granularity="rows")
    for u, v in zip(a, b):
        assert torch.equal(torch.as_tensor(u), torch.as_tensor(v))


def test_refused_dtypes_are_named_as_dlpack_names_them_every_time():
    import lowbit

    for _ in range(2):  # the first sight of the dtype, then its cached entry
        with pytest.raises(TypeError, match=r"^x: dtype int64 is not supported"):
            lowbit.cast(torch.arange(4), "e4m3fn")


def test_negative_views_are_read_as_their_values():
    """A lazily negated tensor (conj().imag, _neg_view) holds -x in memory, which DLPack
    exports as it is: lowbit reads its values, and refuses one as an output."""
    import numpy as np

    import lowbit

    im = torch.tensor([1 + 0.5j, 2 - 3j]).conj().imag
    assert im.is_neg()
    assert torch.equal(lowbit.cast(im, "e4m3fn"), lowbit.cast(im.resolve_neg(), "e4m3fn"))
    assert lowbit.verify(torch._neg_view(torch.tensor([0.5])), np.float32([-0.5])).ok
    # float16 and bfloat16 tensors are read as their formats' codes: those of their values too.
    for dt in (torch.float16, torch.bfloat16):
        h = torch.tensor([1.0, -2.0, 0.375], dtype=dt)
        assert torch.equal(lowbit.decode(torch._neg_view(h), dtype="float32"),
                           (-h).float())
    with pytest.raises(ValueError, match="out: a torch negative view"):
        lowbit.cast(torch.randn(2), "e4m3fn", out=torch._neg_view(torch.zeros(2, dtype=torch.uint8)))
    with pytest.raises(ValueError, match=r"out: its elements overlap"):
        lowbit.cast(torch.randn(4), "e4m3fn", out=torch.zeros(1, dtype=torch.uint8).expand(4))
