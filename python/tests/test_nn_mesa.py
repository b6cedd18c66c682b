"""lowbit.nn.mesa: the activation-quantization ops bit-equal to an independent numpy computation
(per-group min/max, the estimate update and the codes as float32 numpy operations), each module's
forward equal to the plain PyTorch op, its backward equal to autograd's exact backward evaluated
on the dequantized saved tensors, gradcheck in float64 with quantization replaced by identity,
eval mode (no quantization, no update), the estimates in the state_dict, autocast, the memory
kept for backward, convert() on lowbit._tiny's ViT, torch.compile(fullgraph=True) equal to eager
bit for bit, bad input, and CUDA against CPU (marker gpu)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import lowbit.nn.mesa as mesa  # noqa: E402  (imports torch)
from lowbit import _tiny  # noqa: E402
from lowbit import _torch_ops as ops  # noqa: E402

pytestmark = pytest.mark.torch
F32 = np.float32


def np_estimates(x, alpha, beta, dim, groups, momentum):
    """The update of actquant.hpp in numpy float32, one operation at a time."""
    x = np.moveaxis(x.astype(F32), dim, 0)
    c = x.shape[0]
    xs = x.reshape(groups, c // groups, -1)
    a, b = alpha.astype(F32).copy(), beta.astype(F32).copy()
    m = F32(momentum)
    for g in range(groups):
        v = xs[g][np.isfinite(xs[g])]
        if v.size == 0:
            continue
        lo, hi = F32(v.min()), F32(v.max())
        ab = F32(F32(hi - lo) / F32(255))
        if not a[g] >= 0:
            a[g], b[g] = ab, lo
        else:
            keep = F32(F32(1) - m)
            a[g] = F32(F32(m * a[g]) + F32(keep * ab))
            b[g] = F32(F32(m * b[g]) + F32(keep * lo))
    return a, b


def np_codes(x, alpha, beta, dim, groups):
    x = x.astype(F32)
    shape = [1] * x.ndim
    c = x.shape[dim]
    shape[dim] = c
    a = np.repeat(alpha, c // groups).reshape(shape)
    b = np.repeat(beta, c // groups).reshape(shape)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        # actquant_ops::step: t = ((x - beta) s) r, r = 1 / (alpha s), s = 2^64 for |alpha| < 2^-126
        s = np.where(np.abs(a) < F32(2.0 ** -126), F32(2.0 ** 64), F32(1)).astype(F32)
        r = (F32(1) / (a * s).astype(F32)).astype(F32)
        t = (((x - b).astype(F32) * s).astype(F32) * r).astype(F32)
    t = np.nan_to_num(t, nan=0.0, posinf=255.0, neginf=0.0)
    return np.clip(np.rint(t), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("shape,dim,groups", [((2, 6, 5, 8), 1, 6), ((7, 48), -1, 4),
                                              ((3, 10), 0, 1), ((4, 3, 9), 2, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_ops_equal_numpy(shape, dim, groups, dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) * torch.linspace(0.5, 4, shape[-1])).to(dtype)
    x.view(-1)[3] = float("nan")
    alpha = torch.full((groups,), -1.0)
    beta = torch.zeros(groups)
    xn = x.float().numpy()
    want_a, want_b = np_estimates(xn, alpha.numpy(), beta.numpy(), dim, groups, 0.9)
    gs = shape[dim] // groups
    codes = ops._actquant_quantize(x, alpha, beta, dim, gs, True, False, 0.9, False, 0, 0, 0)
    np.testing.assert_array_equal(alpha.numpy(), want_a)
    np.testing.assert_array_equal(beta.numpy(), want_b)
    np.testing.assert_array_equal(codes.numpy(), np_codes(xn, want_a, want_b, dim, groups))
    # A second batch moves the estimates by the momentum.
    x2 = x * 2 + 1
    want_a, want_b = np_estimates(x2.float().numpy(), want_a, want_b, dim, groups, 0.9)
    codes = ops._actquant_quantize(x2, alpha, beta, dim, gs, True, False, 0.9, False, 0, 0, 0)
    np.testing.assert_array_equal(alpha.numpy(), want_a)
    np.testing.assert_array_equal(beta.numpy(), want_b)
    np.testing.assert_array_equal(codes.numpy(),
                                  np_codes(x2.float().numpy(), want_a, want_b, dim, groups))
    # Dequantize: code * alpha + beta in float32.
    out = ops._actquant_dequantize(codes, alpha, beta, dim, gs, torch.float32)
    sh = [1] * len(shape)
    sh[dim] = shape[dim]
    a = np.repeat(want_a, gs).reshape(sh)
    b = np.repeat(want_b, gs).reshape(sh)
    np.testing.assert_array_equal(out.numpy(), (codes.numpy().astype(F32) * a).astype(F32) + b)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    x = torch.full((4096,), 0.3)
    x[0], x[1] = 0.0, 1.0  # the range: alpha = 1/255
    alpha, beta = torch.full((1,), -1.0), torch.zeros(1)
    c1 = ops._actquant_quantize(x, alpha, beta, 0, 4096, True, False, 0.0, True, 16, 5, 0)
    c2 = ops._actquant_quantize(x, alpha.clone(), beta.clone(), 0, 4096, False, False, 0.0,
                                True, 16,
                                5, 0)
    assert torch.equal(c1, c2)
    v = ops._actquant_dequantize(c1, alpha, beta, 0, 4096, torch.float32)[2:]
    assert set(c1[2:].unique().tolist()) == {76, 77}  # 0.3 * 255 = 76.5
    assert abs(v.mean().item() - 0.3) < 4 * (0.5 / 255) / 4094 ** 0.5


# ---- modules: backward == exact backward on the dequantized saved tensors ------------------


def dequantized(quant, x, state):
    """What the quantizer's backward reads for x, recomputed with the ops from its state before
    the forward (an independent path through the same kernels)."""
    a, b = state["alpha"].clone(), state["beta"].clone()
    gs = x.shape[quant.dim] // quant.groups
    codes = ops._actquant_quantize(x.detach().contiguous(), a, b, quant.dim, gs, True,
                                   False, quant.momentum, False, 0, 0, 0)
    return ops._actquant_dequantize(codes, a, b, quant.dim, gs, x.dtype)


def states(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def grads(out, inputs, gy):
    return torch.autograd.grad(out, inputs, gy, allow_unused=True)


def test_linear_backward_is_exact_on_dequantized_input():
    torch.manual_seed(0)
    lin = torch.nn.Linear(24, 10)
    m = mesa.MesaLinear.from_linear(lin, groups=3)
    x = torch.randn(5, 7, 24, requires_grad=True)
    st = {k[len("quant."):]: v for k, v in states(m).items() if k.startswith("quant.")}
    y = m(x)
    assert torch.equal(y, lin(x))  # the exact forward
    gy = torch.randn_like(y)
    got = grads(y, [x, m.weight, m.bias], gy)
    xd = dequantized(m.quant, x, st).requires_grad_()
    want = grads(torch.nn.functional.linear(xd, lin.weight, lin.bias), [xd, lin.weight,
                                                                            lin.bias], gy)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    assert m.quant.alpha.min() > 0  # the estimates were initialised


@pytest.mark.parametrize("cls,fn", [(mesa.MesaGELU, torch.nn.functional.gelu),
                                    (mesa.MesaSiLU, torch.nn.functional.silu),
                                    (mesa.MesaReLU, torch.nn.functional.relu)])
@pytest.mark.parametrize("fused", [False, True])
def test_pointwise_backward_is_exact_on_dequantized_input(cls, fn, fused, monkeypatch):
    """Unfused: torch's own derivative kernel on the dequantized input, bit for bit. Fused
    (lowbit's kernel from the codes): torch's formula in lowbit's float32 arithmetic, whose exp
    and normal distribution function lie within 6 float32 ulps of the exact ones
    (test_actquant.cpp measures them); each of the derivative's two terms then carries at most
    about 16 u of relative error (u = 2^-24) from those and its few roundings, so the
    difference from torch's stays within 32 u of the terms' sizes; torch's GELU adds its own
    absolute error of up to 2 u (it forms 0.5 (1 + erf(x / sqrt 2)) in float32, which for
    negative x keeps only the error of 1 + erf, whatever the small result)."""
    monkeypatch.setattr(mesa, "_FUSED_ACTIVATION_BACKWARD", fused)
    torch.manual_seed(1)
    m = cls(groups=4)
    x = torch.randn(6, 16, requires_grad=True) * 3
    x.retain_grad()
    st = {k[len("quant."):]: v for k, v in states(m).items()}
    y = m(x)
    assert torch.equal(y, fn(x))
    gy = torch.randn_like(y)
    (got,) = grads(y, [x], gy)
    xd = dequantized(m.quant, x, st).requires_grad_()
    (want,) = grads(fn(xd), [xd], gy)
    if not fused or cls is mesa.MesaReLU:
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        return
    v = xd.detach().double()
    if cls is mesa.MesaGELU:
        terms = (torch.special.ndtr(v), v * torch.exp(-v * v / 2) / (2 * torch.pi) ** 0.5)
        torch_abs = 2.0
    else:
        sig = torch.sigmoid(v)
        terms = (sig, sig * v * (1 - sig))
        torch_abs = 0.0
    u = 2.0 ** -24
    bound = gy.double().abs() * (32 * u * (terms[0].abs() + terms[1].abs()) + torch_abs * u)
    assert ((got.double() - want.double()).abs() <= bound).all()


def test_layernorm_backward_is_exact_on_dequantized_input():
    torch.manual_seed(2)
    ln = torch.nn.LayerNorm(32)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    m = mesa.MesaLayerNorm.from_layernorm(ln, groups=2)
    x = torch.randn(3, 5, 32, requires_grad=True)
    st = {k[len("quant."):]: v for k, v in states(m).items() if k.startswith("quant.")}
    y = m(x)
    assert torch.equal(y, ln(x))
    gy = torch.randn_like(y)
    got = grads(y, [x, m.weight, m.bias], gy)
    xd = dequantized(m.quant, x, st).requires_grad_()
    want = grads(torch.nn.functional.layer_norm(xd, (32,), ln.weight, ln.bias), [xd, ln.weight,
                                                                                  ln.bias], gy)
    # The backward's statistics come from var_mean, whose reduction rounds in its own order:
    # within a few float32 ulps of layer_norm's own.
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=2e-6)
    # A constant row (a padding token) and a row of tiny spread among rows of large ones: the
    # gradient of the constant row is exact (recomputed statistics normalize what the backward
    # reads; the forward's would multiply its quantization error by 1 / sqrt(eps)).
    x = torch.randn(4, 32) * 10
    x[1] = 0.0
    x[2] = 3.0 + 1e-3 * torch.randn(32)
    x.requires_grad_(True)
    m = mesa.MesaLayerNorm.from_layernorm(ln)
    gy = torch.randn(4, 32)
    (got,) = grads(m(x), [x], gy)
    (want,) = grads(ln(x), [x], gy)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
    assert got[2].abs().max() < 10 * want[2].abs().max()


def _layernorm_grads(m, x, gy, fused: bool):
    old = mesa._FUSED_LAYER_NORM_BACKWARD
    mesa._FUSED_LAYER_NORM_BACKWARD = fused
    try:
        xi = x.detach().clone().requires_grad_()
        params = [p for p in (m.weight, m.bias) if p is not None]
        return grads(m(xi), [xi, *params], gy)
    finally:
        mesa._FUSED_LAYER_NORM_BACKWARD = old


@pytest.mark.parametrize("affine,bias", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_layernorm_fused_backward_equals_the_unfused_one(affine, bias, dtype):
    """The fused kernel (one read of the codes and the gradient) against dequantize + var_mean +
    aten's backward on the same codes: both evaluate layer_norm's backward on the dequantized
    input in float32, in different orders (kernels/actquant/actquant_ops.hpp's sums against
    aten's), so they agree to a few float32 ulps before the result's rounding to dtype, which
    for 16-bit dtypes may then differ by one ulp of that dtype."""
    torch.manual_seed(21)
    width = 768 if dtype == torch.float32 else 200
    m = mesa.MesaLayerNorm(width, elementwise_affine=affine, bias=bias, groups=12 if width == 768
                           else 4).to(dtype)
    if affine:
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            if bias:
                m.bias.uniform_(-0.5, 0.5)
    x = (torch.randn(3, 45, width) * 2 + 0.5).to(dtype)
    gy = torch.randn(3, 45, width).to(dtype)
    state = states(m)
    fused = _layernorm_grads(m, x, gy, True)
    m.load_state_dict(state)  # the same estimates encode the second call
    unfused = _layernorm_grads(m, x, gy, False)
    assert len(fused) == len(unfused) == 1 + affine + bias
    for f, u in zip(fused, unfused):
        assert f.dtype == u.dtype
        # Sums over a row (gx) or over the rows (gw, gb) that cancel: the difference is bounded
        # relative to the tensor's largest value, not each element's (float32: a few ulps of
        # sums of up to 768 terms; 16-bit: one ulp of the result).
        eps = torch.finfo(dtype).eps if dtype != torch.float32 else 1e-5
        assert (f.float() - u.float()).abs().max() <= 2 * eps * u.float().abs().max()


def test_layernorm_fused_backward_op_refuses_bad_input():
    codes = torch.zeros(4, 8, dtype=torch.uint8)
    a, b = torch.ones(2), torch.zeros(2)
    gy = torch.zeros(4, 8)
    op = ops._actquant_layer_norm_backward
    with pytest.raises(TypeError, match="gy"):
        op(codes, a, b, 4, gy.to(torch.float64), None, 1e-5)
    with pytest.raises(ValueError, match="gy"):
        op(codes, a, b, 4, torch.zeros(4, 9), None, 1e-5)
    with pytest.raises(ValueError, match="weight"):
        op(codes, a, b, 4, gy, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="codes"):
        op(codes.float(), a, b, 4, gy, None, 1e-5)
    with pytest.raises(ValueError, match="alpha"):
        op(codes, torch.ones(3), b, 4, gy, None, 1e-5)
    with pytest.raises(Exception, match="eps"):
        op(codes, a, b, 4, gy, None, float("nan"))
    with pytest.raises(Exception, match="group_size"):
        op(codes, a, b, 3, gy, None, 1e-5)
    gx, gw, gb = op(codes[:0], a, b, 4, gy[:0], None, 1e-5)  # no rows: zero parameter grads
    assert gx.shape == (0, 8) and torch.equal(gw, torch.zeros(8)) and torch.equal(gb, gw)


def test_softmax_backward_is_exact_on_dequantized_output():
    torch.manual_seed(3)
    m = mesa.MesaSoftmax(-1, groups=3, group_dim=1)
    s = torch.randn(2, 3, 7, 7, requires_grad=True)
    st = {k[len("quant."):]: v for k, v in states(m).items()}
    y = m(s)
    assert torch.equal(y, torch.softmax(s, -1))
    gy = torch.randn_like(y)
    (got,) = grads(y, [s], gy)
    yd = dequantized(m.quant, torch.softmax(s, -1), st)
    want = yd * (gy - (gy * yd).sum(-1, keepdim=True))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_backward_is_exact_on_dequantized_operands(transpose_b):
    torch.manual_seed(4)
    m = mesa.MesaMatMul(transpose_b, groups=4, dim=1)
    a = torch.randn(2, 4, 6, 5, requires_grad=True)
    b = torch.randn(2, 4, 6, 5, requires_grad=True) if transpose_b else \
        torch.randn(2, 4, 5, 3, requires_grad=True)
    sa = {k[len("quant_a."):]: v for k, v in states(m).items() if k.startswith("quant_a.")}
    sb = {k[len("quant_b."):]: v for k, v in states(m).items() if k.startswith("quant_b.")}
    y = m(a, b)
    bt = b.transpose(-2, -1) if transpose_b else b
    assert torch.equal(y, a @ bt)
    gy = torch.randn_like(y)
    got = grads(y, [a, b], gy)
    ad = dequantized(m.quant_a, a, sa).requires_grad_()
    bd = dequantized(m.quant_b, b, sb).requires_grad_()
    a_leaf = a.detach().requires_grad_()
    want_a = grads(a_leaf @ (bd.detach().transpose(-2, -1) if transpose_b else bd.detach()),
                   [a_leaf], gy)[0]
    b_leaf = b.detach().requires_grad_()
    want_b = grads(ad.detach() @ (b_leaf.transpose(-2, -1) if transpose_b else b_leaf),
                   [b_leaf], gy)[0]
    torch.testing.assert_close(got[0], want_a, rtol=0, atol=0)
    torch.testing.assert_close(got[1], want_b, rtol=0, atol=0)


def test_softmax_matmul_saves_the_softmax_once_and_is_exact_on_it():
    torch.manual_seed(5)
    m = mesa.MesaSoftmaxMatMul(groups=2, dim=1)
    s = torch.randn(3, 2, 8, 8, requires_grad=True)
    v = torch.randn(3, 2, 8, 4, requires_grad=True)
    sp = {k[len("quant_p."):]: t for k, t in states(m).items() if k.startswith("quant_p.")}
    sv = {k[len("quant_v."):]: t for k, t in states(m).items() if k.startswith("quant_v.")}
    y = m(s, v)
    torch.testing.assert_close(y, torch.softmax(s, -1) @ v, rtol=0, atol=0)
    gy = torch.randn_like(y)
    got = grads(y, [s, v], gy)
    pd = dequantized(m.quant_p, torch.softmax(s, -1), sp)
    vd = dequantized(m.quant_v, v, sv)
    p_leaf, v_leaf = pd.clone().requires_grad_(), v.detach().requires_grad_()
    gp = grads(p_leaf @ vd, [p_leaf], gy)[0]
    want_s = pd * (gp - (gp * pd).sum(-1, keepdim=True))
    want_v = grads(pd @ v_leaf, [v_leaf], gy)[0]
    torch.testing.assert_close(got[0], want_s, rtol=0, atol=0)
    torch.testing.assert_close(got[1], want_v, rtol=0, atol=0)
    # One 8-bit copy of the attention map and one of v (plus the estimates' copies).
    saved = mesa.saved_bytes(lambda: m(s, v))
    assert saved == s.numel() + v.numel() + 4 * 4 * 2


def test_sdpa_core_backward_is_exact_on_dequantized_qkv():
    torch.manual_seed(6)
    attn = mesa.MesaAttention(16, 4, core="sdpa")
    qkv = torch.randn(2, 5, 48, requires_grad=True)
    with torch.no_grad():  # heads of distinct ranges: a group per head of each of q, k and v
        qkv.mul_(torch.logspace(-2, 2, 12).repeat_interleave(4))
    st = {k[len("quant_qkv."):]: v for k, v in states(attn).items()}
    y = attn.attend(qkv)
    q, k, v = qkv.reshape(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4).unbind(0)
    torch.testing.assert_close(y, torch.nn.functional.scaled_dot_product_attention(q, k, v),
                               rtol=0, atol=0)
    assert attn.quant_qkv.groups == 12 and attn.quant_qkv.dim == -1
    gy = torch.randn_like(y)
    (got,) = grads(y, [qkv], gy)
    qd = dequantized(attn.quant_qkv, qkv, st).requires_grad_()
    want = grads(torch.nn.functional.scaled_dot_product_attention(
        *qd.reshape(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4).unbind(0)), [qd], gy)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # The groups are the heads of q, k and v: the estimates (and so the codes) are those of
    # quantizing q, k and v apart, a group per head of each.
    for i, t in enumerate((q, k, v)):
        a, b = st["alpha"][4 * i:4 * i + 4].clone(), st["beta"][4 * i:4 * i + 4].clone()
        ops._actquant_quantize(t.detach().contiguous(), a, b, 1, 1, True, False,
                               attn.quant_qkv.momentum, False, 0, 0, 0)
        assert torch.equal(a, attn.quant_qkv.alpha[4 * i:4 * i + 4])
        assert torch.equal(b, attn.quant_qkv.beta[4 * i:4 * i + 4])
    # One 8-bit copy of q, k and v (plus the estimates' copies: 12 groups).
    assert mesa.saved_bytes(lambda: attn.attend(qkv)) == qkv.numel() + 12 * 4 * 2


class Mlp(torch.nn.Module):  # timm's Mlp structure (dropout 0, no norm)
    def __init__(self, dim, hidden, act=torch.nn.GELU):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(dim, hidden), act(), torch.nn.Linear(
            hidden, dim)
        self.drop1, self.norm, self.drop2 = torch.nn.Dropout(0.0), torch.nn.Identity(), \
            torch.nn.Dropout(0.0)

    def forward(self, x):
        return self.drop2(self.fc2(self.norm(self.drop1(self.act(self.fc1(x))))))


@pytest.mark.parametrize("act,fn", [
    (torch.nn.GELU, torch.nn.functional.gelu),
    (lambda: torch.nn.GELU("tanh"), lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
    (torch.nn.SiLU, torch.nn.functional.silu), (torch.nn.ReLU, torch.nn.functional.relu)])
def test_mlp_backward_is_exact_on_dequantized_input_and_hidden(act, fn):
    """MesaMlp's backward is autograd's exact backward of fc2(act(h)), h = fc1(x), with x and h
    replaced by their dequantized 8-bit copies: fc2 reads act(dequantized h)."""
    torch.manual_seed(5)
    ref = Mlp(24, 40, act)
    m = mesa.MesaMlp.from_mlp(ref, groups=3)
    assert type(m.fc2) is torch.nn.Linear and m.fc1.quant.groups == 3
    x = torch.randn(5, 7, 24, requires_grad=True)
    sx = {k[len("fc1.quant."):]: v for k, v in states(m).items() if k.startswith("fc1.quant.")}
    sh = {k[len("act.quant."):]: v for k, v in states(m).items() if k.startswith("act.quant.")}
    y = m(x)
    assert torch.equal(y, ref(x))  # the exact forward
    gy = torch.randn_like(y)
    params = [m.fc1.weight, m.fc1.bias, m.fc2.weight, m.fc2.bias]
    got = grads(y, [x, *params], gy)
    f = torch.nn.functional
    xd = dequantized(m.fc1.quant, x, sx).requires_grad_()
    hd = dequantized(m.act.quant, f.linear(x, ref.fc1.weight, ref.fc1.bias), sh)
    hd.requires_grad_()
    w1, b1, w2, b2 = (p.detach().requires_grad_() for p in params)
    gw2, gb2, gh = grads(f.linear(fn(hd), w2, b2), [w2, b2, hd], gy)
    gx, gw1, gb1 = grads(f.linear(xd, w1, b1), [xd, w1, b1], gh)
    for g, w in zip(got, (gx, gw1, gb1, gw2, gb2)):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    # Two 8-bit tensors (and the estimates' copies: 3 groups, 1 group) where three modules keep
    # three: the hidden's act(h) is not kept.
    assert mesa.saved_bytes(lambda: m(x), exclude=m) == x.numel() + 40 * 35 + 8 * (3 + 1)


def test_convert_picks_mlp_only_when_asked_and_loads_module_by_module_state():
    torch.manual_seed(4)
    net = torch.nn.Sequential(Mlp(16, 32), Mlp(16, 32))
    net[1].drop1.p = 0.1  # dropout between fc1 and fc2: converted module by module
    per_module = mesa.convert(copy.deepcopy(net))
    assert type(per_module[0].fc2) is mesa.MesaLinear
    fused = mesa.convert(net, layers=("linear", "gelu", "mlp"))
    assert type(fused[0]) is mesa.MesaMlp and type(fused[1]) is Mlp
    assert type(fused[1].fc1) is mesa.MesaLinear and type(fused[1].act) is mesa.MesaGELU
    x = torch.randn(3, 16, requires_grad=True)
    per_module(x).sum().backward()
    # The module-by-module state_dict (fc2.quant's estimates too) loads strictly.
    fused.load_state_dict(per_module.state_dict())
    assert torch.equal(fused[0].act.quant.alpha, per_module[0].act.quant.alpha)
    with pytest.raises(ValueError, match="act"):
        mesa.MesaMlp(4, 8, act="tanh")
    dropped = Mlp(16, 32)
    dropped.drop2.p = 0.1
    with pytest.raises(ValueError, match="no dropout and no norm"):
        mesa.MesaMlp.from_mlp(dropped)


def test_tiny_block_with_the_fused_mlp():
    torch.manual_seed(3)
    blk = _tiny.Block(32, 4, 128)
    a = mesa.MesaTinyBlock(copy.deepcopy(blk), core="sdpa")
    b = mesa.MesaTinyBlock(copy.deepcopy(blk), core="sdpa", mlp=True)
    assert type(b.fc2) is torch.nn.Linear and "fc2.quant.alpha" not in b.state_dict()
    x = torch.randn(2, 6, 32, requires_grad=True)
    ya, yb = a(x), b(x)
    assert torch.equal(ya, yb)
    ya.square().sum().backward()
    yb.square().sum().backward()
    # Everything before fc2's weight gradient reads the same codes: the attention's gradients
    # are equal, fc2's weight gradient reads act(dequantized h) instead of an 8-bit act(h).
    for name in ("qkv.weight", "proj.weight", "norm1.weight"):
        pa, pb = a.get_parameter(name), b.get_parameter(name)
        torch.testing.assert_close(pa.grad, pb.grad, rtol=0.05, atol=1e-3)
    ga, gb = a.fc2.weight.grad, b.fc2.weight.grad
    assert not torch.equal(ga, gb) and ((ga - gb).norm() / ga.norm()) < 0.05
    b.load_state_dict(a.state_dict())  # the module-by-module block's keys load


def test_sdpa_core_loads_the_estimates_of_separate_q_k_v_quantizers():
    """A state_dict from before q, k and v were saved as one tensor (quant_q, quant_k, quant_v,
    a group per head each) loads: they are quant_qkv's groups in that order."""
    attn = mesa.MesaAttention(16, 4, core="sdpa")
    sd = {k: v for k, v in attn.state_dict().items() if not k.startswith("quant_qkv.")}
    for i, n in enumerate("qkv"):
        sd[f"quant_{n}.alpha"] = torch.arange(4.0) + 10 * i
        sd[f"quant_{n}.beta"] = -torch.arange(4.0) - 10 * i
    net = torch.nn.Sequential(attn)  # under a prefix, as in a model
    net.load_state_dict({f"0.{k}": v for k, v in sd.items()})
    assert torch.equal(attn.quant_qkv.alpha, torch.cat([torch.arange(4.0) + 10 * i
                                                        for i in range(3)]))
    assert torch.equal(attn.quant_qkv.beta, -attn.quant_qkv.alpha)
    with pytest.raises(ValueError, match="qkv of shape"):
        attn.attend(torch.randn(2, 5, 16))
    with pytest.raises(TypeError, match="takes the qkv projection's output"):
        attn.attend(*(torch.randn(2, 4, 5, 4) for _ in range(3)))


# ---- gradcheck with quantization replaced by identity ----------------------------------------


def identity(m):
    for mod in m.modules():
        if isinstance(mod, mesa.ActQuantizer):
            mod.enabled = False
    return m


@pytest.mark.parametrize("make,inputs", [
    (lambda: mesa.MesaLinear(6, 4, groups=2), [(3, 6)]),
    (lambda: mesa.MesaGELU(), [(3, 5)]),
    (lambda: mesa.MesaGELU("tanh"), [(3, 5)]),
    (lambda: mesa.MesaSiLU(), [(3, 5)]),
    (lambda: mesa.MesaLayerNorm(6), [(2, 6)]),
    (lambda: mesa.MesaSoftmax(-1, groups=1), [(2, 3, 4)]),
    (lambda: mesa.MesaMatMul(True, groups=2), [(1, 2, 3, 4), (1, 2, 5, 4)]),
    (lambda: mesa.MesaMatMul(False, groups=2), [(1, 2, 3, 4), (1, 2, 4, 5)]),
    (lambda: mesa.MesaMatMul(False, groups=1), [(2, 3, 4), (4, 5)]),  # broadcast b
    (lambda: mesa.MesaSoftmaxMatMul(groups=2), [(1, 2, 3, 3), (1, 2, 3, 4)]),
    (lambda: mesa.MesaAttention(8, 2, qkv_bias=True), [(2, 3, 8)]),
    (lambda: mesa.MesaAttention(8, 2, core="sdpa"), [(2, 3, 8)]),
    (lambda: mesa.MesaMlp(6, 10, act="gelu_tanh", groups=2), [(3, 6)]),
    (lambda: mesa.MesaMlp(6, 10, act="silu", bias=False), [(2, 2, 6)]),
])
def test_gradcheck_float64_identity_quantization(make, inputs):
    torch.manual_seed(7)
    m = identity(make()).double()
    xs = [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in inputs]
    assert torch.autograd.gradcheck(lambda *a: m(*a), xs, eps=1e-6, atol=1e-5)


# ---- modes, state, autocast, memory ----------------------------------------------------------


def test_eval_mode_quantizes_nothing_and_updates_nothing():
    m = mesa.MesaLinear(8, 8).eval()
    x = torch.randn(4, 8, requires_grad=True)
    before = states(m)
    native = mesa.saved_bytes(lambda: torch.nn.functional.linear(x, m.weight, m.bias))
    assert mesa.saved_bytes(lambda: m(x)) == native
    for k, v in states(m).items():
        assert torch.equal(v, before[k])
    m.train()
    with torch.no_grad():
        m(x)
    assert torch.equal(m.quant.alpha, before["quant.alpha"])  # nothing to save: no update
    m(x)
    assert not torch.equal(m.quant.alpha, before["quant.alpha"])


def test_state_dict_carries_the_estimates():
    torch.manual_seed(8)
    m = mesa.MesaAttention(16, 4)
    m(torch.randn(2, 5, 16, requires_grad=True)).sum().backward()
    sd = m.state_dict()
    for key in ("qkv.quant.alpha", "proj.quant.beta", "qk.quant_a.alpha", "pv.quant_p.beta"):
        assert key in sd
    assert sd["proj.quant.alpha"].shape == (4,) and sd["qk.quant_a.alpha"].shape == (4,)
    fresh = mesa.MesaAttention(16, 4)
    fresh.load_state_dict(sd)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, sd[k])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_forward_equals_native_autocast(dtype):
    torch.manual_seed(9)
    lin, ln = torch.nn.Linear(16, 8), torch.nn.LayerNorm(16)
    ml, mln = mesa.MesaLinear.from_linear(lin), mesa.MesaLayerNorm.from_layernorm(ln)
    x = torch.randn(4, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        want = lin(ln(x))
        got = ml(mln(x))
    assert got.dtype == want.dtype == dtype
    assert torch.equal(got, want)
    got.float().sum().backward()
    assert x.grad.dtype == torch.float32 and lin.weight.grad.dtype == torch.float32


def test_memory_kept_for_backward():
    torch.manual_seed(10)
    x = torch.randn(64, 256, requires_grad=True)
    m = mesa.MesaGELU()
    native = mesa.saved_bytes(lambda: torch.nn.functional.gelu(x))
    assert native == 4 * x.numel()
    assert mesa.saved_bytes(lambda: m(x)) == x.numel() + 8  # codes + alpha, beta copies


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="multiple of groups"):
        mesa.MesaLinear(10, 4, groups=3)(torch.randn(2, 10, requires_grad=True))
    with pytest.raises(ValueError, match="momentum"):
        mesa.ActQuantizer(momentum=1.5)
    with pytest.raises(ValueError, match="rounding"):
        mesa.ActQuantizer(rounding="up")
    with pytest.raises(ValueError, match="core"):
        mesa.MesaAttention(8, 2, core="flash")
    with pytest.raises(ValueError, match="alpha: 3 elements"):
        ops._actquant_quantize(torch.randn(3, 4), torch.zeros(3), torch.zeros(3), -1, 2, True,
                               False, 0.9, False, 0, 0, 0)
    with pytest.raises(ValueError, match="does not divide"):
        ops._actquant_quantize(torch.randn(3, 5), torch.zeros(2), torch.zeros(2), -1, 2, True,
                               False, 0.9, False, 0, 0, 0)
    with pytest.raises(ValueError, match="momentum"):
        ops._actquant_quantize(torch.randn(3, 4), torch.zeros(2), torch.zeros(2), -1, 2, True,
                               False, 2.0, False, 0, 0, 0)
    with pytest.raises(TypeError):
        ops._actquant_quantize(torch.randn(3, 4).double(), torch.zeros(2), torch.zeros(2), -1, 2,
                               True, False, 0.9, False, 0, 0, 0)
    with pytest.raises(ValueError, match="layers"):
        mesa.convert(torch.nn.Linear(2, 2), layers=("conv",))
    with pytest.raises(ValueError, match="grouped dimension"):  # 0 heads: no group to estimate
        mesa.MesaSoftmax(groups=1, group_dim=1)(torch.randn(3, 0, 4, 4, requires_grad=True))


@pytest.mark.parametrize("shape", [(0, 16), (3, 0, 16), (0, 5, 16)])
def test_empty_batches_train(shape):
    # An empty batch or an empty run of tokens: forward and backward run, the gradients are
    # empty or zero, and the estimates stay unset (no value to estimate them from).
    modules = [mesa.MesaLinear(16, 8, groups=2), mesa.MesaGELU(), mesa.MesaSiLU(),
               mesa.MesaReLU(), mesa.MesaLayerNorm(16, groups=4), mesa.MesaMlp(16, 24)]
    if len(shape) == 3:
        modules.append(mesa.MesaAttention(16, 2))
    for m in modules:
        x = torch.zeros(*shape, requires_grad=True)
        y = m(x)
        y.sum().backward()
        assert x.grad.shape == x.shape
        for p in m.parameters():
            assert p.grad is not None and not p.grad.any(), type(m).__name__
        for q in (mod for mod in m.modules() if isinstance(mod, mesa.ActQuantizer)):
            assert (q.alpha < 0).all(), type(m).__name__


# ---- convert on lowbit._tiny's ViT -------------------------------------------------------------


@pytest.mark.parametrize("core", ["sdpa", "explicit"])
def test_convert_tiny_vit(core):
    torch.manual_seed(11)
    model = _tiny.TinyViT(width=32, depth=2, heads=4)
    ref = copy.deepcopy(model)
    mesa.convert(model, core=core, filter=_tiny.only_blocks)
    assert all(type(b) is mesa.MesaTinyBlock for b in model.blocks)
    assert type(model.head) is torch.nn.Linear  # outside the filter
    x, y = next(_tiny.make_data(1, 8, 0, "cpu"))
    out = model(x)
    want = ref(x)
    if core == "sdpa":
        assert torch.equal(out, want)
    else:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.nn.functional.cross_entropy(out, y).backward()
    torch.nn.functional.cross_entropy(want, y).backward()
    # The gradients against full precision: 8-bit saved activations perturb them a little.
    num = sum((p.grad - q.grad).pow(2).sum() for p, q in zip(model.parameters(),
                                                              ref.parameters()))
    den = sum(q.grad.pow(2).sum() for q in ref.parameters())
    assert (num / den).sqrt() < 0.05
    # The original state_dict loads into the converted model (strict=False: the estimates).
    missing, unexpected = model.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and all(k.endswith(("alpha", "beta")) for k in missing)


def test_convert_timm_style_modules():
    class Attention(torch.nn.Module):  # timm's structure
        def __init__(self, dim, heads):
            super().__init__()
            self.num_heads, self.head_dim, self.scale = heads, dim // heads, (dim // heads) ** -.5
            self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
            self.q_norm = self.k_norm = torch.nn.Identity()
            self.attn_drop, self.proj_drop = torch.nn.Dropout(0.0), torch.nn.Dropout(0.0)

        def forward(self, x):
            b, n, c = x.shape
            qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1,
                                                                                        4)
            q, k, v = qkv.unbind(0)
            a = torch.softmax((q * self.scale) @ k.transpose(-2, -1), -1) @ v
            return self.proj_drop(self.proj(a.transpose(1, 2).reshape(b, n, c)))

    torch.manual_seed(12)
    net = torch.nn.Sequential(torch.nn.LayerNorm(16), Attention(16, 4), torch.nn.Linear(16, 32),
                              torch.nn.GELU(), torch.nn.Linear(32, 16))
    ref = copy.deepcopy(net)
    mesa.convert(net)
    assert [type(m).__name__ for m in net] == ["MesaLayerNorm", "MesaAttention", "MesaLinear",
                                               "MesaGELU", "MesaLinear"]
    x = torch.randn(2, 5, 16, requires_grad=True)
    torch.testing.assert_close(net(x), ref(x), rtol=1e-5, atol=1e-6)
    net(x).sum().backward()


