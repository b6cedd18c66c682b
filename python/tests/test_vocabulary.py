"""One vocabulary, one checker (lowbit 0.2): every format argument is `fmt`, the names of 0.1 are
refused with a TypeError naming the new one; the compiled module checks every value, and its
messages name the Python argument; results of a known shape go into `out=`; every public function
has a docstring example, and the examples are right."""

from __future__ import annotations

import doctest
import importlib
import inspect

import numpy as np
import pytest

import lowbit

F32 = np.float32
X = np.array([[1.0, -2.0, 0.5, 3.0], [0.25, 4.0, -1.0, 0.0]], F32)


# ---- renamed arguments ---------------------------------------------------------------------------

RENAMED = [
    (lambda **kw: lowbit.quantize(X, **kw), "target", "e4m3fn"),
    (lambda **kw: lowbit.cast_scaled(X, 2.0, **kw), "target", "e4m3fn"),
    (lambda **kw: lowbit.dequantize(np.zeros((2, 4), np.uint8), 1.0, **kw), "target", "e4m3fn"),
    (lambda **kw: lowbit.quantize_delayed(X, np.zeros(2, F32), **kw), "target", "e4m3fn"),
    (lambda **kw: lowbit.quantize_mx(X, **kw), "elem", "e4m3fn"),
    (lambda **kw: lowbit.dequantize_mx(np.zeros((2, 4), np.uint8), np.zeros((2, 1), np.uint8),
                                       **kw), "elem", "e4m3fn"),
    (lambda **kw: lowbit.target_info(**kw), "target", "int8"),
    (lambda **kw: lowbit.verify(X, X, **kw), "format", "e4m3fn"),
    (lambda **kw: lowbit.verify(X, X, inputs=X, **kw), "input_format", "e4m3fn"),
]


@pytest.mark.parametrize("call, old, value", RENAMED, ids=[f"{o}-{i}" for i, (_, o, _) in
                                                            enumerate(RENAMED)])
def test_old_argument_names_are_refused_naming_the_new_one(call, old, value):
    new = {"input_format": "input_fmt"}.get(old, "fmt")
    with pytest.raises(TypeError, match=rf"the argument '{old}' is called '{new}' since lowbit "
                                        r"0\.2"):
        call(**{old: value})


def test_every_format_argument_is_fmt():
    for name in lowbit.__all__:
        fn = getattr(lowbit, name)
        if not inspect.isfunction(fn):
            continue
        params = inspect.signature(fn).parameters
        assert not {"target", "elem", "format", "input_format"} & set(params), name
    assert "fmt" in inspect.signature(lowbit.Codebook.from_format).parameters
    assert "fmt" in inspect.signature(lowbit.verify).parameters


def test_fmt_by_keyword():
    codes, scales = lowbit.quantize(X, fmt="int8_sym", granularity="rows")
    back = lowbit.dequantize(codes, scales, fmt="int8_sym", granularity="rows")
    assert np.abs(back - X).max() <= scales.max() / 2
    c, s = lowbit.quantize_mx(X, fmt="e4m3fn", block=2)
    assert lowbit.dequantize_mx(c, s, fmt="e4m3fn", block=2).shape == X.shape


def test_blockwise_rounding_has_its_own_name():
    x = np.linspace(-1, 1, 64, dtype=F32)
    a = lowbit.quantize_blockwise(x, "linear", 64)[0]
    b = lowbit.quantize_blockwise(x, "linear", 64, rounding="nearest_toward_zero")[0]
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match=r"^rounding 'nearest': renamed 'nearest_toward_zero'"):
        lowbit.quantize_blockwise(x, "linear", 64, rounding="nearest")
    # the cast's names mean the cast's rules, and the cast does not take the codebook's
    with pytest.raises(ValueError, match=r"^rounding 'nearest_even': expected one of "
                                         r"nearest_toward_zero, stochastic"):
        lowbit.quantize_blockwise(x, "linear", 64, rounding="nearest_even")
    with pytest.raises(ValueError, match=r"^rounding 'nearest_toward_zero'"):
        lowbit.cast(x, "e4m3fn", rounding="nearest_toward_zero")


