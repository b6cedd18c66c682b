"""lowbit.optim on CPU tensors (marker torch) and CUDA tensors (marker gpu): the 32-bit variants
against torch.optim step by step, 8-bit against 32-bit trajectories on a small MLP, state_dict
round trips, loading torch's states, the NaN/Inf rule, per-parameter overrides and
StableEmbedding."""

from __future__ import annotations

import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import lowbit.optim as lo  # noqa: E402
from lowbit.nn.embedding import StableEmbedding  # noqa: E402

pytestmark = pytest.mark.torch


# ---- 32-bit variants against torch.optim, one step at a time ------------------------------------

# Each case: (lowbit class, torch class, constructor arguments, torch's state names).
CASES = [
    (lo.Adam, torch.optim.Adam, dict(lr=1e-3), ["exp_avg", "exp_avg_sq"]),
    (lo.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1),
     ["exp_avg", "exp_avg_sq"]),
    (lo.AdamW, torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.05), ["exp_avg", "exp_avg_sq"]),
    (lo.AdamW, torch.optim.AdamW, dict(lr=3e-3, eps=1e-6, maximize=True),
     ["exp_avg", "exp_avg_sq"]),
    (lo.SGD, torch.optim.SGD, dict(lr=0.1), []),
    (lo.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=1e-3),
     ["momentum_buffer"]),
    (lo.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True), ["momentum_buffer"]),
    (lo.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.5, dampening=0.3), ["momentum_buffer"]),
    (lo.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, weight_decay=0.01), ["square_avg"]),
    (lo.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, momentum=0.9, weight_decay=0.01),
     ["square_avg", "momentum_buffer"]),
    (lo.RMSprop, torch.optim.RMSprop, dict(lr=1e-2, alpha=0.9, centered=True),
     ["square_avg", "grad_avg"]),
    # The forms of three states: RMSprop centered with momentum, Adam's and AdamW's amsgrad
    # (beta2 0.9 and 0.95, so that v falls below its running maximum within the 20 steps).
    (lo.RMSprop, torch.optim.RMSprop,
     dict(lr=1e-2, alpha=0.9, momentum=0.9, centered=True, weight_decay=0.01),
     ["square_avg", "momentum_buffer", "grad_avg"]),
    (lo.Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.9), weight_decay=0.1, amsgrad=True),
     ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    (lo.AdamW, torch.optim.AdamW, dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.05,
                                       amsgrad=True, maximize=True),
     ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]),
    (lo.Adagrad, torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
     ["sum"]),
]

# Per step, from identical parameters and states: the parameters differ by at most PARAM_ULPS
# ulps of the largest of the old value, the new value and their difference (that times
# (|g| + wd |p|) / |g + wd p| under L2 weight decay, the cancellation the update inherits), and
# each state by at
# most STATE_UNITS * 2^-24 times its magnitude, the state's recurrence evaluated on absolute
# values (beta |s| + (1 - beta) G or G^2, with G = |g| + wd |p| the gradient's operands). Both
# sides evaluate the same float32 operations in the same order, but torch's vectorized CPU
# kernels fuse some of them (lerp, addcmul, add with alpha, addcdiv through fused multiply-adds)
# where lowbit rounds each product: each fused operation moves an intermediate by at most half
# an ulp of its operands; a state takes at most four roundings, so each side is within about
# 3 u of the exact state's magnitude (the L2 term's rounding enters G^2 twice), and the two within
# 6 u of each other (u = 2^-24); where the operands cancel
# (g against wd p, RMSprop's momentum buffer against its new term g / d, an update against the
# old value) the result's own ulp would be far too
# strict a ruler. The parameter takes its update, a chain of up to six such operations (the L2
# term, the state, its square root, + eps, the product with the step size, the quotient), each
# within an ulp of torch's, so the update within about eight ulps of itself, and the parameter
# within that (where the update is as large as the parameter) plus its own rounding. Adam's
# bias corrections enter lowbit's step folded into lr and eps (one rounding each, on the host)
# in place of torch's division of sqrt(v) by sqrt(1 - b2^t): one operation traded for another.
PARAM_ULPS = 8
STATE_UNITS = 6


def _ulp_of(x):
    x = x.detach().float().abs()
    return torch.where(x > 0, torch.nextafter(x, torch.tensor(float("inf"))) - x,
                       torch.tensor(2.0 ** -149))


def _judge(ours, torchs, old, cancel=None):
    step = (torchs - old).abs()
    if cancel is not None:
        step = step * cancel
    scale = torch.maximum(torch.maximum(old.abs(), torchs.abs()), step)
    return float(((ours - torchs).abs() / _ulp_of(scale)).max())


def _magnitude(name, kw, old, p, g, step, olds):
    p, g, old = p.double().abs(), g.double().abs(), old.double().abs()
    big = g + kw.get("weight_decay", 0.0) * p if name != "adamw" else g
    b1, b2 = kw.get("betas", (0.9, 0.999))
    alpha = kw.get("alpha", 0.99)
    if name == "exp_avg":
        return b1 * old + (1 - b1) * big
    if name == "exp_avg_sq":
        return b2 * old + (1 - b2) * big * big
    if name == "max_exp_avg_sq":  # max(old, v): an exact operation on v's magnitude
        return torch.maximum(old, _magnitude("exp_avg_sq", kw, olds["exp_avg_sq"], p, g, step,
                                             olds))
    if name == "momentum_buffer" and "square_avg" in olds:
        # RMSprop's: mom buf + G / d, d = sqrt(v) + eps with the new square average v, or
        # centered sqrt(v - s^2) + eps with the new average s (in float64 from the old states
        # and the signed gradient g + wd p).
        v = _magnitude("square_avg", kw, olds["square_avg"], p, g, step, olds)
        if kw.get("centered", False):
            alpha = kw.get("alpha", 0.99)
            gs = olds["_signed_grad"]
            v = alpha * olds["square_avg"].double() + (1 - alpha) * gs * gs
            avg = alpha * olds["grad_avg"].double() + (1 - alpha) * gs
            v = (v - avg * avg).clamp_min(0.0)
        return kw["momentum"] * old + big / (v.sqrt() + kw.get("eps", 1e-8))
    if name == "momentum_buffer":
        return big if step == 1 else kw["momentum"] * old + (1 - kw.get("dampening", 0.0)) * big
    if name == "square_avg":
        return alpha * old + (1 - alpha) * big * big
    if name == "grad_avg":
        return alpha * old + (1 - alpha) * big
    return old + big * big  # adagrad's sum