# ---- torch.compile ---------------------------------------------------------------------------


COMPILED = {
    "linear": (lambda: mesa.MesaLinear(16, 32, groups=2), [(4, 16)]),
    "gelu": (lambda: mesa.MesaGELU(), [(4, 16)]),
    "silu": (lambda: mesa.MesaSiLU(), [(4, 16)]),
    "relu": (lambda: mesa.MesaReLU(), [(4, 16)]),
    "layernorm": (lambda: mesa.MesaLayerNorm(16, groups=4), [(4, 16)]),
    "softmax": (lambda: mesa.MesaSoftmax(groups=2), [(2, 2, 4, 8)]),
    "matmul": (lambda: mesa.MesaMatMul(groups=2), [(2, 2, 4, 8), (2, 2, 8, 4)]),
    "softmax_matmul": (lambda: mesa.MesaSoftmaxMatMul(groups=2), [(2, 2, 4, 4), (2, 2, 4, 8)]),
    "attention": (lambda: mesa.MesaAttention(16, 2), [(2, 5, 16)]),
    "attention_sdpa": (lambda: mesa.MesaAttention(16, 2, core="sdpa"), [(2, 5, 16)]),
    "mlp": (lambda: mesa.MesaMlp(16, 32, groups=2), [(4, 16)]),
    "mlp_relu": (lambda: mesa.MesaMlp(16, 32, act="relu"), [(4, 16)]),
    "tiny_vit_fused_mlp": (lambda: mesa.convert(_tiny.TinyViT(width=32, depth=2, heads=2),
                                                layers=("attention", "mlp")),
                           [(4, 3, 32, 32)]),
    "converted_tiny_vit": (lambda: mesa.convert(_tiny.TinyViT(width=32, depth=2, heads=2)),
                           [(4, 3, 32, 32)]),
    "converted_tiny_vit_sdpa": (lambda: mesa.convert(_tiny.TinyViT(width=32, depth=2, heads=2),
                                                     core="sdpa"), [(4, 3, 32, 32)]),
}


