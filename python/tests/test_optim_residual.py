"""Residual master weights and the step fused into the backward pass (lowbit.optim,
docs/techniques/residual.md), on CPU tensors (marker torch) and CUDA tensors (marker gpu):
split/join, bfloat16 + 16-bit residual AdamW bit-identical to a float32 master over 1000 steps
of a tiny model (and the weights the master rounded to nearest, ties away), the 8-bit residual's
drift, state_dict round trips, and fuse_into_backward equal to the ordinary step bit for bit,
with what it rules out (micro-batch accumulation, global clipping, closures, GradScaler) and the
way around each."""

from __future__ import annotations

import copy
import io

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import lowbit.optim as lo  # noqa: E402

pytestmark = pytest.mark.torch

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(name)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.detach().contiguous().view(torch.int32)


def _nearest_away_bf16(x: torch.Tensor) -> torch.Tensor:
    """bfloat16 nearest to float32 x, ties away from zero, by integer arithmetic on the bits
    (independent of the kernel's code path)."""
    u = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    sign, mag = u & 0x80000000, u & 0x7FFFFFFF
    hi = ((mag + 0x8000) >> 16) | (sign >> 16)
    return hi.to(torch.int32).to(torch.int16).view(torch.bfloat16)


def _tiny(seed: int, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                               torch.nn.Linear(16, 4)).to(device)


def _batch(g: torch.Generator, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(32, 8, generator=g)
    y = torch.randn(32, 4, generator=g)
    return x.to(device), y.to(device)


# ---- split and join --------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_with_16_bits_reconstructs_every_non_nan_float32(device):
    dev = _device(device)
    g = torch.Generator().manual_seed(1)
    u = torch.randint(-2**31, 2**31, (1 << 16,), generator=g, dtype=torch.int64)
    # ties, their neighbours, binade edges, subnormals, zeros, Inf, the overflow threshold
    special = torch.tensor([0, 0x8000, 0x7FFF, 0x8001, 0x3F808000, 0x3F818000, 0x3F7FFFFF,
                            0x3F7F8000, 0x00000001, 0x007FFFFF, 0x7F800000, 0x7F7F8000,
                            0x7F7FFFFF, 0x7F7F7FFF], dtype=torch.int64)
    u = torch.cat([u, special, special | 0x80000000])
    x = (u & 0xFFFFFFFF).to(torch.int64)
    x = torch.where(x >= 2**31, x - 2**32, x).to(torch.int32).view(torch.float32)
    x = torch.where(torch.isnan(x), torch.zeros_like(x), x).to(dev)
    w, r = lo.residual_split(x)
    assert w.dtype == torch.bfloat16 and r.dtype == torch.int16
    assert torch.equal(_bits(lo.residual_join(w, r)), _bits(x))
    assert torch.equal(w.view(torch.int16), _nearest_away_bf16(x.cpu()).view(torch.int16).to(dev))
    # away from ties the weight is torch's (ties-to-even) cast
    not_tie = (x.cpu().view(torch.int32) & 0xFFFF) != 0x8000
    assert torch.equal(w.cpu()[not_tie].view(torch.int16),
                       x.cpu()[not_tie].to(torch.bfloat16).view(torch.int16))
    nan = lo.residual_join(*lo.residual_split(torch.tensor([float("nan")], device=dev)))
    assert torch.isnan(nan).all()


@pytest.mark.parametrize("bits", [8, 12])
def test_fewer_bits_stay_within_the_documented_bound(bits):
    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(2))
    w, r = lo.residual_split(x, torch.bfloat16, bits)
    y = lo.residual_join(w, r, bits)
    q = 2 ** (16 - bits)
    steps = (_bits(y).to(torch.int64) - _bits(x).to(torch.int64)).abs()
    assert int(steps.max()) <= q - 1
    assert int(steps.max()) > 0  # the bound is not vacuous: some bits are lost


def test_float16_is_exact_in_its_range_and_inf_beyond():
    x = torch.tensor([1.0 + 2.0**-20, -3.14159, 65504.0, 2.0**-17 * 1.2345, 70000.0, -1e30])
    w, r = lo.residual_split(x, torch.float16, 16)
    y = lo.residual_join(w, r)
    assert torch.equal(_bits(y[:4]), _bits(x[:4]))
    assert torch.isinf(y[4:]).all() and torch.isinf(w[4:].float()).all()