@pytest.mark.parametrize("case", range(len(CASES)))
def test_32bit_variants_stay_within_a_few_ulps_of_torch_per_step(case):
    lcls, tcls, kw, names = CASES[case]
    g = torch.Generator().manual_seed(case)
    p0 = torch.randn(3000, generator=g)
    pl = torch.nn.Parameter(p0.clone())
    pt = torch.nn.Parameter(p0.clone())
    ol, ot = lcls([pl], **kw), tcls([pt], foreach=False, **kw)
    worst_p = worst_s = 0.0
    for step in range(1, 21):
        grad = torch.randn(3000, generator=g) * 0.1
        pl.grad, pt.grad = grad.clone(), grad.clone()
        old = pt.detach().clone()
        olds = {n: ot.state[pt][n].clone() if n in ot.state[pt] else
                torch.full_like(old, kw.get("initial_accumulator_value", 0.0)) for n in names}
        # The gradient the states see, signed (RMSprop's centered variance needs it).
        sign = -1.0 if kw.get("maximize", False) else 1.0
        l2 = kw.get("weight_decay", 0.0) if lcls is not lo.AdamW else 0.0
        olds["_signed_grad"] = sign * grad.double() + l2 * old.double()
        ol.step()
        ot.step()
        wkw = dict(kw) if lcls is not lo.AdamW else dict(kw, weight_decay=0.0)
        # The L2 term g + wd p may cancel: the update then carries the error of its operands.
        wd = wkw.get("weight_decay", 0.0)
        g1 = (grad.double() + wd * old.double()).abs()
        cancel = ((grad.double().abs() + wd * old.double().abs()) / g1.clamp_min(1e-300)).float()
        if lcls is lo.RMSprop and "momentum_buffer" in names:
            # The step is lr buf, and buf = mom buf + g / d may cancel too: it carries the error
            # of its operands' magnitude.
            mag = _magnitude("momentum_buffer", wkw, olds["momentum_buffer"], old, grad, step,
                             olds)
            buf = ot.state[pt]["momentum_buffer"].double().abs()
            cancel = cancel * (mag / buf.clamp_min(1e-300)).float()
        worst_p = max(worst_p, _judge(pl.detach(), pt.detach(), old, cancel))
        for n in names:
            mag = _magnitude(n, wkw, olds[n], old, grad, step, olds)
            d = (ol.state[pl][n].double() - ot.state[pt][n].double()).abs()
            worst_s = max(worst_s, float((d / (mag * 2.0 ** -24 + 2.0 ** -149)).max()))
        # Both continue from torch's values: every step is judged on its own.
        with torch.no_grad():
            pl.copy_(pt)
        for n in names:
            ol.state[pl][n].copy_(ot.state[pt][n])
    assert worst_p <= PARAM_ULPS, (lcls.__name__, kw, worst_p)
    assert worst_s <= STATE_UNITS, (lcls.__name__, kw, worst_s)


# ---- LAMB and LARS (no torch.optim counterpart) against a float64 evaluation, step by step -----

def _lamb64(p, g, m, v, step, lr, b1, b2, eps, wd, max_tr, bias_correction=True, adapt=True):
    p, g, m, v = p.double(), g.double(), m.double(), v.double()
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    c1 = 1 - b1 ** step if bias_correction else 1.0
    c2 = 1 - b2 ** step if bias_correction else 1.0
    a = (m / c1) / ((v / c2).sqrt() + eps)
    u = a + wd * p
    pn, un = float(p.norm()), float(u.norm())
    r = min(pn / un, max_tr) if adapt and pn > 0 and un > 0 else 1.0
    # The step's size: its operands' magnitudes (u's two terms may cancel).
    return p - lr * r * u, m, v, lr * r * (a.abs() + wd * p.abs())


def _lars64(p, g, buf, step, lr, mom, damp, wd, tc, eps, nesterov, max_tr):
    p, g = p.double(), g.double()
    pn, gn = float(p.norm()), float(g.norm())
    r = min(tc * pn / (gn + wd * pn + eps), max_tr) if pn > 0 and gn > 0 else 1.0
    d = (g + wd * p) * r
    size = (g.abs() + wd * p.abs()) * r  # the operands' magnitudes: the terms may cancel
    if mom != 0:
        buf0 = buf.double()
        buf = d if step == 1 else mom * buf0 + (1 - damp) * d
        size = size + buf.abs() + buf0.abs()
        d = d + mom * buf if nesterov else buf
    return p - lr * d, buf, lr * size


TRUST_CASES = [
    (lo.LAMB, dict(lr=1e-2, weight_decay=0.01)),
    (lo.LAMB, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.0, max_trust_ratio=0.5,
                   bias_correction=False)),
    (lo.LARS, dict(lr=0.5, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.02)),
    (lo.LARS, dict(lr=1.0, momentum=0.9, nesterov=True, weight_decay=0.01, max_trust_ratio=1e-3)),
    (lo.LARS, dict(lr=0.1, momentum=0.0, trust_coefficient=0.5, dampening=0.0)),
]


