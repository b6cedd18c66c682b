"""lowbit.nn's low-precision linear layers: the autograd Function's structure (gradcheck in
float64 with quantization replaced by identity), the int8 forward and input gradient bit-equal
to an independent computation (lowbit.quantize for the codes, numpy's exact int64 matmul, the
epilogue as float32 numpy operations, ml_dtypes' rounding to bfloat16), the weight and bias
gradients equal to torch's 16-bit matmul and sum, fp8 within a stated bound, convert(),
torch.compile without graph breaks, NaN/Inf, empty batches, bad input, a short training run, and
CUDA against CPU (marker gpu)."""

from __future__ import annotations

import copy

import subprocess
import sys

import numpy as np
import pytest

import lowbit

import gemm_rule

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes")

import lowbit.nn as lnn  # noqa: E402  (imports torch)
from lowbit import _torch_ops as ops  # noqa: E402

pytestmark = pytest.mark.torch

F32 = np.float32
U = 2.0**-24
INT8_VARIANTS = ["switchback", "switchback_m", "switchback_q"]
NP_DTYPE = {torch.float32: np.dtype(F32), torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
            torch.float16: np.dtype(np.float16)}


def to_np(t):
    """A CPU tensor as numpy, bfloat16 as ml_dtypes' (the same bits)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.itemsize}")


def same_bits(t, a):
    t = to_np(t)
    return t.shape == a.shape and t.dtype == a.dtype and np.array_equal(bits(t), bits(a))


def layer_and_input(variant, fmt="int8", dtype=torch.float32, bias=True, lead=(3, 5), fin=48,
                    fout=24, seed=0, device="cpu"):
    torch.manual_seed(seed)
    layer = lnn.SwitchBackLinear(fin, fout, bias=bias, dtype=dtype, device=device,
                                 variant=variant, fmt=fmt)
    with torch.no_grad():
        if bias:  # a bias large enough to matter in the epilogue
            layer.bias.normal_(0, 1)
    x = (torch.randn(*lead, fin) * torch.exp(torch.randn(*lead, 1))).to(dtype).to(device)
    return layer, x


# ---- the independent computation -----------------------------------------------------------------


def epilogue(acc, sa, sb, bias, dtype):
    """The rule's epilogue (gemm_rule.scaled), then the output's rounding (nearest-even)."""
    return gemm_rule.scaled(acc, sa, sb, bias).astype(NP_DTYPE[dtype])


def int8_matmul(a_codes, b_codes):
    return a_codes.astype(np.int64) @ b_codes.astype(np.int64).T


def reference_forward(variant, x2, w, b, dtype):
    xc, xs = lowbit.quantize(x2, "int8_sym", "rows")
    wc, ws = lowbit.quantize(w, "int8_sym", "rows" if variant == "switchback_q" else "tensor")
    return epilogue(int8_matmul(xc, wc), xs, ws, b, dtype)


def reference_grad_input(variant, g, w, dtype):
    gc, gs = lowbit.quantize(g, "int8_sym", "rows")
    if variant == "switchback_q":
        wtc, wts = lowbit.quantize(w, "int8_sym", "columns", transpose=True)
    else:
        wc, wts = lowbit.quantize(w, "int8_sym", "tensor")
        wtc = np.ascontiguousarray(wc.T)
    return epilogue(int8_matmul(gc, wtc), gs, wts, None, dtype)


def run(layer, x, grad=None, seed=1):
    x = x.detach().clone().requires_grad_(True)
    y = layer(x)
    if grad is None:
        g = torch.Generator().manual_seed(seed)
        grad = torch.randn(y.shape, generator=g).to(y.dtype).to(y.device)
    layer.zero_grad(set_to_none=True)
    y.backward(grad)
    return y, grad, x.grad, layer.weight.grad, None if layer.bias is None else layer.bias.grad


# ---- structure: gradcheck in float64 with quantization replaced by identity ----------------------


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(4,), (2, 3)], ids=["2d", "3d"])
def test_gradcheck_identity_recipe(bias, lead):
    torch.manual_seed(0)
    layer = lnn.LowPrecisionLinear(5, 3, bias=bias, dtype=torch.float64, recipe=lnn.IDENTITY)
    x = torch.randn(*lead, 5, dtype=torch.float64, requires_grad=True)
    w = layer.weight.detach().clone().requires_grad_(True)
    params = (w,)
    if bias:
        params += (layer.bias.detach().clone().requires_grad_(True),)

    def f(x, *p):
        names = ("weight", "bias")[:len(p)]
        return torch.func.functional_call(layer, dict(zip(names, p)), (x,))

    assert torch.autograd.gradcheck(f, (x, *params))


def test_identity_recipe_is_nn_linear():
    torch.manual_seed(0)
    ref = torch.nn.Linear(7, 4)
    layer = lnn.LowPrecisionLinear(7, 4, recipe="identity")
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(3, 2, 7)
    y, g, dx, dw, db = run(layer, x)
    xr = x.clone().requires_grad_(True)
    yr = ref(xr)
    yr.backward(g)
    for a, b in ((y, yr), (dx, xr.grad), (dw, ref.weight.grad), (db, ref.bias.grad)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ---- int8 variants: bit-equal to the independent computation -----------------------------------


@pytest.mark.parametrize("variant", INT8_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_int8_forward_and_grad_input_are_bit_exact(variant, dtype, bias):
    layer, x = layer_and_input(variant, dtype=dtype, bias=bias)
    y, g, dx, dw, db = run(layer, x)
    assert y.dtype == dtype and y.shape == (3, 5, 24)
    x2, w, g2 = to_np(x.reshape(-1, 48)), to_np(layer.weight), to_np(g.reshape(-1, 24))
    b = None if not bias else to_np(layer.bias)
    assert same_bits(y.reshape(-1, 24), reference_forward(variant, x2, w, b, dtype))
    assert same_bits(dx.reshape(-1, 48), reference_grad_input(variant, g2, w, dtype))


@pytest.mark.parametrize("variant", INT8_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_weight_and_bias_gradients_are_16bit_matmul_and_sum(variant, dtype):
    layer, x = layer_and_input(variant, dtype=dtype, seed=2)
    y, g, dx, dw, db = run(layer, x)
    x2, g2 = x.reshape(-1, 48), g.reshape(-1, 24)
    if variant == "switchback_m":
        # X comes back from its int8 codes: value(code) * d in float32, then X's dtype
        xc, xs = lowbit.quantize(to_np(x2), "int8_sym", "rows")
        x2 = torch.from_numpy((xc.astype(F32) * xs).astype(F32)).to(dtype)
    assert dw.dtype == dtype and torch.equal(dw, g2.t().matmul(x2))
    assert db.dtype == dtype and torch.equal(db, g2.sum(0))


def test_switchback_m_saves_codes_not_the_input():
    layer, x = layer_and_input("switchback_m")
    x = x.detach().requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        layer(x)
    dtypes = sorted(str(t.dtype) for t in saved)
    assert "torch.int8" in dtypes
    assert not any(t.dtype == torch.float32 and t.shape == x.reshape(-1, 48).shape
                   for t in saved)


# ---- fp8: within the bound of a float32 sum of exact products -----------------------------------


def decoded(codes, fmt):
    return codes.view(getattr(ml_dtypes, "float8_" + fmt)).astype(np.float64)


def fp8_check(got, a_codes, a_fmt, sa, b_codes, b_fmt, sb, bias, dtype, native=False):
    """got within the bound of a float32 sum of the exact products, or with native=True the
    native-fp8 bound of gemm-bounds.md (groups of up to 128 products truncated to 13 bits below
    the group's largest exponent: fp8 tensor cores do not sum in float32)."""
    av, bv = decoded(a_codes, a_fmt), decoded(b_codes, b_fmt)
    sa64 = np.asarray(sa, np.float64).reshape(-1, 1)
    sb64 = np.asarray(sb, np.float64).reshape(1, -1) if np.size(sb) > 1 else \
        np.asarray(sb, np.float64)
    ref = (av @ bv.T) * sa64 * sb64
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    k = av.shape[1]
    gamma = (k + 2) * U / (1 - (k + 2) * U)
    if native:
        gamma += (-(-k // 128) + min(k, 128) * 2.0**11) * U
    p = (np.abs(av) @ np.abs(bv).T) * np.abs(sa64 * sb64)
    out_u = {torch.float32: U, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    bound = gamma * p * (1 + U) + U * np.abs(ref)
    bound = bound * (1 + out_u) + out_u * np.abs(ref) + 1e-30
    err = np.abs(to_np(got).astype(np.float64) - ref)
    assert (err <= bound).all(), (err - bound).max()


@pytest.mark.parametrize("variant", INT8_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_forward_and_grad_input_within_the_bound(variant, dtype):
    layer, x = layer_and_input(variant, fmt="fp8", dtype=dtype, seed=3)
    y, g, dx, dw, db = run(layer, x)
    x2, w, g2 = to_np(x.reshape(-1, 48)), to_np(layer.weight), to_np(g.reshape(-1, 24))
    q = variant == "switchback_q"
    xc, xs = lowbit.quantize(x2, "e4m3fn", "rows")
    wc, ws = lowbit.quantize(w, "e4m3fn", "rows" if q else "tensor")
    fp8_check(y.reshape(-1, 24), xc, "e4m3fn", xs, wc, "e4m3fn", ws, to_np(layer.bias), dtype)
    gc, gs = lowbit.quantize(g2, "e5m2", "rows")
    if q:
        wtc, wts = lowbit.quantize(w, "e4m3fn", "columns", transpose=True)
    else:
        wtc, wts = np.ascontiguousarray(wc.T), ws
    fp8_check(dx.reshape(-1, 48), gc, "e5m2", gs, wtc, "e4m3fn", wts, None, dtype)


def test_tensorwise_fp8_quantizes_all_three_matmuls():
    layer, x = layer_and_input("tensorwise", fmt="fp8", seed=4)
    y, g, dx, dw, db = run(layer, x)
    x2, w, g2 = to_np(x.reshape(-1, 48)), to_np(layer.weight), to_np(g.reshape(-1, 24))
    xc, xs = lowbit.quantize(x2, "e4m3fn", "tensor")
    wc, ws = lowbit.quantize(w, "e4m3fn", "tensor")
    gc, gs = lowbit.quantize(g2, "e5m2", "tensor")
    xs1, ws1, gs1 = (np.full(1, s, F32) for s in (xs, ws, gs))
    fp8_check(y.reshape(-1, 24), xc, "e4m3fn", xs1, wc, "e4m3fn", ws1, to_np(layer.bias),
              torch.float32)
    fp8_check(dx.reshape(-1, 48), gc, "e5m2", gs1, np.ascontiguousarray(wc.T), "e4m3fn", ws1,
              None, torch.float32)
    fp8_check(dw, np.ascontiguousarray(gc.T), "e5m2", gs1, np.ascontiguousarray(xc.T),
              "e4m3fn", xs1, None, torch.float32)
    assert torch.equal(db, g.reshape(-1, 24).sum(0))


# ---- the module: a drop-in nn.Linear -----------------------------------------------------------


def test_state_dict_keys_and_parameters_are_nn_linear_s():
    ref = torch.nn.Linear(6, 4)
    layer = lnn.SwitchBackLinear(6, 4)
    assert list(layer.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    layer.load_state_dict(ref.state_dict())
    assert isinstance(layer, torch.nn.Linear)
    assert "recipe=switchback_int8" in repr(layer)
    assert list(lnn.SwitchBackLinear(6, 4, bias=False).state_dict()) == ["weight"]


def test_convert_swaps_only_filtered_layers_and_keeps_the_state_dict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()),
                                torch.nn.Linear(16, 3))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    seen = []
    out = lnn.convert(model, filter=lambda name, m: seen.append(name) or name != "3",
                      variant="switchback_q", fmt="int8")
    assert out is model and seen == ["0", "2.0", "3"]
    assert type(model[0]) is lnn.LowPrecisionLinear and type(model[2][0]) is lnn.LowPrecisionLinear
    assert type(model[3]) is torch.nn.Linear
    assert model[0].recipe == lnn.switchback_recipe("switchback_q", "int8")
    assert model[0].weight is weights[0] and model[2][0].weight is weights[1]
    state = model.state_dict()
    assert list(state) == list(original)
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()),
                                torch.nn.Linear(16, 3))
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in original.items())
    # converting again leaves the converted layers alone; recipes by name or object
    lnn.convert(model, "tensorwise_fp8")
    assert model[0].recipe.name == "switchback_q_int8"
    assert model[3].recipe.name == "tensorwise_fp8"
    single = lnn.convert(torch.nn.Linear(4, 2), lnn.IDENTITY)
    assert type(single) is lnn.LowPrecisionLinear


@pytest.mark.parametrize("call, exc, message", [
    (lambda: lnn.SwitchBackLinear(4, 2, variant="switchback_x"), ValueError,
     r"^variant 'switchback_x': expected one of"),
    (lambda: lnn.SwitchBackLinear(4, 2, fmt="int4"), ValueError, r"^fmt 'int4': expected"),
    (lambda: lnn.convert(torch.nn.Linear(4, 2), "nope"), ValueError, r"^recipe 'nope'"),
    (lambda: lnn.convert(torch.nn.Linear(4, 2), "identity", fmt="int8"), TypeError,
     r"^recipe: given"),
    (lambda: lnn.convert(torch.nn.Linear(4, 2), filter=3), TypeError, r"^filter: expected"),
    (lambda: lnn.LinearRecipe("r", forward=lnn.Matmul(lnn.Operand("int8_sym"), lnn.Operand())),
     ValueError, r"^forward: quantize both operands or neither"),
    (lambda: lnn.LinearRecipe("r", forward=lnn.Matmul(lnn.Operand("int8_sym", "columns"),
                                                      lnn.Operand("int8_sym"))),
     ValueError, r"^forward: X's granularity 'columns'"),
    (lambda: lnn.LinearRecipe("r", grad_input=lnn.Matmul(lnn.Operand("e5m2"),
                                                         lnn.Operand("int8_sym"))),
     ValueError, r"^grad_input: int8 operands multiply int8 operands only"),
    (lambda: lnn.LinearRecipe("r", forward=lnn.Matmul(lnn.Operand("e2m1fn"),
                                                      lnn.Operand("e4m3fn"))),
     ValueError, r"^forward: X's format 'e2m1fn'"),
    (lambda: lnn.LinearRecipe("r", save_quantized_input=True), ValueError,
     r"^save_quantized_input: needs"),
])
def test_bad_configurations_are_refused(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_bad_input_is_refused():
    layer = lnn.SwitchBackLinear(8, 4)
    with pytest.raises(ValueError, match=r"^input: expected a last dimension of in_features=8, "
                                         r"got shape \(3, 7\)"):
        layer(torch.randn(3, 7))
    with pytest.raises(TypeError, match=r"^input: dtype torch.bfloat16, but the layer's "
                                        r"weight is torch.float32"):
        layer(torch.randn(3, 8, dtype=torch.bfloat16))
    wide = lnn.SwitchBackLinear(8, 4, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^input: dtype torch.float64 is not supported by "
                                        r"recipe switchback_int8"):
        wide(torch.randn(3, 8, dtype=torch.float64))
    half_bias = lnn.SwitchBackLinear(8, 4)
    half_bias.bias = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
    with pytest.raises(TypeError, match=r"^input: dtype torch.float32, but the layer's bias is "
                                        r"torch.float16"):
        half_bias(torch.randn(3, 8))
    meta = lnn.SwitchBackLinear(8, 4, device="meta")
    with pytest.raises(ValueError, match=r"^input: on cpu, but the layer's weight is on meta"):
        meta(torch.randn(3, 8))
    # Integer and float64 inputs are left alone by autocast, as torch's autocast leaves them.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(TypeError, match=r"^input: dtype torch.int64, but the layer's weight"):
            layer(torch.ones(3, 8, dtype=torch.int64))
        plain64 = lnn.LowPrecisionLinear(8, 4, dtype=torch.float64)
        assert plain64(torch.ones(3, 8, dtype=torch.float64)).dtype == torch.float64
    for make in (lambda: lnn.LowPrecisionLinear(8, 4, recipe=None),
                 lambda: lnn.Float8Linear(8, 4, recipe=None)):
        with pytest.raises(TypeError, match=r"^recipe: expected a lowbit.nn.LinearRecipe or a "
                                            r"recipe name, got None"):
            make()
    with pytest.raises(TypeError, match=r"^a: expected a lowbit.nn.Operand"):
        lnn.Matmul("e4m3fn", "e4m3fn")
    with pytest.raises(TypeError, match=r"^model: expected a torch.nn.Module, got int"):
        lnn.convert(3)


def test_meta_tensors_and_no_input_features_give_nn_linear_s_shapes():
    meta = lnn.SwitchBackLinear(8, 4, device="meta")
    y = meta(torch.empty(2, 5, 8, device="meta"))
    assert y.shape == (2, 5, 4) and y.device.type == "meta"
    torch.manual_seed(0)
    empty = lnn.SwitchBackLinear(0, 4)
    ref = torch.nn.Linear(0, 4)
    ref.load_state_dict(empty.state_dict())
    x = torch.zeros(3, 0, requires_grad=True)
    assert torch.equal(empty(x), ref(x))
    empty(x).sum().backward()
    assert torch.equal(empty.bias.grad, torch.full((4,), 3.0))


def test_strided_weight_and_bias_give_the_contiguous_bits():
    layer, x = layer_and_input("switchback", lead=(6,))
    dense = copy.deepcopy(layer)
    layer.weight = torch.nn.Parameter(layer.weight.detach().t().contiguous().t())
    bias = torch.zeros(2 * layer.out_features)
    bias[::2] = layer.bias.detach()
    layer.bias = torch.nn.Parameter(bias[::2])
    assert not layer.weight.is_contiguous() and not layer.bias.is_contiguous()
    assert torch.equal(layer(x), dense(x))


def test_a_gradient_of_the_gradient_is_refused_not_dropped():
    """The backward runs kernels on saved codes: differentiating its results again (a gradient
    penalty) raises instead of silently leaving out the penalty's terms."""
    layer, x = layer_and_input("switchback", lead=(6,))
    x.requires_grad_(True)
    (gx,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated again"):
        (layer(x).square().mean() + gx.square().sum()).backward()
    # A plain backward, and create_graph without differentiating the layer's gradients, work.
    (gx,) = torch.autograd.grad(layer(x).sum(), x, create_graph=True)
    assert gx.shape == x.shape


def test_convert_replaces_every_use_of_a_shared_linear():
    shared = torch.nn.Linear(8, 8)
    net = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    lnn.convert(net, "switchback_int8")
    assert type(net[0]) is lnn.LowPrecisionLinear and net[2] is net[0]
    assert net[0].weight is shared.weight
    kept = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    lnn.convert(kept, "switchback_int8", filter=lambda name, m: name != "0")
    assert type(kept[0]) is torch.nn.Linear and kept[2] is shared  # the first use decides


@pytest.mark.parametrize("variant", INT8_VARIANTS + ["tensorwise"])
def test_empty_batch(variant):
    layer, _ = layer_and_input(variant)
    x = torch.zeros(0, 4, 48, requires_grad=True)
    y = layer(x)
    assert y.shape == (0, 4, 24)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
    assert torch.equal(layer.bias.grad, torch.zeros_like(layer.bias))


def test_non_contiguous_input_gives_the_contiguous_bits():
    layer, x = layer_and_input("switchback", lead=(6,))
    xt = x.t().contiguous().t()  # same values, column-major
    assert not xt.is_contiguous()
    assert torch.equal(layer(xt), layer(x.contiguous()))
    big = torch.randn(6, 96)
    assert torch.equal(layer(big[:, ::2]), layer(big[:, ::2].contiguous()))


# ---- NaN and Inf ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", INT8_VARIANTS)
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_in_a_row_of_x_reaches_that_output_row_only(variant, fmt, bad):
    layer, x = layer_and_input(variant, fmt=fmt, lead=(6,))
    x[2, 7] = bad
    y = layer(x)
    assert torch.isnan(y[2]).all()
    assert torch.isfinite(torch.cat([y[:2], y[3:]])).all()


def test_nan_in_x_reaches_the_weight_gradient_as_documented():
    for variant, whole in (("switchback", False), ("switchback_q", False),
                           ("switchback_m", True)):
        layer, x = layer_and_input(variant, lead=(6,))
        x[2, 7] = float("nan")
        _, _, dx, dw, _ = run(layer, x)
        assert torch.isfinite(dx).all()
        if whole:
            assert torch.isnan(dw).all()
        else:
            assert torch.isnan(dw[:, 7]).all()
            assert torch.isfinite(dw[:, [i for i in range(48) if i != 7]]).all()
    layer, x = layer_and_input("tensorwise", lead=(6,))
    x[2, 7] = float("nan")
    assert torch.isnan(layer(x)).all()


def test_nan_in_w_of_switchback_q_reaches_one_input_gradient_column():
    layer, x = layer_and_input("switchback_q", lead=(5,))
    with torch.no_grad():
        layer.weight[1, 3] = float("nan")
    _, _, dx, _, _ = run(layer, x)
    assert torch.isnan(dx[:, 3]).all()
    assert torch.isfinite(dx[:, [i for i in range(48) if i != 3]]).all()


def test_nan_in_w_makes_every_output_nan():
    layer, x = layer_and_input("switchback", lead=(4,))
    with torch.no_grad():
        layer.weight[1, 3] = float("nan")
    assert torch.isnan(layer(x)).all()
    q, _ = layer_and_input("switchback_q", lead=(4,))
    with torch.no_grad():
        q.weight[1, 3] = float("nan")
    y = q(x)  # per out feature: that output column only
    assert torch.isnan(y[:, 1]).all() and torch.isfinite(y[:, [0] + list(range(2, 24))]).all()


def test_nan_in_a_row_of_g_reaches_that_input_gradient_row_and_all_of_dw():
    layer, x = layer_and_input("switchback", lead=(5,))
    g = torch.randn(5, 24)
    g[3, 0] = float("nan")
    _, _, dx, dw, db = run(layer, x, g)
    assert torch.isnan(dx[3]).all() and torch.isfinite(torch.cat([dx[:3], dx[4:]])).all()
    assert torch.isnan(dw[0]).all() and torch.isfinite(dw[1:]).all()
    assert torch.isnan(db[0]) and torch.isfinite(db[1:]).all()


# ---- torch.compile and autocast ------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager_bitwise(backend):
    # fullgraph=True: a graph break anywhere (the Function, the custom ops' fakes) is an error.
    torch.manual_seed(0)
    model = torch.nn.Sequential(lnn.SwitchBackLinear(16, 32), torch.nn.ReLU(),
                                lnn.SwitchBackLinear(32, 32, variant="switchback_q"),
                                torch.nn.ReLU(),
                                lnn.SwitchBackLinear(32, 8, variant="switchback_m", fmt="fp8"),
                                lnn.SwitchBackLinear(8, 4, variant="tensorwise", fmt="fp8"))
    x, gy = torch.randn(2, 6, 16), torch.randn(2, 6, 4)

    def step(m):
        xi = x.clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        y = m(xi)
        y.backward(gy)
        return [y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()]

    eager = step(model)
    torch._dynamo.reset()
    compiled = step(torch.compile(model, fullgraph=True, backend=backend))
    names = ["y", "dx"] + [n for n, _ in model.named_parameters()]
    for name, a, b in zip(names, eager, compiled):
        if backend == "inductor" and name.endswith("bias"):
            # db = G.sum(0) is torch's reduction, which inductor may reorder
            torch.testing.assert_close(a, b, rtol=4 * U * 12, atol=0)
        else:
            assert torch.equal(a, b), name


def test_autocast_runs_in_the_autocast_dtype():
    layer, x = layer_and_input("switchback", lead=(4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    ref = lnn.SwitchBackLinear(48, 24, dtype=torch.bfloat16)
    ref.load_state_dict({k: v.to(torch.bfloat16) for k, v in layer.state_dict().items()})
    assert torch.equal(y, ref(x.to(torch.bfloat16)))
    y.float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32  # the parameter's own dtype


# ---- the custom ops ------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["int8_sym", "e4m3fn", "e5m2"])
def test_custom_ops_pass_opcheck(fmt):
    x = torch.randn(5, 7)
    for op in (ops.quantize_rows, ops.quantize_tensor, ops.quantize_columns_t):
        torch.library.opcheck(op, (x, fmt))
        torch.library.opcheck(op, (x.to(torch.bfloat16), fmt))
    c, s = ops.quantize_rows(x, fmt)
    w, ws = ops.quantize_tensor(torch.randn(3, 7), fmt)
    torch.library.opcheck(ops.dequantize_rows, (c, s, fmt))
    for bias, dt in ((None, torch.float32), (torch.randn(3).to(torch.bfloat16), torch.bfloat16)):
        torch.library.opcheck(ops.scaled_mm, (c, s, fmt, w, ws, fmt, bias, dt, "automatic"))


def test_import_lowbit_does_not_import_torch():
    code = "import sys, lowbit; assert 'torch' not in sys.modules; import lowbit.nn; " \
           "assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- a short training run ------------------------------------------------------------------------


def train(convert_kw, steps=60, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(123)
    teacher = torch.randn(32, 4, generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    if convert_kw is not None:
        lnn.convert(model, **convert_kw)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(steps):
        x = torch.randn(128, 32, generator=g)
        y = torch.tanh(x @ teacher)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_switchback_int8_trains_like_nn_linear():
    base = train(None)
    sb = train(dict(variant="switchback", fmt="int8"))
    assert np.mean(sb[-10:]) < 0.5 * np.mean(sb[:5])
    assert abs(np.mean(sb[-10:]) - np.mean(base[-10:])) <= 0.05 * np.mean(base[-10:])


# ---- CUDA against CPU ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("variant", INT8_VARIANTS + ["tensorwise"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_int8_forward_and_grad_input_equal_cpu(variant, dtype):
    # The int8 GEMM is exact and the epilogue is the same float32 steps: CUDA == CPU, bitwise.
    layer, x = layer_and_input(variant, dtype=dtype, lead=(4, 64), fin=256, fout=128)
    y, g, dx, dw, db = run(layer, x)
    cuda = lnn.SwitchBackLinear(256, 128, dtype=dtype, device="cuda", variant=variant)
    cuda.load_state_dict(layer.state_dict())
    yc, _, dxc, dwc, dbc = run(cuda, x.cuda(), g.cuda())
    assert torch.equal(yc.cpu(), y)
    assert torch.equal(dxc.cpu(), dx)
    # dW (cuBLAS against the CPU's matmul) and db agree to the 16-bit dtype's rounding
    torch.testing.assert_close(dwc.cpu(), dw, rtol=2e-2 if dtype != torch.float32 else 1e-4,
                               atol=1e-2)
    torch.testing.assert_close(dbc.cpu(), db, rtol=2e-2 if dtype != torch.float32 else 1e-4,
                               atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["simt", "widened", "automatic"])
@pytest.mark.parametrize("variant", ["switchback", "switchback_q"])
def test_cuda_fp8_forward_and_grad_input(backend, variant):
    # The quantization is bitwise the CPU's; simt sums in the CPU twin's order (bitwise),
    # widened within the bound of a float32 sum in any order, automatic (native fp8 tensor cores
    # on sm_89+, which truncate between promotions) within the native-fp8 bound.
    layer, x = layer_and_input(variant, fmt="fp8", lead=(4, 64), fin=256, fout=128)
    y, g, dx, _, _ = run(layer, x)
    cuda = lnn.SwitchBackLinear(256, 128, device="cuda", variant=variant, fmt="fp8",
                                backend=backend)
    cuda.load_state_dict(layer.state_dict())
    yc, _, dxc, _, _ = run(cuda, x.cuda(), g.cuda())
    if backend == "simt":
        assert torch.equal(yc.cpu(), y) and torch.equal(dxc.cpu(), dx)
        return
    x2, w, g2 = to_np(x.reshape(-1, 256)), to_np(layer.weight), to_np(g.reshape(-1, 128))
    q = variant == "switchback_q"
    xc, xs = lowbit.quantize(x2, "e4m3fn", "rows")
    wc, ws = lowbit.quantize(w, "e4m3fn", "rows" if q else "tensor")
    native = backend == "automatic" and torch.cuda.get_device_capability() >= (8, 9)
    fp8_check(yc.cpu().reshape(-1, 128), xc, "e4m3fn", xs, wc, "e4m3fn", ws, to_np(layer.bias),
              torch.float32, native)
    gc, gs = lowbit.quantize(g2, "e5m2", "rows")
    wtc, wts = lowbit.quantize(w, "e4m3fn", "columns", transpose=True) if q else \
        (np.ascontiguousarray(wc.T), ws)
    fp8_check(dxc.cpu().reshape(-1, 256), gc, "e5m2", gs, wtc, "e4m3fn", wts, None,
              torch.float32, native)


@pytest.mark.gpu
def test_cuda_torch_compile_and_stream():
    layer, x = layer_and_input("switchback", dtype=torch.bfloat16, lead=(32,), fin=128,
                               fout=64, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = layer(x)
        yc = torch.compile(layer, fullgraph=True)(x)
    s.synchronize()
    assert torch.equal(y, yc)


def test_docstring_examples_run():
    import doctest

    import lowbit.nn.linear

    result = doctest.testmod(lowbit.nn.linear, extraglobs={"lowbit": lowbit, "torch": torch},
                             optionflags=doctest.NORMALIZE_WHITESPACE, report=True)
    assert result.attempted >= 3 and result.failed == 0


def test_switchback_doc_examples_run():
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "techniques" / "switchback.md"
    blocks = re.findall(r"^```python torch\n(.*?)^```\s*$", doc.read_text(encoding="utf-8"),
                        re.S | re.M)
    assert blocks
    for code in blocks:
        exec(compile(code, str(doc), "exec"), {"__name__": "__docs__"})


@pytest.mark.parametrize("fmt", ["int8_sym", "int4", "int4_sym", "e4m3fn", "e2m1fn", "bfloat16",
                                 "float16"])
def test_the_ops_fakes_give_the_real_code_dtypes(fmt):
    """Every quantize op's fake allocates the kernels' code dtype (int8 for signed integers,
    uint16 for 16-bit floats): a compiled graph then reads the codes as eager does."""
    x = torch.randn(5, 7)
    for op, args in ((ops.quantize_rows, (x, fmt)), (ops.quantize_tensor, (x, fmt)),
                     (ops.quantize_columns_t, (x, fmt))):
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
    codes, _ = torch.ops.lowbit.quantize_rows(x, fmt)
    assert codes.dtype == ops._code_dtype(fmt)


def test_the_quantize_ops_refuse_what_they_do_not_take_by_name():
    with pytest.raises(ValueError, match=r"^x: the quantize ops take 2-d tensors, got 3-d"):
        torch.ops.lowbit.quantize_rows(torch.randn(2, 3, 7), "e4m3fn")
    with pytest.raises(ValueError, match="cannot be a quantization target"):
        torch.ops.lowbit.quantize_rows(torch.randn(4, 8), "float32")