def test_split_refuses_bad_arguments():
    with pytest.raises(ValueError, match="bits"):
        lo.residual_split(torch.zeros(3), torch.bfloat16, 17)
    with pytest.raises(TypeError, match="dtype"):
        lo.residual_split(torch.zeros(3), torch.float32)
    with pytest.raises(ValueError, match="master_weights"):
        lo.AdamW([torch.nn.Parameter(torch.zeros(3))], master_weights="residual32")


# ---- bfloat16 + 16-bit residual against a float32 master --------------------------------------

def _master_pair(device: torch.device, master: str, cls=lo.AdamW, **kw):
    """(float32 model, its AdamW), (bfloat16 model with residuals, its AdamW), same start."""
    ref = _tiny(0, device)
    mod = copy.deepcopy(ref)
    o_ref = cls(ref.parameters(), lr=1e-2, weight_decay=0.01, **kw)
    o_mod = cls(mod.parameters(), lr=1e-2, weight_decay=0.01, master_weights=master, **kw)
    o_mod.to_residual(torch.bfloat16)
    return ref, o_ref, mod, o_mod


def _same_gradient_steps(ref, o_ref, mod, o_mod, steps, device, check=None):
    """Gradients from the bfloat16 model's forward, fed to both (the float32 model gets them as
    float32), so that the masters see the same gradients."""
    g = torch.Generator().manual_seed(3)
    for step in range(steps):
        x, y = _batch(g, device)
        o_mod.zero_grad()
        torch.nn.functional.mse_loss(mod(x.to(torch.bfloat16)).float(), y).backward()
        for a, b in zip(ref.parameters(), mod.parameters()):
            a.grad = b.grad.float()
        o_ref.step()
        o_mod.step()
        if check is not None:
            check(step)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls,kw,steps", [(lo.AdamW, {}, 1000),
                                          (lo.AdamW8bit, dict(min_8bit_size=0), 300),
                                          (lo.AdamW, dict(amsgrad=True), 300)],
                         ids=["AdamW", "AdamW8bit", "AdamW-amsgrad"])
def test_bfloat16_residual16_adamw_equals_the_float32_master_for_1000_steps(device, cls, kw,
                                                                             steps):
    dev = _device(device)
    ref, o_ref, mod, o_mod = _master_pair(dev, "residual16", cls, **kw)

    def check(step):
        if step % 100 != 99:
            return
        for a, b in zip(ref.parameters(), mod.parameters()):
            assert torch.equal(_bits(o_mod.master_weight(b)), _bits(a)), step
            assert torch.equal(b.detach().view(torch.int16).cpu(),
                               _nearest_away_bf16(a.detach().cpu()).view(torch.int16)), step

    _same_gradient_steps(ref, o_ref, mod, o_mod, steps, dev, check)
    for a, b in zip(ref.parameters(), mod.parameters()):
        assert b.dtype == torch.bfloat16
        assert torch.equal(_bits(o_mod.master_weight(b)), _bits(a))
        for k, v in o_ref.state[a].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, o_mod.state[b][k]), k


def test_residual8_drift_from_the_float32_master_is_measured_and_within_its_bound():
    """Both runs see the same gradients, so their states and their updates' inputs agree; the
    stored value differs from the master by what the splits lost. Per step a split loses at most
    q - 1 = 255 float32 steps (docs/techniques/residual.md) and the update's two roundings (the
    decay product and the sum) differ by at most one float32 step each between the runs, and the
    decay factor (< 1) only shrinks an earlier difference: after N steps
    |join - master| <= N (255 + 2) 2^-23 max_t |x_t| (plus N 2^-149 for subnormal values)."""
    dev = torch.device("cpu")
    ref, o_ref, mod, o_mod = _master_pair(dev, "residual8")
    steps = 300
    peak = [p.detach().abs().clone() for p in ref.parameters()]

    def track(step):
        for k, (a, b) in enumerate(zip(ref.parameters(), mod.parameters())):
            peak[k] = torch.maximum(peak[k], torch.maximum(a.detach().abs(),
                                                           o_mod.master_weight(b).abs()))

    _same_gradient_steps(ref, o_ref, mod, o_mod, steps, dev, track)
    worst_rel = 0.0
    for k, (a, b) in enumerate(zip(ref.parameters(), mod.parameters())):
        drift = (o_mod.master_weight(b).double() - a.detach().double()).abs()
        bound = steps * (255 + 2) * 2.0**-23 * peak[k].double() + steps * 2.0**-149
        assert bool((drift <= bound).all()), float((drift - bound).max())
        worst_rel = max(worst_rel, float((drift / peak[k].double().clamp_min(1e-30)).max()))
    assert worst_rel > 0.0  # the 8-bit residual does lose bits
    print(f"residual8 drift after {steps} AdamW steps (lr 1e-2): max |join - master| / "
          f"max_t |x_t| = {worst_rel:.3g} (bound {steps * 257 * 2.0**-23:.3g})")