@pytest.mark.parametrize("case", range(len(TRUST_CASES)))
def test_lamb_and_lars_32bit_follow_their_float64_equations_per_tensor(case):
    """Two tensors of different scales in one group (each its own trust ratio), ten steps, each
    judged from lowbit's own state: the parameter within 1e-5 of |p| plus the step's size (a few
    float32 roundings per element, and the float32 sums of the norms, relative 2^-24 times their
    tree depth of at most 16), the states within 1e-5 of their magnitudes."""
    cls, kw = TRUST_CASES[case]
    g = torch.Generator().manual_seed(40 + case)
    ps = [torch.nn.Parameter(torch.randn(3000, generator=g) * 3.0),
          torch.nn.Parameter(torch.randn(40, 25, generator=g) * 0.01)]
    opt = cls(ps, bits=32, **kw)
    hp = opt.param_groups[0]
    max_tr = float("inf") if hp["max_trust_ratio"] is None else hp["max_trust_ratio"]
    for step in range(1, 11):
        for k, p in enumerate(ps):
            p.grad = torch.randn(p.shape, generator=g) * (0.1 if k == 0 else 10.0)
        before = [(p.detach().clone(), p.grad.clone(),
                   {n: v.clone() for n, v in opt.state[p].items()
                    if isinstance(v, torch.Tensor)}) for p in ps]
        opt.step()
        for p, (p0, g0, st) in zip(ps, before):
            if cls is lo.LAMB:
                zero = torch.zeros_like(p0)
                want, m, v, size = _lamb64(
                    p0, g0, st.get("exp_avg", zero), st.get("exp_avg_sq", zero), step, hp["lr"],
                    hp["betas"][0], hp["betas"][1], hp["eps"], hp["weight_decay"], max_tr,
                    hp["bias_correction"])
                states = {"exp_avg": (m, hp["betas"][0] * st.get("exp_avg", zero).abs() +
                                      (1 - hp["betas"][0]) * g0.abs()),
                          "exp_avg_sq": (v, v)}
            else:
                buf0 = st.get("momentum_buffer", torch.zeros_like(p0))
                want, buf, size = _lars64(p0, g0, buf0, step, hp["lr"], hp["momentum"],
                                          hp["dampening"], hp["weight_decay"],
                                          hp["trust_coefficient"], hp["eps"], hp["nesterov"],
                                          max_tr)
                # The buffer's operands' magnitudes: the step's size without lr.
                states = {"momentum_buffer": (buf, size / hp["lr"])} if \
                    hp["momentum"] != 0 else {}
            err = (p.detach().double() - want).abs()
            assert bool((err <= 1e-5 * (p0.double().abs() + size) + 1e-30).all()), \
                (cls.__name__, kw, step, float(err.max()))
            for name, (ref, mag) in states.items():
                d = (opt.state[p][name].double() - ref.double()).abs()
                assert bool((d <= 1e-5 * mag.double().abs() + 1e-30).all()), (name, step)


def test_lamb_trust_ratio_sets_each_tensors_step_to_lr_times_its_norm():
    """The point of LAMB: each tensor moves by lr ||p|| whatever the gradient's scale (1 where a
    norm is 0, the clamp where it bites); always_adapt=False with weight_decay 0 is the plain
    step lr u."""
    g = torch.Generator().manual_seed(3)
    a = torch.nn.Parameter(torch.randn(1000, generator=g) * 5.0)
    b = torch.nn.Parameter(torch.randn(1000, generator=g) * 0.01)
    z = torch.nn.Parameter(torch.zeros(100))
    opt = lo.LAMB([a, b, z], lr=0.01, weight_decay=0.0)
    olds = [t.detach().clone() for t in (a, b, z)]
    for t, scale in zip((a, b, z), (1e-4, 1e3, 1.0)):
        t.grad = torch.randn(t.shape, generator=g) * scale
    opt.step()
    for t, old in zip((a, b), olds):
        ratio = float((t.detach() - old).norm() / old.norm())
        assert abs(ratio - 0.01) < 1e-5, ratio
    # ||p|| = 0: ratio 1, the first step of Adam with bias correction: |u| ~ 1 per element.
    assert float((z.detach() - olds[2]).abs().max()) == pytest.approx(0.01, rel=1e-3)
    # The clamp (||p|| / ||u|| is about 5 here) and no adaptation: steps lr 0.1 u and lr u (the
    # parameters' float32 rounding, an ulp of 5 against steps of 1e-3, moves the norm by < 1e-3).
    zero = torch.zeros_like(olds[0])
    for extra, max_tr, adapt in [(dict(max_trust_ratio=0.1), 0.1, True),
                                 (dict(always_adapt=False), float("inf"), False)]:
        c = torch.nn.Parameter(olds[0].clone())
        opt = lo.LAMB([c], lr=0.01, weight_decay=0.0, **extra)
        c.grad = a.grad.clone()
        opt.step()
        want = _lamb64(olds[0], a.grad, zero, zero, 1, 0.01, 0.9, 0.999, 1e-6, 0.0, max_tr,
                       adapt=adapt)[0]
        moved, want_moved = (c.detach() - olds[0]).norm(), (want - olds[0].double()).norm()
        assert float(moved / want_moved) == pytest.approx(1.0, abs=1e-3), extra


def test_lamb_and_lars_reject_bad_hyper_parameters():
    p = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match="max_trust_ratio"):
        lo.LAMB(p, max_trust_ratio=0.0)
    with pytest.raises(ValueError, match="max_trust_ratio"):
        lo.LARS8bit(p, max_trust_ratio=-1.0)
    with pytest.raises(ValueError, match="trust_coefficient"):
        lo.LARS(p, trust_coefficient=0.0)
    with pytest.raises(ValueError, match="beta"):
        lo.LAMB(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="Nesterov"):
        lo.LARS(p, momentum=0.0, nesterov=True)
    opt = lo.LAMB(p)
    opt.param_groups[0]["max_trust_ratio"] = 0.0  # per-group values are checked at the step
    p[0].grad = torch.ones(3)
    with pytest.raises(ValueError, match="max_trust_ratio"):
        opt.step()