def _eager_and_compiled(make, inputs, steps=2):
    """Trains a module and its copy under torch.compile(fullgraph=True, backend="aot_eager")
    for `steps` forward + backward passes on the same inputs; returns both sides' last outputs,
    input gradients, parameter gradients and state_dicts (the running estimates among them)."""
    torch.manual_seed(1)
    m = make()
    c = copy.deepcopy(m)
    sides = []
    torch._dynamo.reset()
    for module in (m, torch.compile(c, fullgraph=True, backend="aot_eager")):
        xs = [x.clone().requires_grad_(True) for x in inputs]
        for _ in range(steps):
            y = module(*xs)
            y.square().sum().backward()
        sides.append((y, [x.grad for x in xs]))
    return sides, (m, c)


@pytest.mark.parametrize("name", list(COMPILED))
def test_torch_compile_fullgraph_matches_eager_bitwise(name):
    # fullgraph=True: a graph break anywhere (the Functions' backward, the custom ops' fakes)
    # is an error. The estimates move at each training step, so the second step's codes
    # depend on the first step's update having happened in the compiled graph too.
    make, shapes = COMPILED[name]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*shape, generator=gen) for shape in shapes]
    ((ye, ge), (yc, gc)), (m, c) = _eager_and_compiled(make, inputs)
    assert torch.equal(ye, yc)
    for a, b in zip(ge, gc):
        assert torch.equal(a, b)
    for (k, a), b in zip(m.state_dict().items(), c.state_dict().values()):
        assert torch.equal(a, b), k
    for (k, p), q in zip(m.named_parameters(), c.parameters()):
        assert torch.equal(p.grad, q.grad), k