def test_state_dict_carries_the_residual_and_resumes_bit_for_bit():
    dev = torch.device("cpu")
    _, _, mod, opt = _master_pair(dev, "residual16")
    g = torch.Generator().manual_seed(5)

    def step(m, o):
        x, y = _batch(g, dev)
        o.zero_grad()
        torch.nn.functional.mse_loss(m(x.to(torch.bfloat16)).float(), y).backward()
        o.step()

    for _ in range(3):
        step(mod, opt)
    buf = io.BytesIO()
    torch.save({"model": mod.state_dict(), "opt": opt.state_dict()}, buf)
    assert "residual" in opt.state_dict()["state"][0]
    buf.seek(0)
    saved = torch.load(buf)
    other = copy.deepcopy(mod)
    other.load_state_dict(saved["model"])
    o2 = lo.AdamW(other.parameters(), lr=1e-2, weight_decay=0.01, master_weights="residual16")
    o2.load_state_dict(saved["opt"])
    state = g.get_state()
    step(mod, opt)
    g.set_state(state)
    step(other, o2)
    for a, b in zip(mod.parameters(), other.parameters()):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(opt.state[a]["residual"], o2.state[b]["residual"])


def test_float32_parameters_keep_no_residual_and_new_16_bit_ones_start_at_zero():
    p32 = torch.nn.Parameter(torch.randn(10))
    p16 = torch.nn.Parameter(torch.randn(10).to(torch.bfloat16))
    opt = lo.AdamW([p32, p16], master_weights="residual8")
    (p32.sum() + p16.float().sum()).backward()
    opt.step()
    assert "residual" not in opt.state[p32]
    assert opt.state[p16]["residual"].dtype == torch.int8


# ---- the step fused into the backward pass ----------------------------------------------------

def _fused_pair(device, cls=lo.AdamW, **kw):
    base = _tiny(1, device).to(torch.bfloat16)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    oa = cls(a.parameters(), lr=1e-2, master_weights="residual16", **kw)
    ob = cls(b.parameters(), lr=1e-2, master_weights="residual16", **kw)
    return a, oa, b, ob


def _loss(m, x, y):
    return torch.nn.functional.mse_loss(m(x.to(torch.bfloat16)).float(), y)


def _same_weights(a, oa, b, ob):
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.view(torch.int16), q.view(torch.int16))
        assert torch.equal(oa.state[p]["residual"], ob.state[q]["residual"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls,kw", [(lo.AdamW, {}), (lo.AdamW8bit, dict(min_8bit_size=0)),
                                    (lo.StableAdamW, {}), (lo.SGD, dict(momentum=0.9)),
                                    (lo.Adam8bit, dict(min_8bit_size=0, amsgrad=True)),
                                    (lo.RMSprop, dict(momentum=0.9, centered=True))],
                         ids=["AdamW", "AdamW8bit", "StableAdamW", "SGD", "Adam8bit-amsgrad",
                              "RMSprop-centered-momentum"])
def test_fused_step_equals_the_ordinary_step_bit_for_bit(device, cls, kw):
    dev = _device(device)
    a, oa, b, ob = _fused_pair(dev, cls, **kw)
    handle = lo.fuse_into_backward(b, ob)
    g = torch.Generator().manual_seed(7)
    for _ in range(20):
        x, y = _batch(g, dev)
        oa.zero_grad()
        _loss(a, x, y).backward()
        oa.step()
        _loss(b, x, y).backward()
        assert all(p.grad is None for p in b.parameters())  # freed at once
        ob.step()  # finds no gradients: does nothing
        _same_weights(a, oa, b, ob)
    handle.remove()
    _loss(b, *_batch(g, dev)).backward()
    assert all(p.grad is not None for p in b.parameters())  # hooks gone: ordinary backward


def test_micro_batch_accumulation_inside_paused_equals_the_ordinary_accumulation():
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    handle = lo.fuse_into_backward(b, ob)
    g = torch.Generator().manual_seed(8)
    for _ in range(5):
        batches = [_batch(g, dev) for _ in range(3)]
        oa.zero_grad()
        for x, y in batches:
            _loss(a, x, y).backward()
        oa.step()
        with handle.paused():
            for x, y in batches[:-1]:
                _loss(b, x, y).backward()
        _loss(b, *batches[-1]).backward()
        _same_weights(a, oa, b, ob)


