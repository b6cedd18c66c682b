"""lowbit.optim on bad input (marker torch, CPU tensors): a gradient of another size, settings out
of range, non-finite norms under clipping, refused or failing steps and loads that must leave the
optimizer as it was, checkpoints of other optimizers and other storage, copies of a
StableEmbedding. Each case came from a sweep that found it crashing, silently wrong or unclear."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import lowbit.optim as lo  # noqa: E402
from lowbit.nn.embedding import StableEmbedding  # noqa: E402

pytestmark = pytest.mark.torch


def test_a_gradient_of_another_shape_is_refused():
    # The kernel reads the parameter's size of the gradient: a stale gradient of a resized
    # parameter read past its end.
    p = torch.nn.Parameter(torch.zeros(10))
    p.grad = torch.ones(10)
    p.data = torch.zeros(4000)
    for opt in (lo.AdamW([p]), lo.AdamW8bit([p], min_8bit_size=0)):
        with pytest.raises(RuntimeError, match=r"a gradient of shape \(10,\) for a parameter of "
                                               r"shape \(4000,\)"):
            opt.step()
    q = torch.nn.Parameter(torch.zeros(4, 8))
    q.grad = torch.ones(4, 8)
    q.grad.data = torch.ones(8, 4)  # as many elements, another shape
    with pytest.raises(RuntimeError, match=r"a gradient of shape \(8, 4\)"):
        lo.SGD([q], lr=0.1).step()


def test_residual_join_refuses_bits_its_dtype_cannot_hold():
    w = torch.zeros(64, dtype=torch.bfloat16)
    for r, bits in ((torch.zeros(64, dtype=torch.int8), 16),
                    (torch.zeros(64, dtype=torch.int16), 8), (torch.zeros(64, dtype=torch.int8), 0)):
        with pytest.raises(ValueError, match=r"^residual_join: bits="):
            lo.residual_join(w, r, bits=bits)
    x = torch.randn(64)
    y = lo.residual_join(*lo.residual_split(x, bits=12), bits=12)  # 12 bits in an int16
    torch.testing.assert_close(y, x, rtol=2.0 ** -18, atol=0)


def test_percentile_clipping_leaves_a_non_finite_norm_unscaled():
    p = torch.nn.Parameter(torch.zeros(2, 256))
    opt = lo.SGD([p], lr=1.0, percentile_clipping=50)
    p.grad = torch.ones(2, 256)
    opt.step()
    g = torch.ones(2, 256)
    g[0, 0] = float("inf")
    p.grad = g
    opt.step()
    assert torch.equal(p[1], torch.full((256,), -2.0))  # the finite block stepped, unscaled
    assert torch.equal(p[0], torch.full((256,), -1.0))  # the Inf block was skipped
    assert int(opt.skipped_blocks) == 1
    big = torch.nn.Parameter(torch.zeros(4096))
    opt = lo.SGD([big], lr=1.0, percentile_clipping=50)
    big.grad = torch.ones(4096)
    opt.step()
    big.grad = torch.full((4096,), 1e20)  # finite, but its float32 norm overflows
    opt.step()
    assert torch.equal(big.detach(), torch.full((4096,), -1.0 - 1e20))


def test_fused_clipping_leaves_non_finite_norms_out():
    torch.manual_seed(0)
    for clip in ("per_parameter", "previous_global"):
        m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 1))
        opt = lo.SGD(m.parameters(), lr=0.1)
        h = lo.fuse_into_backward(m, opt, clip_grad_norm=1.0, clip=clip)
        m(torch.randn(8, 256)).sum().backward()
        first = h.previous_norm
        hook = m[0].weight.register_hook(
            lambda g: g.index_put((torch.tensor([0]), torch.tensor([0])),
                                  torch.tensor(float("inf"))))
        before = [p.detach().clone() for p in m.parameters()]
        m(torch.randn(8, 256)).sum().backward()
        hook.remove()
        moved = [not torch.equal(a, b) for a, b in zip(before, m.parameters())]
        assert all(moved), clip  # per parameter: the Inf block skipped, the others stepped
        if clip == "previous_global":
            assert torch.equal(h.previous_norm, first)  # the Inf backward's norm left out
        before = [p.detach().clone() for p in m.parameters()]
        m(torch.randn(8, 256)).sum().backward()
        assert all(not torch.equal(a, b) for a, b in zip(before, m.parameters())), clip
        h.remove()
    with pytest.raises(ValueError, match="loss_scale=inf; expected a finite value > 0"):
        lo.fuse_into_backward(m, opt, loss_scale=float("inf"))


def test_torch_sgd_momentum_state_continues_as_torch():
    p = torch.nn.Parameter(torch.zeros(4))
    t = torch.optim.SGD([p], lr=1.0, momentum=0.9)
    p.grad = torch.ones(4)
    t.step()
    q = torch.nn.Parameter(p.detach().clone())
    o = lo.SGD([q], lr=1.0, momentum=0.9)
    o.load_state_dict(t.state_dict())
    p.grad = torch.ones(4)
    q.grad = torch.ones(4)
    t.step()
    o.step()
    assert torch.equal(p, q)  # -2.9: the loaded buffer was used, not replaced


def test_a_refused_step_counts_nothing():
    p = torch.nn.Parameter(torch.zeros(4))
    o = lo.Adam([p], lr=1.0)
    p.grad = torch.ones(4)
    o.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="lr = nan must be finite"):
        o.step()
    o.param_groups[0]["lr"] = 1.0
    o.step()
    assert o.state[p]["step"] == 1 and torch.equal(p.detach(), torch.full((4,), -1.0))
    o.param_groups[0]["lr"] = -1e-9
    with pytest.raises(ValueError, match=r"lr = -1e-09 must be finite and >= 0"):
        o.step()


def test_a_refused_load_leaves_the_optimizer_as_it_was():
    torch.manual_seed(1)
    p = torch.nn.Parameter(torch.randn(4))
    o = lo.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones(4)
    o.step()
    adam = torch.optim.Adam([torch.nn.Parameter(torch.randn(4))])
    adam.param_groups[0]["params"][0].grad = torch.ones(4)
    adam.step()
    bad = [adam.state_dict()]
    wrong = copy.deepcopy(o.state_dict())
    wrong["state"][0]["momentum_buffer"] = torch.zeros(7)
    bad.append(wrong)
    ints = copy.deepcopy(o.state_dict())
    ints["state"][0]["momentum_buffer"] = torch.zeros(4, dtype=torch.int32)
    bad.append(ints)
    msgs = ["parameter 0: its state has no 'momentum_buffer'",
            r"parameter 0: state 'momentum_buffer' has shape \(7,\), the parameter \(4,\)",
            "parameter 0: state 'momentum_buffer' has dtype torch.int32"]
    for sd, msg in zip(bad, msgs):
        before = copy.deepcopy(o.state_dict())
        with pytest.raises((KeyError, ValueError, TypeError), match=msg):
            o.load_state_dict(sd)
        after = o.state_dict()
        assert after["param_groups"] == before["param_groups"]
        assert torch.equal(after["state"][0]["momentum_buffer"],
                           before["state"][0]["momentum_buffer"])
        p.grad = torch.ones(4)
        o.step()  # still steps


def test_a_checkpoint_takes_this_optimizer_s_storage():
    torch.manual_seed(2)
    lin = torch.nn.Linear(256, 256)
    o8 = lo.AdamW8bit(lin.parameters(), min_8bit_size=0)
    lin(torch.randn(4, 256)).sum().backward()
    o8.step()
    assert o8.state[lin.weight]["exp_avg"].dtype == torch.uint8
    o32 = lo.AdamW(lin.parameters(), bits=32)
    o32.load_state_dict(o8.state_dict())
    assert o32.param_groups[0]["bits"] == 32
    st = o32.state[lin.weight]
    assert st["exp_avg"].dtype == torch.float32
    assert torch.equal(st["exp_avg"], o8.state_float(lin.weight, "exp_avg"))
    back = lo.AdamW8bit(lin.parameters(), min_8bit_size=0)
    back.load_state_dict(o32.state_dict())
    assert back.state[lin.weight]["exp_avg"].dtype == torch.uint8


@pytest.mark.parametrize("make,message", [
    (lambda p: lo.AdamW([p], block_size=256.0), r"block_size=256.0; expected 256 or 2048"),
    (lambda p: lo.AdamW([p], seed=-1), r"seed=-1; expected None or an int in \[0, 2\*\*64\)"),
    (lambda p: lo.AdamW([p], seed=2 ** 64), r"seed=18446744073709551616"),
    (lambda p: lo.Lion([p], weight_decay=-0.1), r"invalid weight_decay value: -0.1"),
    (lambda p: lo.RMSprop([p], eps=-1e-8), r"invalid epsilon value: -1e-08"),
    (lambda p: lo.Adagrad([p], eps=-1e-8), r"invalid epsilon value: -1e-08"),
    (lambda p: lo.AdamW([{"params": [p], "bits": 4}]), r"bits=4; expected 8 or 32"),
    (lambda p: lo.AdamW([{"params": [p], "min_8bit_size": -5}]),
     r"min_8bit_size=-5; expected an int >= 0"),
    (lambda p: lo.override(p, min_8bit_size="x"), r"min_8bit_size='x'; expected an int >= 0"),
])
def test_settings_out_of_range_are_refused_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make(torch.nn.Parameter(torch.zeros(4)))


def test_add_param_group_checks_its_settings():
    o = lo.AdamW([torch.nn.Parameter(torch.zeros(4))])
    with pytest.raises(ValueError, match="bits=4"):
        o.add_param_group({"params": [torch.nn.Parameter(torch.zeros(4))], "bits": 4})
    assert len(o.param_groups) == 1


def test_a_deep_copy_of_a_stable_embedding_keeps_32_bit_states():
    emb = copy.deepcopy(StableEmbedding(300, 256))
    o = lo.AdamW8bit(emb.parameters(), min_8bit_size=0)
    emb(torch.tensor([1, 2])).sum().backward()
    o.step()
    assert o.state[emb.weight]["exp_avg"].dtype == torch.float32


def test_a_parameter_made_16_bit_after_its_first_step_gets_a_residual():
    p = torch.nn.Parameter(torch.randn(64))
    o = lo.AdamW([p], lr=1e-3, master_weights="residual16")
    p.grad = torch.ones(64)
    o.step()
    assert "residual" not in o.state[p]  # float32: its own master
    p.data = p.data.bfloat16()
    p.grad = torch.ones(64, dtype=torch.bfloat16)
    start = p.detach().float()
    o.step()
    r = o.state[p]["residual"]
    assert r.dtype == torch.int16 and r.shape == p.shape
    assert not torch.equal(lo.residual_join(p.detach(), r), start)