def test_lr_schedulers_and_param_groups_follow_torch():
    g = torch.Generator().manual_seed(5)
    a0, b0 = torch.randn(500, generator=g), torch.randn(70, generator=g)
    pa, pb = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
    qa, qb = torch.nn.Parameter(a0.clone()), torch.nn.Parameter(b0.clone())
    groups = lambda x, y: [dict(params=[x], lr=1e-2), dict(params=[y], lr=1e-3,  # noqa: E731
                                                             weight_decay=0.5)]
    ol = lo.AdamW(groups(pa, pb))
    ot = torch.optim.AdamW(groups(qa, qb), foreach=False)
    sl = torch.optim.lr_scheduler.StepLR(ol, step_size=3, gamma=0.5)
    st = torch.optim.lr_scheduler.StepLR(ot, step_size=3, gamma=0.5)
    for _ in range(10):
        ga, gb = torch.randn(500, generator=g), torch.randn(70, generator=g)
        pa.grad, pb.grad, qa.grad, qb.grad = ga.clone(), gb.clone(), ga.clone(), gb.clone()
        ol.step()
        ot.step()
        sl.step()
        st.step()
    assert ol.param_groups[0]["lr"] == ot.param_groups[0]["lr"]
    for x, y in [(pa, qa), (pb, qb)]:
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)


def test_closure_zero_grad_and_parameters_without_gradients():
    p = torch.nn.Parameter(torch.ones(10))
    q = torch.nn.Parameter(torch.ones(10))  # never gets a gradient
    opt = lo.AdamW8bit([p, q], lr=0.1)
    calls = []

    def closure():
        opt.zero_grad()
        loss = (p * 2).sum()
        loss.backward()
        calls.append(1)
        return loss

    loss = opt.step(closure)
    assert calls == [1] and float(loss.detach()) == 20.0
    assert torch.all(p < 1) and torch.all(q == 1)
    assert len(opt.state[q]) == 0
    opt.zero_grad()
    assert p.grad is None


def test_a_parameter_given_new_data_at_the_same_address_is_stepped_as_its_new_dtype():
    # The per-parameter plan is cached; p.data replaced by a tensor at the same address with the
    # same element count but another dtype must not be stepped with the old dtype's kernel.
    torch.manual_seed(3)
    p = torch.nn.Parameter(torch.randn(64))
    opt = lo.AdamW([p], lr=0.1)
    p.grad = torch.randn(64)
    opt.step()
    half = p.data.view(torch.bfloat16)[:64]  # the first half of p's storage, as bfloat16
    assert half.data_ptr() == p.data_ptr()
    half.copy_(torch.linspace(-1, 1, 64))
    p.data = half
    g = torch.randn(64, dtype=torch.bfloat16)
    p.grad = g.clone()
    ref = torch.nn.Parameter(half.clone())
    ref_opt = lo.AdamW([ref], lr=0.1)
    ref_opt.load_state_dict(opt.state_dict())
    ref.grad = g.clone()
    opt.step()
    ref_opt.step()
    assert p.dtype == torch.bfloat16
    assert torch.equal(p.detach().view(torch.int16), ref.detach().view(torch.int16))


# ---- 8-bit against 32-bit: a small MLP on synthetic data ----------------------------------------

def _mlp(seed):
    # The middle weight ([64, 256]: rows of whole 256-element blocks) gets 8-bit states, the
    # others ([256, 32], [1, 64], the biases) 32-bit ones (docs/distributed.md's rule).
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 1))


def _train(model, opt, steps=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 1, generator=g)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g)
        y = torch.tanh(x @ teacher) + 0.01 * torch.randn(64, 1, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return float(np.mean(losses[-20:])), losses[0]


TRAJECTORIES = [
    (lo.AdamW, dict(lr=1e-3)),
    (lo.Adam, dict(lr=1e-3)),
    (lo.StableAdamW, dict(lr=1e-3)),
    (lo.SGD, dict(lr=0.05, momentum=0.9)),
    (lo.Lion, dict(lr=3e-4, weight_decay=0.1)),
    (lo.RMSprop, dict(lr=1e-3)),
    (lo.RMSprop, dict(lr=1e-3, momentum=0.9)),
    (lo.RMSprop, dict(lr=1e-3, centered=True)),
    (lo.RMSprop, dict(lr=1e-3, momentum=0.9, centered=True)),
    (lo.Adam, dict(lr=1e-3, amsgrad=True)),
    (lo.AdamW, dict(lr=1e-3, amsgrad=True)),
    (lo.Adagrad, dict(lr=0.05)),
    (lo.LAMB, dict(lr=1e-2)),
    (lo.LARS, dict(lr=1.0, trust_coefficient=0.01)),
]

# The mean loss of the last 20 of 300 steps with 8-bit states, against the same run with 32-bit
# states: within 25 % of it plus 0.005 (the quantized states add noise of a few per cent of each
# block's largest state to every step; on this task that moves the final loss by well under
# this, and a broken 8-bit path, e.g. states not requantized or read from the wrong map, moves it
# by far more or does not descend at all). Both must have descended to a fifth of the first loss.
@pytest.mark.parametrize("cls,kw", TRAJECTORIES, ids=[c.__name__ for c, _ in TRAJECTORIES])
def test_8bit_trajectory_follows_32bit(cls, kw):
    m32, m8 = _mlp(1), _mlp(1)
    l32, first = _train(m32, cls(m32.parameters(), bits=32, **kw))
    opt8 = cls(m8.parameters(), bits=8, **kw)
    l8, _ = _train(m8, opt8)
    assert any(s[k].dtype == torch.uint8 for s in opt8.state.values() for k in s
               if isinstance(s[k], torch.Tensor))
    assert l32 < 0.2 * first and l8 < 0.2 * first, (l32, l8, first)
    assert abs(l8 - l32) <= 0.25 * l32 + 0.005, (l32, l8)
    assert opt8.skipped_blocks == 0


# ---- state_dict ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cls,kw", [
    (lo.AdamW8bit, {}), (lo.StableAdamW8bit, {}), (lo.SGD8bit, dict(momentum=0.9)),
    (lo.Lion8bit, {}), (lo.AdamW8bit, dict(stochastic_rounding=True, seed=3)),
    (lo.AdamW, {}), (lo.Adagrad8bit, dict(initial_accumulator_value=0.1)),
    (lo.AdamW8bit, dict(percentile_clipping=5)), (lo.Lion, dict(percentile_clipping=50)),
    (lo.LAMB8bit, {}), (lo.LAMB8bit, dict(max_trust_ratio=2.0, bias_correction=False)),
    (lo.LARS8bit, dict(trust_coefficient=0.02)), (lo.LARS, dict(nesterov=True)),
    (lo.RMSprop8bit, dict(momentum=0.9)), (lo.RMSprop8bit, dict(centered=True)),
    (lo.RMSprop8bit, dict(momentum=0.9, centered=True)),
    (lo.RMSprop8bit, dict(momentum=0.9, centered=True, stochastic_rounding=True, seed=5)),
    (lo.AdamW8bit, dict(amsgrad=True)), (lo.Adam, dict(amsgrad=True)),
    (lo.Adam8bit, dict(amsgrad=True, stochastic_rounding=True, seed=4)),
])
def test_state_dict_round_trip_is_bit_identical_to_not_stopping(cls, kw):
    kw = dict(kw, lr=1e-3, min_8bit_size=256)
    ref = _mlp(2)
    opt_ref = cls(ref.parameters(), **kw)
    _train(ref, opt_ref, steps=10, seed=1)
    model = copy.deepcopy(ref)
    buf = io.BytesIO()
    torch.save({"model": ref.state_dict(), "opt": opt_ref.state_dict()}, buf)
    _train(ref, opt_ref, steps=10, seed=2)
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    model = _mlp(3)
    model.load_state_dict(saved["model"])
    opt = cls(model.parameters(), **kw)
    opt.load_state_dict(saved["opt"])
    _train(model, opt, steps=10, seed=2)
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)
    for pa, pb in zip(ref.parameters(), model.parameters()):
        sa, sb = opt_ref.state[pa], opt.state[pb]
        assert sa.keys() == sb.keys()
        for k in sa:
            if isinstance(sa[k], torch.Tensor):
                # Bitwise (the gradient norm history holds NaN in its empty slots).
                assert sa[k].dtype == sb[k].dtype and torch.equal(
                    sa[k].contiguous().view(torch.uint8), sb[k].contiguous().view(torch.uint8)), k
            else:
                assert sa[k] == sb[k], k