# ---- CUDA against CPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_cuda_equals_cpu():
    torch.manual_seed(13)
    for shape, dim, groups, dtype in [((4, 12, 197, 64), 1, 12, torch.bfloat16),
                                      ((788, 768), -1, 12, torch.float32),
                                      ((3, 5, 7), 1, 5, torch.float16)]:
        x = torch.randn(shape).to(dtype)
        gs = shape[dim] // groups
        outs = []
        for dev in ("cpu", "cuda"):
            a, b = torch.full((groups,), -1.0, device=dev), torch.zeros(groups, device=dev)
            xd = x.to(dev)
            c = ops._actquant_quantize(xd, a, b, dim, gs, True, False, 0.9, True, 8, 3, 4)
            c = ops._actquant_quantize(xd * 1.5, a, b, dim, gs, True, False, 0.9, True, 8, 3,
                                       5)
            c = ops._actquant_quantize(xd * 0.5, a, b, dim, gs, True, True, 0.9, True, 8, 3, 6)
            v = ops._actquant_dequantize(c, a, b, dim, gs, dtype)
            torch.cuda.synchronize()
            outs.append([t.cpu() for t in (a, b, c, v)])
        for p, q in zip(*outs):
            assert torch.equal(p.view(torch.uint8) if p.dtype != torch.uint8 else p,
                               q.view(torch.uint8) if q.dtype != torch.uint8 else q)