def test_accumulation_without_paused_steps_every_micro_batch():
    # What the fusion rules out: each backward steps, so the accumulated step is not taken.
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    lo.fuse_into_backward(b, ob)
    g = torch.Generator().manual_seed(8)
    batches = [_batch(g, dev) for _ in range(2)]
    for x, y in batches:
        _loss(a, x, y).backward()
    oa.step()
    for x, y in batches:
        _loss(b, x, y).backward()
    assert any(int(ob.state[p]["step"]) == 2 for p in b.parameters())
    assert not all(torch.equal(p.view(torch.int16), q.view(torch.int16))
                   for p, q in zip(a.parameters(), b.parameters()))


def test_per_parameter_clipping_equals_clipping_each_gradient_before_the_step():
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    lo.fuse_into_backward(b, ob, clip_grad_norm=0.05)
    g = torch.Generator().manual_seed(9)
    for _ in range(5):
        x, y = _batch(g, dev)
        oa.zero_grad()
        _loss(a, x, y).backward()
        with torch.no_grad():
            for p in a.parameters():
                norm = torch.linalg.vector_norm(p.grad, dtype=torch.float32)
                p.grad.mul_(torch.clamp(0.05 / (norm + 1e-6), max=1.0).to(p.grad.dtype))
        oa.step()
        _loss(b, x, y).backward()
        _same_weights(a, oa, b, ob)


def test_previous_global_norm_clipping_uses_the_last_backwards_norm():
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    handle = lo.fuse_into_backward(b, ob, clip_grad_norm=0.05, clip="previous_global")
    g = torch.Generator().manual_seed(10)
    previous = None
    for _ in range(4):
        x, y = _batch(g, dev)
        oa.zero_grad()
        _loss(a, x, y).backward()
        with torch.no_grad():
            norms = [torch.linalg.vector_norm(p.grad, dtype=torch.float32)
                     for p in a.parameters()]
            total = None
            for n in norms:  # the optimizer's parameter order, as the handle sums
                total = n * n if total is None else total + n * n
            if previous is not None:
                scale = torch.clamp(0.05 / (previous + 1e-6), max=1.0)
                for p in a.parameters():
                    p.grad.mul_(scale.to(p.grad.dtype))
            previous = total.sqrt()
        oa.step()
        _loss(b, x, y).backward()
        assert handle.previous_norm is not None
        assert torch.equal(handle.previous_norm, previous)
        _same_weights(a, oa, b, ob)


def test_a_closure_runs_once_and_its_backward_steps():
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    lo.fuse_into_backward(b, ob)
    x, y = _batch(torch.Generator().manual_seed(11), dev)
    calls = []

    def closure_for(m, o):
        def closure():
            calls.append(1)
            o.zero_grad()
            loss = _loss(m, x, y)
            loss.backward()
            return loss
        return closure

    la = oa.step(closure_for(a, oa))
    lb = ob.step(closure_for(b, ob))
    assert torch.equal(la, lb) and len(calls) == 2
    _same_weights(a, oa, b, ob)


def test_grad_scaler_finds_no_gradients_and_a_fixed_loss_scale_replaces_it():
    dev = torch.device("cpu")
    a, oa, b, ob = _fused_pair(dev)
    handle = lo.fuse_into_backward(b, ob, loss_scale=1024.0)
    g = torch.Generator().manual_seed(12)
    for _ in range(5):
        x, y = _batch(g, dev)
        oa.zero_grad()
        _loss(a, x, y).backward()
        oa.step()
        (_loss(b, x, y) * 1024.0).backward()  # a power of two: the unscaled gradients exactly
        _same_weights(a, oa, b, ob)
    handle.remove()
    # GradScaler after a fused backward: nothing left for it to unscale or check.
    lo.fuse_into_backward(b, ob)
    try:
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    except (AttributeError, TypeError, RuntimeError) as e:  # torch without a CPU GradScaler
        pytest.skip(f"torch.amp.GradScaler('cpu'): {e}")
    x, y = _batch(g, dev)
    scaler.scale(_loss(b, x, y)).backward()
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.step(ob)


def test_fuse_refuses_bad_arguments():
    m = _tiny(0, torch.device("cpu"))
    with pytest.raises(TypeError):
        lo.fuse_into_backward(m, torch.optim.SGD(m.parameters(), lr=0.1))
    opt = lo.AdamW(m.parameters())
    with pytest.raises(ValueError, match="clip"):
        lo.fuse_into_backward(m, opt, clip="global")
    with pytest.raises(ValueError, match="loss_scale"):
        lo.fuse_into_backward(m, opt, loss_scale=0.0)