def test_loading_torch_adamw_state_quantizes_it():
    ref = _mlp(4)
    topt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    _train(ref, topt, steps=5)
    model = copy.deepcopy(ref)
    opt = lo.AdamW8bit(model.parameters(), lr=1e-3)
    opt.load_state_dict(topt.state_dict())
    for p, q in zip(model.parameters(), ref.parameters()):
        st, tst = opt.state[p], topt.state[q]
        assert st["step"] == 5
        for name in ["exp_avg", "exp_avg_sq"]:
            if p.numel() >= 4096 and p.dim() == 2 and p.shape[1] % 256 == 0:
                assert st[name].dtype == torch.uint8
                back = opt.state_float(p, name)
                # Nearest entry of the dynamic map: within half the largest gap (about 0.06 of
                # the block's absmax, between the two largest entries) of each value.
                absmax = st[name + "_absmax"].reshape(-1).repeat_interleave(256).reshape(p.shape)
                assert torch.all((back - tst[name]).abs() <= 0.07 * absmax)
            else:
                assert st[name].dtype == torch.float32
                assert torch.equal(st[name], tst[name])
    _, _ = _train(model, opt, steps=5)  # and the step runs on them


@pytest.mark.parametrize("tcls,lcls", [(torch.optim.Adam, lo.Adam), (torch.optim.AdamW, lo.AdamW)])
def test_loading_torch_amsgrad_state_takes_max_exp_avg_sq(tcls, lcls):
    """torch's Adam/AdamW(amsgrad=True) state: max_exp_avg_sq kept as it is in 32 bits (and the
    group's amsgrad with it, as torch's load_state_dict takes the saved group's settings, also
    into an optimizer made without amsgrad), quantized with the unsigned map in 8 bits; the
    continued run follows torch's."""
    ref = _mlp(7)
    topt = tcls(ref.parameters(), lr=1e-3, betas=(0.9, 0.9), amsgrad=True, foreach=False)
    _train(ref, topt, steps=8)
    saved = copy.deepcopy(topt.state_dict())
    model, model8 = copy.deepcopy(ref), copy.deepcopy(ref)
    opt = lcls(model.parameters(), lr=1e-3, betas=(0.9, 0.9))  # amsgrad from the state_dict
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["amsgrad"] is True
    opt8 = lcls(model8.parameters(), lr=1e-3, betas=(0.9, 0.9), amsgrad=True, bits=8)
    opt8.load_state_dict(saved)
    eight = below = 0
    for p, p8, q in zip(model.parameters(), model8.parameters(), ref.parameters()):
        tst = topt.state[q]
        assert torch.equal(opt.state[p]["max_exp_avg_sq"], tst["max_exp_avg_sq"])
        below += int((tst["exp_avg_sq"] < tst["max_exp_avg_sq"]).sum())
        st8 = opt8.state[p8]
        if st8["max_exp_avg_sq"].dtype == torch.uint8:
            eight += 1
            back = opt8.state_float(p8, "max_exp_avg_sq")
            absmax = st8["max_exp_avg_sq_absmax"].reshape(-1).repeat_interleave(256)
            assert torch.all((back - tst["max_exp_avg_sq"]).abs() <= 0.07 * absmax.reshape(p.shape))
            assert bool((back >= 0).all())  # the unsigned map
    assert eight > 0
    # After steps with beta2 = 0.9, v lies below its running maximum in places: the state matters.
    assert below > 1000
    losses = []
    for m, o in [(ref, topt), (model, opt)]:
        g = torch.Generator().manual_seed(11)
        for _ in range(5):
            x = torch.randn(64, 32, generator=g)
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
        losses.append([p.detach().clone() for p in m.parameters()])
    for a, b in zip(*losses):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
    _train(model8, opt8, steps=5)  # and the 8-bit step runs on them