@pytest.mark.gpu
def test_cuda_layernorm_backward_equals_cpu():
    torch.manual_seed(14)
    for rows, width, groups, dtype, affine in [(50432 // 8, 768, 12, torch.float32, True),
                                               (97, 130, 2, torch.bfloat16, True),
                                               (33, 1500, 3, torch.float16, False),
                                               (5, 64, 1, torch.float32, False)]:
        x = torch.randn(rows, width) * 3
        gy = torch.randn(rows, width).to(dtype)
        w = torch.rand(width) + 0.5 if affine else None
        outs = []
        for dev in ("cpu", "cuda"):
            a, b = torch.full((groups,), -1.0, device=dev), torch.zeros(groups, device=dev)
            c = ops._actquant_quantize(x.to(dev, dtype), a, b, -1, width // groups, True, False,
                                       0.9, False, 0, 0, 0)
            got = ops._actquant_layer_norm_backward(
                c, a, b, width // groups, gy.to(dev), None if w is None else w.to(dev), 1e-5)
            torch.cuda.synchronize()
            outs.append([t.cpu() for t in got])
        for p, q in zip(*outs):
            assert torch.equal(p.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.gpu
def test_cuda_activation_backward_equals_cpu():
    torch.manual_seed(15)
    for shape, dim, groups, dtype in [((50432 // 16, 3072), -1, 1, torch.bfloat16),
                                      ((4, 12, 197, 64), 1, 12, torch.float32),
                                      ((3, 5, 7, 11), 2, 7, torch.float16),   # runs of 11
                                      ((2, 64, 9), 1, 32, torch.bfloat16),    # beyond the tables
                                      ((5,), 0, 1, torch.float32)]:
        x = torch.randn(shape) * 4
        dy = torch.randn(shape).to(dtype)
        dy.view(-1)[::97] = float("nan")
        gs = shape[dim] // groups
        for act in ("gelu", "gelu_tanh", "silu", "relu"):
            outs = []
            for dev in ("cpu", "cuda"):
                a, b = torch.full((groups,), -1.0, device=dev), torch.zeros(groups, device=dev)
                c = ops._actquant_quantize(x.to(dev, dtype), a, b, dim, gs, True, False, 0.9,
                                           False, 0, 0, 0)
                got = ops._actquant_activation_backward(c, a, b, dim, gs, act, dy.to(dev), True)
                torch.cuda.synchronize()
                outs.append([t.cpu() for t in got])
            for p, q in zip(*outs):
                assert torch.equal(p.view(torch.uint8), q.view(torch.uint8)), (shape, act)


def test_lagged_quantizer_encodes_with_the_previous_estimates():
    torch.manual_seed(14)
    q = mesa.ActQuantizer(2, -1, momentum=0.5, lagged=True)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8) * 3
    q.pack(x1)  # no estimate yet: updated first
    a1, b1 = q.alpha.clone(), q.beta.clone()
    codes, a, b = q.pack(x2)
    assert torch.equal(a, a1) and torch.equal(b, b1)
    want = ops._actquant_quantize(x2, a1.clone(), b1.clone(), -1, 4, False, False, 0.5, False, 0,
                                  0, 0)
    assert torch.equal(codes, want)
    ua, ub = a1.clone(), b1.clone()
    ops._actquant_quantize(x2, ua, ub, -1, 4, True, False, 0.5, False, 0, 0, 0)
    assert torch.equal(q.alpha, ua) and torch.equal(q.beta, ub)
    # After load_state_dict the next call updates first again (the loaded state may be unset).
    q.load_state_dict({"alpha": torch.full((2,), -1.0), "beta": torch.zeros(2)})
    codes, a, b = q.pack(x1)
    assert (a > 0).all()


def test_lagged_linear_backward_uses_the_estimates_that_encoded_it():
    torch.manual_seed(15)
    lin = torch.nn.Linear(8, 3)
    m = mesa.MesaLinear.from_linear(lin, lagged=True)
    m(torch.randn(5, 8, requires_grad=True)).sum().backward()  # initialises the estimates
    a0, b0 = m.quant.alpha.clone(), m.quant.beta.clone()
    x = torch.randn(5, 8, requires_grad=True) * 2
    m.weight.grad = None
    y = m(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    codes = ops._actquant_quantize(x.detach(), a0.clone(), b0.clone(), -1, 8, False, False, 0.9,
                                   False, 0, 0, 0)
    xd = ops._actquant_dequantize(codes, a0, b0, -1, 8, torch.float32)
    torch.testing.assert_close(m.weight.grad, gy.t() @ xd, rtol=1e-6, atol=1e-6)
    assert not torch.equal(m.quant.alpha, a0)  # and the estimates moved


@pytest.mark.gpu
@pytest.mark.parametrize("core", ["explicit", "sdpa"])
@pytest.mark.parametrize("lagged", [False, True])
@pytest.mark.parametrize("mlp", [False, True])
def test_cuda_tiny_vit_under_autocast(core, lagged, mlp):
    """On CUDA under bfloat16 autocast: the converted ViT's forward is the original's, its
    backward equals the exact backward on the dequantized saved tensors up to the bf16 matmuls'
    reordering (checked loosely here: the CPU tests check it exactly), the estimates live on the
    GPU and move."""
    torch.manual_seed(16)
    model = _tiny.TinyViT(width=64, depth=2, heads=4).cuda()
    ref = copy.deepcopy(model)
    mesa.convert(model, core=core, lagged=lagged, filter=_tiny.only_blocks,
                 layers=("attention", "mlp") if mlp else ("attention",))
    for step, (x, y) in enumerate(_tiny.make_data(3, 16, 0, "cuda")):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out, want = model(x), ref(x)
            loss = torch.nn.functional.cross_entropy(out, y)
            loss_ref = torch.nn.functional.cross_entropy(want, y)
        # The same forward: the attention kernels may differ (grad mode picks SDPA's backend).
        torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
        model.zero_grad()
        ref.zero_grad()
        loss.backward()
        loss_ref.backward()
        num = sum(((p.grad - q.grad).float() ** 2).sum() for p, q in zip(model.parameters(),
                                                                        ref.parameters()))
        den = sum((q.grad.float() ** 2).sum() for q in ref.parameters())
        assert (num / den).sqrt() < 0.1
    q = model.blocks[0].fc1.quant
    assert q.alpha.is_cuda and (q.alpha > 0).all()


def test_checkpoint_combines_with_mesa():
    """Reentrant checkpointing runs the first forward without gradients (Mesa quantizes nothing
    there), so the recomputation sees the estimates as an unchecked run does: the same
    gradients, bit for bit. The non-reentrant one quantizes in both forwards (docs)."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(17)
    blk = _tiny.Block(32, 4, 128)
    a = mesa.MesaTinyBlock(copy.deepcopy(blk))
    b = copy.deepcopy(a)
    c = copy.deepcopy(a)
    x = torch.randn(2, 6, 32, requires_grad=True)
    a(x).sum().backward()
    checkpoint(b, x, use_reentrant=True).sum().backward()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    checkpoint(c, x, use_reentrant=False).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in c.parameters())


def test_a_gradient_of_the_gradient_is_refused_not_dropped():
    """The backward reads 8-bit copies: differentiating its gradients again raises."""
    torch.manual_seed(18)
    for m, shape in ((mesa.MesaGELU(), (4, 16)), (mesa.MesaLinear(16, 8), (4, 16)),
                     (mesa.MesaMlp(16, 8), (4, 16)),
                     (mesa.MesaAttention(16, 2, core="sdpa"), (2, 5, 16))):
        x = torch.randn(*shape, requires_grad=True)
        (gx,) = torch.autograd.grad(m(x).sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="cannot be differentiated again"):
            gx.square().sum().backward()


def test_bad_settings_and_shapes_are_refused_by_name():
    for kw, msg in ((dict(seed=-1), "seed: expected an int in"), (dict(seed=1.5), "seed"),
                    (dict(random_bits=2.5), "random_bits"), (dict(groups=True), "groups"),
                    (dict(momentum=True), "momentum"), (dict(dim=None), "dim: expected an int")):
        with pytest.raises(ValueError, match=msg):
            mesa.ActQuantizer(**kw)
    with pytest.raises(ValueError, match="dim 1 is out of range for an input of 1 dimension"):
        mesa.MesaSoftmax(-1)(torch.randn(5, requires_grad=True))
    with pytest.raises(ValueError, match="num_heads = 0: expected positive ints"):
        mesa.MesaAttention(32, 0)
    with pytest.raises(TypeError, match="a torch.float64 activation"):
        mesa.MesaLinear(8, 4).double()(torch.randn(2, 8, dtype=torch.float64,
                                                   requires_grad=True))
    with pytest.raises(TypeError, match="layers: expected a tuple of kinds"):
        mesa.convert(torch.nn.Sequential(torch.nn.ReLU()), layers="linear")


def test_a_refused_convert_changes_nothing_and_shared_modules_convert_everywhere():
    model = _tiny.TinyViT(width=32, depth=1, heads=4)
    before = [type(m) for m in model.modules()]
    with pytest.raises(ValueError, match="core: expected 'explicit' or 'sdpa'"):
        mesa.convert(model, core="flash")
    assert [type(m) for m in model.modules()] == before
    lin = torch.nn.Linear(4, 4)
    seq = torch.nn.Sequential(lin, torch.nn.ReLU(), lin)
    mesa.convert(seq)
    assert type(seq[0]) is mesa.MesaLinear and seq[2] is seq[0]


def test_estimates_stay_float32_when_the_module_is_cast():
    m = mesa.MesaLinear(8, 4)
    m((torch.randn(3, 8) + 1e5).requires_grad_()).sum().backward()
    alpha, beta = m.quant.alpha.clone(), m.quant.beta.clone()
    m.half()
    assert m.quant.alpha.dtype == torch.float32 and torch.equal(m.quant.beta, beta)
    m.float()
    assert torch.equal(m.quant.alpha, alpha) and torch.equal(m.quant.beta, beta)


def test_autocast_dtypes_follow_torch_s_rules_on_the_cpu():
    """CPU autocast leaves layer_norm and softmax in their input's dtype and float64 alone:
    training mode (which saves 8-bit copies) computes in the dtypes eval mode's plain ops do."""
    torch.manual_seed(19)
    cases = [(mesa.MesaLayerNorm(8), [(2, 8)], torch.bfloat16),
             (mesa.MesaSoftmax(-1, groups=1, group_dim=0), [(2, 8)], torch.bfloat16),
             (mesa.MesaLinear(8, 4), [(2, 8)], torch.float32),
             (mesa.MesaSoftmaxMatMul(groups=1, dim=0), [(2, 4, 4), (2, 4, 3)], torch.float16)]
    for m, shapes, dt in cases:
        xs = [torch.randn(*s, dtype=dt, requires_grad=True) for s in shapes]
        if isinstance(m, mesa.MesaSoftmaxMatMul):
            xs[0] = torch.randn(*shapes[0], requires_grad=True)  # float32 s, float16 v
        with torch.autocast("cpu", dtype=torch.bfloat16):
            train = m.train()(*xs)
            with torch.no_grad():
                evaluated = m.eval()(*xs)
        assert train.dtype == evaluated.dtype, type(m).__name__


def test_torch_compile_does_not_recompile_every_step():
    """Nearest rounding moves no per-call counter, so a compiled module keeps its graph over
    many steps (fullgraph=True fails once dynamo's recompile limit, 8, is reached)."""
    torch._dynamo.reset()
    m = mesa.MesaLinear(48, 24, groups=4)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    for _ in range(12):
        x = torch.randn(8, 48, requires_grad=True)
        cm(x).square().sum().backward()
    assert m.quant.calls == 0