def test_codebook_tie_rule_is_toward_the_smaller_magnitude():
    # 0.375 and -0.375 lie exactly halfway between two entries: each goes to the entry of
    # smaller magnitude (nearest-even has no meaning for codebook indices).
    cb = lowbit.Codebook.from_values([-1.0] * 250 + [-0.5, -0.25, 0.0, 0.25, 0.5, 1.0])
    x = np.zeros(64, F32)
    x[:3] = [1.0, 0.375, -0.375]
    codes, absmax = lowbit.quantize_blockwise(x, cb, 64)
    assert absmax.tolist() == [1.0]
    assert cb.values[codes[1]] == 0.25 and cb.values[codes[2]] == -0.25


def test_info_objects_are_dataclasses_with_one_name_per_property():
    import dataclasses

    t = lowbit.target_info("e4m3fn")
    f = lowbit.format_info("e4m3fn")
    assert dataclasses.is_dataclass(t) and dataclasses.is_dataclass(f)
    assert (t.name, t.code_dtype, t.max, t.is_int) == ("e4m3fn", "uint8", 448.0, False)
    assert lowbit.target_info("int8_sym") == lowbit.TargetInfo("int8_sym", "int8", 127.0, True)
    assert f.min_subnormal == f.fmt.min_subnormal == 2.0**-9
    assert not hasattr(f.fmt, "min_positive")
    # e8m0fnu has no subnormals: the smallest positive value is its smallest normal
    e8 = lowbit.format_info("e8m0fnu")
    assert e8.min_subnormal == e8.min_normal == 2.0**-127


# ---- one checker ---------------------------------------------------------------------------------