# ---- non-finite gradients -----------------------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("bits", [8, 32])
@pytest.mark.parametrize("cls,kw", [(lo.AdamW, {}), (lo.Adam, dict(amsgrad=True)),
                                    (lo.RMSprop, dict(momentum=0.9, centered=True))],
                         ids=["AdamW", "Adam-amsgrad", "RMSprop-centered-momentum"])
def test_non_finite_gradient_leaves_its_block_untouched_and_is_counted(bad, bits, cls, kw):
    g = torch.Generator().manual_seed(9)
    p = torch.nn.Parameter(torch.randn(20, 256, generator=g))  # rows of one block: 8-bit
    opt = cls([p], lr=1e-2, bits=bits, **kw)
    p.grad = torch.randn(20, 256, generator=g)
    opt.step()  # states now nonzero
    names = [n for n, _ in opt._group_states(opt.param_groups[0])]
    assert len(names) == (2 if cls is lo.AdamW else 3)
    assert all(opt.state[p][n].dtype == (torch.uint8 if bits == 8 else torch.float32)
               for n in names)
    before = p.detach().flatten().clone()
    states = {k: v.clone() for k, v in opt.state[p].items() if isinstance(v, torch.Tensor)}
    grad = torch.randn(20, 256, generator=g)
    grad.view(-1)[300] = bad  # block 1 (elements 256..511)
    p.grad = grad
    opt.step()
    assert opt.skipped_blocks == 1
    assert torch.equal(p.detach().flatten()[256:512], before[256:512])
    assert not torch.equal(p.detach().flatten()[:256], before[:256])
    assert torch.isfinite(p).all()
    for k, v in states.items():
        now = opt.state[p][k]
        if k.endswith("_absmax"):
            assert torch.equal(now[1], v[1])
            assert torch.isfinite(now).all()
        else:
            assert torch.equal(now.flatten()[256:512], v.flatten()[256:512])
    assert opt.state_dict()["lowbit"]["skipped_blocks"] == 1


# ---- what keeps 32-bit states -------------------------------------------------------------------

def test_min_8bit_size_override_and_stable_embedding_keep_32bit_states():
    emb = StableEmbedding(1000, 16)
    big = torch.nn.Linear(256, 128)
    small = torch.nn.Linear(8, 8)
    forced = torch.nn.Linear(256, 128)
    rows = torch.nn.Linear(128, 256)  # rows of 128 elements, not whole blocks: 32-bit
    lo.override(forced.weight, bits=32)
    params = [*emb.parameters(), *big.parameters(), *small.parameters(), *forced.parameters(),
              *rows.parameters()]
    opt = lo.AdamW8bit(params)
    x = torch.randint(0, 1000, (4, 7))
    loss = emb(x).sum() + big(torch.randn(3, 256)).sum() + small(torch.randn(3, 8)).sum() + \
        forced(torch.randn(3, 256)).sum() + rows(torch.randn(3, 128)).sum()
    loss.backward()
    opt.step()
    assert opt.state[emb.weight]["exp_avg"].dtype == torch.float32  # 16000 elements, overridden
    assert opt.state[big.weight]["exp_avg"].dtype == torch.uint8
    assert opt.state[big.weight]["exp_avg_absmax"].shape == (128, 1)  # [rows, blocks per row]
    assert opt.state[rows.weight]["exp_avg"].dtype == torch.float32
    assert opt.state[small.weight]["exp_avg"].dtype == torch.float32
    assert opt.state[forced.weight]["exp_avg"].dtype == torch.float32
    with pytest.raises(ValueError, match="bits"):
        lo.override(big.weight, bits=4)


def test_stable_embedding_is_a_drop_in_embedding():
    torch.manual_seed(0)
    emb = StableEmbedding(50, 8, padding_idx=0)
    assert torch.equal(emb.weight[0], torch.zeros(8))
    bound = (6.0 / (50 + 8)) ** 0.5  # xavier_uniform_
    assert emb.weight.abs().max() <= bound
    out = emb(torch.tensor([[1, 2, 0]]))
    assert out.shape == (1, 3, 8)
    # LayerNorm over the embedding: zero mean, unit variance per row (the padding row is zeros).
    assert torch.allclose(out[0, :2].mean(-1), torch.zeros(2), atol=1e-5)
    assert set(emb.state_dict()) == {"weight", "norm.weight", "norm.bias"}


def test_half_precision_parameters_and_argument_errors():
    for dt in (torch.bfloat16, torch.float16):
        p = torch.nn.Parameter(torch.randn(20, 256).to(dt))
        opt = lo.AdamW8bit([p], lr=1e-2)
        p.grad = torch.randn(20, 256).to(dt)
        before = p.detach().clone()
        opt.step()
        assert p.dtype == dt and not torch.equal(p, before)
        assert opt.state[p]["exp_avg_absmax"].dtype == torch.float32
    with pytest.raises(ValueError, match="bits"):
        lo.AdamW([torch.nn.Parameter(torch.ones(3))], bits=4)
    with pytest.raises(ValueError, match="block_size"):
        lo.AdamW([torch.nn.Parameter(torch.ones(3))], block_size=512)
    with pytest.raises(ValueError, match="beta"):
        lo.AdamW([torch.nn.Parameter(torch.ones(3))], betas=(1.0, 0.9))
    # amsgrad is Adam's and AdamW's: the other optimizers do not take it, and the kernel refuses
    # it where a param group sets it for one of them.
    with pytest.raises(TypeError, match="amsgrad"):
        lo.StableAdamW([torch.nn.Parameter(torch.ones(3))], amsgrad=True)
    with pytest.raises(TypeError, match="amsgrad"):
        lo.LAMB([torch.nn.Parameter(torch.ones(3))], amsgrad=True)
    q = torch.nn.Parameter(torch.ones(3))
    q.grad = torch.ones(3)
    opt = lo.StableAdamW([q])
    opt.param_groups[0]["amsgrad"] = True
    with pytest.raises(ValueError, match="amsgrad applies to adam and adamw only"):
        opt.step()
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    p.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="float64"):
        lo.AdamW([p]).step()