@pytest.mark.parametrize("call, exc, message", [
    # the kernels' "target"/"elem"/"grouping" reach Python as the Python arguments' names
    (lambda: lowbit.quantize(X, "float32"), ValueError,
     r"^fmt: format float32 cannot be a quantization target"),
    (lambda: lowbit.quantize_mx(X, "int4"), ValueError, r"^fmt: .*int(4|8)"),
    (lambda: lowbit.dequantize_mx(np.zeros((2, 4), np.int8), np.zeros((2, 1), np.uint8), "int4"),
     ValueError, r"^fmt: .*int(4|8)"),
    # a format no quantization takes is the reason, not the codes' dtype
    (lambda: lowbit.dequantize(np.zeros(3, np.uint32), 1.0, "float32"), ValueError,
     r"^fmt: format float32 cannot be a quantization target"),
    (lambda: lowbit.dequantize(np.zeros(3, np.uint16), 1.0, "e4m3fn"), TypeError,
     r"^codes: dtype uint16 does not hold codes of e4m3fn; expected uint8"),
    (lambda: lowbit.quantize(X, "e4m3fn", ("blocks", 0)), ValueError,
     r"^granularity: the block length must be >= 1, got 0"),
    (lambda: lowbit.quantize(X, "e4m3fn", ("tiles", 2, -1)), ValueError,
     r"^granularity: tile sizes must be >= 1, got \(2, -1\)"),
    (lambda: lowbit.dequantize(np.zeros((2, 4), np.uint8), np.ones(1, F32), "e4m3fn",
                               ("blocks", 0)), ValueError, r"^granularity: the block length"),
    (lambda: lowbit.quantize(X, "e4m3fn", margin=127), ValueError,
     r"^margin: must be an integer in -126\.\.126"),
    (lambda: lowbit.quantize(X, "e4m3fn", margin=10**12), ValueError,
     r"^margin: must be an integer in -126\.\.126"),
    (lambda: lowbit.quantize_delayed(X, np.zeros(2, F32), "e4m3fn", margin=-127), ValueError,
     r"^margin: must be an integer in -126\.\.126"),
    (lambda: lowbit.quantize(X, "e4m3fn", "rows", transpose=True), ValueError,
     r"^transpose: only per-column quantization"),
    (lambda: lowbit.quantize_mx(X, "e4m3fn", 0), ValueError, r"^block: must be >= 1 \(OCP MX "
                                                             r"uses 32\), got 0"),
    (lambda: lowbit.quantize_blockwise(X, "dynamic", 100), ValueError,
     r"^block: must be one of 64, 128, 256, 512, 1024, 2048, 4096 \(got 100\)"),
    (lambda: lowbit.dequantize_blockwise(np.zeros(4, np.uint8), np.ones(1, F32), "dynamic", 32),
     ValueError, r"^block: must be one of 64"),
    (lambda: lowbit.estimate_quantiles(X, 0), ValueError, r"^k: expected 1\.\.4096 quantiles, "
                                                          r"got 0"),
    (lambda: lowbit.estimate_quantiles(X, 5000), ValueError, r"^k: expected 1\.\.4096"),
    (lambda: lowbit.cast(X, "e4m3fn", rounding="stochastic", random_bits=33), ValueError,
     r"^random_bits: stochastic rounding takes 1\.\.32 random bits, got 33"),
    (lambda: lowbit.cast(X, "e4m3fn", threads=-1), ValueError, r"^threads: expected 0"),
    (lambda: lowbit.quantize(X, "e4m3fn", margin=2**70), ValueError,
     r"^margin: 1180591620717411303424 does not fit a 64-bit integer"),
    (lambda: lowbit.quantize(X, "e4m3fn", margin=1.0), TypeError,
     r"^margin: expected an integer, got float"),
    (lambda: lowbit.cast_scaled(X, -2.0, "e4m3fn"), ValueError,
     r"^scale: expected a positive finite multiplier"),
    (lambda: lowbit.quantize(X, 3), TypeError, r"^fmt: expected a format"),
    (lambda: lowbit.cast(X, "e9m9"), ValueError, r"^fmt: "),
    (lambda: lowbit.decode(np.zeros(3, np.uint8), "e4m3fn", "float16"), ValueError,
     r"^dtype 'float16': expected one of float32, float64"),
])
def test_the_module_checks_and_names_the_python_argument(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_blocks_and_tiles_larger_than_the_tensor_are_valid():
    # A size beyond the row (or the matrix) makes one group of the whole row: the same codes as
    # a size equal to it, and no overflow in the count of groups for sizes near 2**63.
    for big in (5, 2**40, 2**63 - 1):
        c1, s1 = lowbit.quantize(X, "e4m3fn", ("blocks", big))
        c2, s2 = lowbit.quantize(X, "e4m3fn", ("blocks", 4))
        assert np.array_equal(c1, c2) and np.array_equal(s1, s2) and s1.shape == (2, 1)
        c3, s3 = lowbit.quantize(X, "e4m3fn", ("tiles", big, big))
        c4, s4 = lowbit.quantize(X, "e4m3fn", "tensor")
        assert np.array_equal(c3, c4) and s3.shape == (1, 1) and s3[0, 0] == s4
        m1, e1 = lowbit.quantize_mx(X, "e4m3fn", big)
        m2, e2 = lowbit.quantize_mx(X, "e4m3fn", 4)
        assert np.array_equal(m1, m2) and np.array_equal(e1, e2)
        back = lowbit.dequantize_mx(m1, e1, "e4m3fn", big)
        assert np.array_equal(back, lowbit.dequantize_mx(m2, e2, "e4m3fn", 4))


def test_one_trip_into_the_module_per_call(monkeypatch):
    # quantize used to ask the module for the target's code dtype first; now the module
    # allocates through the layer's allocator, in one call.
    from lowbit import _core

    calls = []
    real = {n: getattr(_core, n) for n in ("target_info", "parse_format", "quantize",
                                           "quantize_mx", "cast", "dequantize")}
    for name, fn in real.items():
        monkeypatch.setattr(_core, name, lambda *a, _n=name, _f=fn, **k: (calls.append(_n),
                                                                          _f(*a, **k))[1])
    codes, scales = lowbit.quantize(X, "int8", "rows")
    lowbit.dequantize(codes, scales, "int8", "rows")
    lowbit.quantize_mx(X, "e4m3fn")
    lowbit.cast(X, "e5m2")
    assert calls == ["quantize", "dequantize", "quantize_mx", "cast"]


# ---- out= ----------------------------------------------------------------------------------------


def test_out_is_written_and_returned():
    out = np.full(X.shape, 7, np.uint8)
    assert lowbit.cast(X, "e4m3fn", out=out) is out
    assert np.array_equal(out, lowbit.cast(X, "e4m3fn"))

    vals = np.empty(X.shape, np.float64)
    assert lowbit.decode(out, "e4m3fn", out=vals) is vals
    assert np.array_equal(vals, lowbit.decode(out, "e4m3fn", "float64"))

    codes = np.empty(X.shape, np.uint8)
    assert lowbit.cast_scaled(X, 3.0, "e4m3fn", out=codes) is codes
    assert np.array_equal(codes, lowbit.cast_scaled(X, 3.0, "e4m3fn"))

    c, s = lowbit.quantize(X, "int8", "rows")
    back = np.empty(X.shape, F32)
    assert lowbit.dequantize(c, s, "int8", "rows", out=back) is back
    assert np.array_equal(back, lowbit.dequantize(c, s, "int8", "rows"))

    c, s = lowbit.quantize_mx(X, "e2m1fn", 2)
    back = np.empty(X.shape, F32)
    assert lowbit.dequantize_mx(c, s, "e2m1fn", 2, out=back) is back
    assert np.array_equal(back, lowbit.dequantize_mx(c, s, "e2m1fn", 2))

    x = np.linspace(-3, 3, 300, dtype=F32)
    c, a = lowbit.quantize_blockwise(x, "dynamic", 64)
    back = np.empty(x.shape, F32)
    assert lowbit.dequantize_blockwise(c, a, "dynamic", 64, out=back) is back
    assert np.array_equal(back, lowbit.dequantize_blockwise(c, a, "dynamic", 64))
    c, nested = lowbit.quantize_blockwise(x, "dynamic", 64, nested=True)
    back = np.empty(x.shape, F32)
    assert lowbit.dequantize_blockwise(c, nested, "dynamic", 64, out=back) is back
    assert np.array_equal(back, lowbit.dequantize_blockwise(c, nested, "dynamic", 64))

    q = np.empty(16, F32)
    assert lowbit.estimate_quantiles(x, 16, out=q) is q
    assert np.array_equal(q, lowbit.estimate_quantiles(x, 16))


def test_out_into_a_strided_view():
    big = np.zeros((2, 8), np.uint8)
    view = big[:, ::2]
    assert lowbit.cast(X, "e4m3fn", out=view) is view
    assert np.array_equal(big[:, ::2], lowbit.cast(X, "e4m3fn"))
    assert not big[:, 1::2].any()


@pytest.mark.parametrize("call, exc, message", [
    (lambda: lowbit.cast(X, "e4m3fn", out=np.empty(X.shape, np.uint16)), TypeError,
     r"^out: dtype uint16 is not supported; expected uint8"),
    (lambda: lowbit.cast(X, "e4m3fn", out=np.empty((4, 2), np.uint8)), ValueError,
     r"^out: expected shape \(2, 4\) \(the shape of x\) but got \(4, 2\)"),
    (lambda: lowbit.cast(X, "e4m3fn", out=[0] * 8), TypeError, r"^out: expected an array"),
    (lambda: lowbit.decode(np.zeros(3, np.uint8), "e4m3fn", "float32",
                           out=np.empty(3, np.float64)), ValueError,
     r"^out: dtype float64, but dtype='float32'"),
    (lambda: lowbit.decode(np.zeros(3, np.uint16), "float32", out=np.empty(3, F32)),
     TypeError, r"^codes: dtype uint16 does not hold codes of float32"),
    (lambda: lowbit.dequantize(np.zeros(3, np.uint8), np.ones(1, F32), "e4m3fn",
                               out=np.empty(3, np.float64)), TypeError,
     r"^out: dtype float64 is not supported; expected float32"),
    (lambda: lowbit.estimate_quantiles(X, 4, out=np.empty(5, F32)), ValueError,
     r"^out: expected shape \(4,\)"),
    (lambda: lowbit.cast_scaled(X, 2.0, "int8", out=np.empty(X.shape, np.uint8)), TypeError,
     r"^out: dtype uint8 is not supported; expected int8"),
    (lambda: lowbit.cast_scaled(X, 2.0, "e4m3fn", out=np.empty((1,) + X.shape, np.uint8)),
     ValueError, r"^x has shape .* but out has shape"),
])
def test_bad_out_names_out(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_read_only_out_is_refused():
    out = np.empty(X.shape, np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"^out: the array is read-only"):
        lowbit.cast(X, "e4m3fn", out=out)


# ---- docstring examples --------------------------------------------------------------------------

MODULES = ["lowbit", "lowbit._api", "lowbit._quantize", "lowbit._blockwise", "lowbit._verify"]


def public_callables():
    out = []
    for name in lowbit.__all__:
        obj = getattr(lowbit, name)
        if inspect.isfunction(obj):
            out.append((name, obj))
        elif inspect.isclass(obj) and obj.__module__.startswith("lowbit._") and name in (
                "Codebook", "Granularity"):
            for m, member in vars(obj).items():
                if isinstance(member, classmethod) and not m.startswith("_"):
                    out.append((f"{name}.{m}", getattr(obj, m)))
    return out


@pytest.mark.parametrize("name, fn", public_callables(), ids=lambda v: v if isinstance(v, str)
                         else "")
def test_every_public_function_has_an_example(name, fn):
    assert ">>> " in (fn.__doc__ or ""), f"{name}: no example in the docstring"


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples_run(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, extraglobs={"lowbit": lowbit, "np": np},
                             optionflags=doctest.NORMALIZE_WHITESPACE, report=True)
    assert result.attempted > 0 and result.failed == 0


# ---- formats as dtypes: typed codes in and out ------------------------------------------------


def test_dtype_forms_of_fmt():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    want = lowbit.cast(X, "e4m3fn")
    for form in ("float8_e4m3fn", ml_dtypes.float8_e4m3fn, np.dtype(ml_dtypes.float8_e4m3fn),
                 lowbit.parse_format("e4m3fn")):
        assert np.array_equal(lowbit.cast(X, form), want)
        assert np.array_equal(lowbit.quantize(X, form, "rows")[0],
                              lowbit.quantize(X, "e4m3fn", "rows")[0])
    assert lowbit.target_info(ml_dtypes.float8_e5m2) == lowbit.target_info("e5m2")
    assert lowbit.format_info(ml_dtypes.float4_e2m1fn).name == "e2m1fn"


def test_typed_codes_out_and_in():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    raw = lowbit.cast(X, "e4m3fn")
    t = lowbit.cast(X, "e4m3fn", typed=True)
    assert t.dtype == ml_dtypes.float8_e4m3fn and np.array_equal(t.view(np.uint8), raw)
    # ml_dtypes' own conversion of the typed codes is the same exact value as decode's
    assert np.array_equal(t.astype(np.float32), lowbit.decode(raw, "e4m3fn"))
    # decode reads the format off typed codes; naming another one is refused
    assert np.array_equal(lowbit.decode(t), lowbit.decode(raw, "e4m3fn"))
    with pytest.raises(ValueError, match=r"^codes: an array of e4m3fn codes \(its dtype\), but "
                                         r"fmt is e5m2"):
        lowbit.decode(t, "e5m2")
    with pytest.raises(TypeError, match=r"^fmt: required for raw codes"):
        lowbit.decode(raw)

    codes, scales = lowbit.quantize(X, "e5m2", "rows", typed=True)
    assert codes.dtype == ml_dtypes.float8_e5m2
    assert np.array_equal(lowbit.dequantize(codes, scales, "e5m2", "rows"),
                          lowbit.dequantize(codes.view(np.uint8), scales, "e5m2", "rows"))
    assert np.array_equal(lowbit.dequantize(codes, scales, granularity="rows"),
                          lowbit.dequantize(codes, scales, "e5m2", "rows"))
    with pytest.raises(TypeError, match=r"^fmt: required for raw codes"):
        lowbit.dequantize(codes.view(np.uint8), scales, granularity="rows")
    codes, scales = lowbit.quantize_mx(X, "e2m1fn", 2, typed=True)
    assert codes.dtype == ml_dtypes.float4_e2m1fn
    assert np.array_equal(lowbit.dequantize_mx(codes, scales, block=2),
                          lowbit.dequantize_mx(codes.view(np.uint8), scales, "e2m1fn", 2))
    assert lowbit.cast_scaled(X, 4.0, "e4m3fn", typed=True).dtype == ml_dtypes.float8_e4m3fn
    codes, _ = lowbit.quantize_delayed(X, np.zeros(2, F32), "e4m3fn", typed=True)
    assert codes.dtype == ml_dtypes.float8_e4m3fn
    with pytest.raises(TypeError, match=r"^typed: codes of the integer target 'int8'"):
        lowbit.quantize(X, "int8", typed=True)
    with pytest.raises(TypeError, match=r"^typed: expected True or False"):
        lowbit.cast(X, "e4m3fn", typed="yes")
    # verify reads typed codes through the same path
    assert lowbit.verify(t, raw, "exact", fmt="e4m3fn").ok


def test_typed_torch_codes():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(X.copy())
    t = lowbit.cast(x, torch.float8_e4m3fn, typed=True)
    assert t.dtype == torch.float8_e4m3fn
    assert torch.equal(t.view(torch.uint8), lowbit.cast(x, "e4m3fn"))
    # torch's own conversion of the typed codes agrees with decode
    assert torch.equal(t.float(), lowbit.decode(t))
    out = torch.empty(X.shape, dtype=torch.float32)
    assert lowbit.decode(t, out=out) is out and torch.equal(out, t.float())
    with pytest.raises(TypeError, match=r"^typed: .*e2m1fn"):
        lowbit.cast(x, "e2m1fn", typed=True)  # torch has no one-code-per-byte fp4 dtype