def test_non_contiguous_parameters_are_updated():
    base = torch.randn(64, 64)
    p = torch.nn.Parameter(base.t())  # a transposed view, not contiguous
    q = torch.nn.Parameter(base.t().contiguous())
    grad = torch.randn(64, 64)
    p.grad, q.grad = grad.clone(), grad.clone()
    lo.AdamW([p], bits=32).step()
    lo.AdamW([q], bits=32).step()
    assert torch.equal(p.detach(), q.detach())


# ---- percentile gradient clipping --------------------------------------------------------------

def _percentile_reference(norms, q):
    """The clip value after the last of `norms` (float64, NaN for a non-finite norm): the
    nearest-rank q-th percentile of the finite ones among the last 100."""
    window = [x for x in norms[-100:] if np.isfinite(x)]
    if not window:
        return np.nan
    return sorted(window)[max(0, -(-q * len(window) // 100) - 1)]


_CLIP_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", _CLIP_DEVICES)
@pytest.mark.parametrize("q", [5, 50, 90])
def test_percentile_clipping_scales_each_gradient_to_the_percentile_of_its_history(q, device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("gpu: no CUDA device")
    # SGD with lr 1 from a zero parameter makes the parameter minus the gradient actually used.
    rng = np.random.default_rng(q)
    a = torch.nn.Parameter(torch.zeros(700, device=device))
    b = torch.nn.Parameter(torch.zeros(3, 50, device=device))
    opt = lo.SGD([a, b], lr=1.0, percentile_clipping=q)
    dirs = [rng.standard_normal(p.shape) for p in (a, b)]
    dirs = [d / np.linalg.norm(d) for d in dirs]
    # Distinct norms (neighbours apart by about 1 %), spikes, one NaN gradient: a wrong rank,
    # window or a history shared by the two tensors moves the clip value by more than the bound.
    seqs = [rng.permutation(np.geomspace(0.5, 50.0, 240)),
            rng.permutation(np.geomspace(1.0, 5.0, 240))]
    seqs[0][[17, 130]] = [1e4, 3e3]
    seqs[1][150] = np.nan
    hist = [[], []]
    for t in range(240):
        for k, p in enumerate((a, b)):
            with torch.no_grad():
                p.zero_()
            g = dirs[k] * (seqs[k][t] if np.isfinite(seqs[k][t]) else 1.0)
            if not np.isfinite(seqs[k][t]):
                g = g.copy()
                g.flat[3] = np.nan
            p.grad = torch.tensor(g, dtype=torch.float32, device=device)
            hist[k].append(float(np.linalg.norm(g)))
        opt.step()
        for k, p in enumerate((a, b)):
            used = -p.detach().double().cpu().numpy()
            norm = hist[k][-1]
            if not np.isfinite(norm):
                assert np.all(used == 0.0), "a non-finite gradient's block must be skipped"
                continue
            clip = _percentile_reference(hist[k], q)
            want = dirs[k] * min(norm, clip)
            # The float32 norm (a sum of at most 700 squares: relative error below 700 * 2^-24),
            # the scale's quotient and the product (an ulp each) against the float64 truth.
            err = np.abs(used - want).max() / np.abs(want).max()
            assert err < 1e-4, (t, k, norm, clip, err)
    assert opt.state[a]["gnorm_history"].shape == (100,)
    assert int(torch.isnan(opt.state[b]["gnorm_history"]).sum()) == 1


def test_percentile_clipping_leaves_p_grad_alone_and_rejects_bad_values():
    p = torch.nn.Parameter(torch.zeros(10))
    opt = lo.AdamW8bit([p], percentile_clipping=1)
    for scale in (1.0, 100.0):
        p.grad = torch.full((10,), scale)
        before = p.grad.clone()
        opt.step()
        assert torch.equal(p.grad, before)
    for bad in (0, 101, 5.0, True):
        with pytest.raises(ValueError, match="percentile_clipping"):
            lo.Lion([p], percentile_clipping=bad)
    opt = lo.SGD([p], lr=0.1)
    opt.param_groups[0]["percentile_clipping"] = 0
    with pytest.raises(ValueError, match="percentile_clipping"):
        opt.step()


# ---- CUDA: the kernel equals the CPU twin -------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("cls,kw", [(lo.AdamW8bit, {}), (lo.StableAdamW8bit, {}),
                                    (lo.SGD8bit, dict(momentum=0.9)), (lo.Lion8bit, {}),
                                    (lo.AdamW, {}), (lo.LAMB8bit, {}), (lo.LAMB, {}),
                                    (lo.LARS8bit, {}), (lo.RMSprop8bit, dict(momentum=0.9)),
                                    (lo.RMSprop8bit, dict(centered=True)),
                                    (lo.RMSprop8bit, dict(momentum=0.9, centered=True)),
                                    (lo.RMSprop, dict(momentum=0.9, centered=True)),
                                    (lo.Adam8bit, dict(amsgrad=True)),
                                    (lo.AdamW8bit, dict(amsgrad=True, stochastic_rounding=True)),
                                    (lo.AdamW, dict(amsgrad=True))])
def test_cuda_step_equals_cpu_step_bitwise(cls, kw):
    cpu = _mlp(5)
    gpu = copy.deepcopy(cpu).cuda()
    oc, og = cls(cpu.parameters(), lr=1e-3, **kw), cls(gpu.parameters(), lr=1e-3, **kw)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(64, 32, generator=g)
        for model, opt, dev in [(cpu, oc, "cpu"), (gpu, og, "cuda")]:
            opt.zero_grad()
            model(x.to(dev)).pow(2).mean().backward()
        # The same gradients on both (the matmuls of the two devices differ).
        for a, b in zip(cpu.parameters(), gpu.parameters()):
            b.grad.copy_(a.grad)
        oc.step()
        og.step()
        for a, b in zip(cpu.parameters(), gpu.parameters()):
            assert torch.equal(a.detach(), b.detach().cpu())
        for a, b in zip(cpu.parameters(), gpu.parameters()):
            for k, v in oc.state[a].items():
                if isinstance(v, torch.Tensor):
                    assert torch.equal(v, og.state[b][k].cpu()), k
        # Continue from identical parameters so that the next gradients match too.
        with torch.no_grad():
            for a, b in zip(cpu.parameters(), gpu.parameters()):
                a.copy_(b.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("cls,kw", [(lo.AdamW8bit, dict(percentile_clipping=5)),
                                    (lo.StableAdamW8bit, {}), (lo.LAMB8bit, {}), (lo.LARS, {}),
                                    (lo.AdamW, dict(amsgrad=True))])
def test_cuda_steps_do_not_synchronize_the_host(cls, kw):
    """After the first step (which allocates the states), a step on CUDA parameters queues its
    work without waiting for the device: percentile clipping's norms and history, the
    pre-passes' per-tensor sums and the skip counts stay on the device."""
    model = _mlp(5).cuda()
    opt = cls(model.parameters(), lr=1e-3, **kw)
    x = torch.randn(64, 32, device="cuda")

    def step():
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")


# ---- the general entry and GradScaler -----------------------------------------------------------

def test_dlpack_entry_equals_the_torch_layer():
    """lowbit._core.optimizer_step (DLPack tensors and numpy arrays) computes what the optimizer
    classes compute through raw pointers."""
    import lowbit._core as core

    g = torch.Generator().manual_seed(12)
    p = torch.nn.Parameter(torch.randn(20, 256, generator=g))
    grad = torch.randn(20, 256, generator=g).reshape(-1)
    p.grad = grad.clone().reshape(20, 256)
    opt = lo.AdamW8bit([p], lr=1e-2, weight_decay=0.1)
    pn = p.detach().numpy().reshape(-1).copy()
    opt.step()
    from lowbit.optim._base import _codebook

    m = np.full(5120, _codebook(True)[1], np.uint8)
    v = np.full(5120, _codebook(False)[1], np.uint8)
    am, av = np.zeros(20, np.float32), np.zeros(20, np.float32)
    skipped = np.zeros(1, np.int64)
    core.optimizer_step("adamw", [(pn, grad.numpy(), m, v, am, av)], 1e-2, 0.9, 0.999, 1e-8,
                        0.1, 0.0, 0.0, False, 0.0, False, 1, skipped, 256,
                        "nearest_toward_zero", 0, 0, 0, 0)
    assert np.array_equal(pn, p.detach().numpy().reshape(-1))
    assert np.array_equal(m, opt.state[p]["exp_avg"].numpy().reshape(-1))
    assert np.array_equal(av, opt.state[p]["exp_avg_sq_absmax"].numpy().reshape(-1))
    with pytest.raises(TypeError, match=r"tensors\[0\]\.grad"):
        core.optimizer_step("adamw", [(pn, grad.numpy().astype(np.float16), m, v, am, av)],
                            1e-2, 0.9, 0.999, 1e-8, 0.1, 0.0, 0.0, False, 0.0, False, 1, None,
                            256, "nearest_toward_zero", 0, 0, 0, 0)
    # Three states: the tuple takes (state3, absmax3) after the other six.
    p3 = torch.nn.Parameter(torch.randn(20, 256, generator=g))
    p3.grad = grad.clone().reshape(20, 256)
    opt3 = lo.AdamW8bit([p3], lr=1e-2, weight_decay=0.1, amsgrad=True)
    pn3 = p3.detach().numpy().reshape(-1).copy()
    opt3.step()
    m3, v3, x3 = (np.full(5120, _codebook(s)[1], np.uint8) for s in (True, False, False))
    a3 = [np.zeros(20, np.float32) for _ in range(3)]
    core.optimizer_step("adamw", [(pn3, grad.numpy(), m3, v3, a3[0], a3[1], x3, a3[2])], 1e-2,
                        0.9, 0.999, 1e-8, 0.1, 0.0, 0.0, False, 0.0, False, 1, None, 256,
                        "nearest_toward_zero", 0, 0, 0, 0, amsgrad=True)
    assert np.array_equal(pn3, p3.detach().numpy().reshape(-1))
    assert np.array_equal(x3, opt3.state[p3]["max_exp_avg_sq"].numpy().reshape(-1))
    assert np.array_equal(a3[2], opt3.state[p3]["max_exp_avg_sq_absmax"].numpy().reshape(-1))
    with pytest.raises(ValueError, match=r"tensors\[0\]\.state3"):  # amsgrad without state3
        core.optimizer_step("adamw", [(pn3, grad.numpy(), m3, v3, a3[0], a3[1])], 1e-2, 0.9,
                            0.999, 1e-8, 0.1, 0.0, 0.0, False, 0.0, False, 1, None, 256,
                            "nearest_toward_zero", 0, 0, 0, 0, amsgrad=True)
    with pytest.raises(ValueError, match="absmax2"):  # neither 6 nor 8 entries
        core.optimizer_step("adamw", [(pn3, grad.numpy(), m3, v3, a3[0], a3[1], x3)], 1e-2,
                            0.9, 0.999, 1e-8, 0.1, 0.0, 0.0, False, 0.0, False, 1, None, 256,
                            "nearest_toward_zero", 0, 0, 0, 0, amsgrad=True)
    with pytest.raises(ValueError, match="optimizer 'adamax'"):
        core.optimizer_step("adamax", [], 1e-2, 0.9, 0.999, 1e-8, 0.1, 0.0, 0.0, False, 0.0,
                            False, 1, None, 256, "nearest_toward_zero", 0, 0, 0, 0)


def test_grad_scaler_skips_steps_with_inf_and_steps_otherwise():
    model = _mlp(6)
    opt = lo.AdamW8bit(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    x = torch.randn(8, 32)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    scaler.scale((model(x) * float("inf")).sum()).backward()
    scaler.step(opt)  # inf gradients: GradScaler skips the step
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    scaler.scale(model(x).pow(2).mean()).backward()
    scaler.step(opt)
    scaler.update()
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert opt.skipped_blocks == 0
