"""lowbit.nn's fp8 training recipes and Float8Linear: each matmul of the layer equals the scaled
matmul of lowbit.quantize's (or quantize_mx's, or cast_scaled's) codes bit for bit, computed
here through lowbit's numpy API; delayed scaling's multiplier q = fp8_max / max(history) and
its amax history (the rows X, W, G) recomputed here from torch's amax; the state_dict round
trip; convert(); torch.compile(fullgraph=True) and opcheck of the new ops; the recipes' checks;
DDP (gloo: one process against the plain step; two processes with different data, whose
histories agree with the amax all-reduce and differ without it); CUDA against CPU (marker
gpu)."""

from __future__ import annotations

import numpy as np
import pytest

import lowbit

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed")

import lowbit.nn as lnn  # noqa: E402  (imports torch)
from lowbit import _torch_ops as ops  # noqa: E402

pytestmark = pytest.mark.torch

F32 = np.float32
FP8_MAX = {"e4m3fn": 448.0, "e5m2": 57344.0}
FP8_RECIPES = ["fp8_tensorwise", "fp8_tensorwise_delayed", "fp8_rowwise", "fp8_blockwise_1x128",
               "mxfp8", "hopper_emulated"]


def layer_and_input(recipe, fin=300, fout=130, tokens=40, seed=0, device="cpu"):
    torch.manual_seed(seed)
    layer = lnn.Float8Linear(fin, fout, recipe=recipe, device=device)
    with torch.no_grad():
        layer.bias.normal_(0, 1)
    x = (torch.randn(tokens, fin) * torch.exp(torch.randn(tokens, 1))).to(device)
    return layer, x


def np_(t):
    return t.detach().cpu().contiguous().numpy()


def quantize_np(t, op, q=None):
    """The codes and scales of a 2-d float32 array as the matmul reads it (K last), through
    lowbit's numpy API: the rule of each granularity, independent of lowbit.nn."""
    g = op.granularity
    if g == "rows":
        return lowbit.quantize(t, op.fmt, "rows")
    if g == "blocks":
        return lowbit.quantize(t, op.fmt, ("blocks", op.block))
    if g == "tiles":
        return lowbit.quantize(t, op.fmt, ("tiles", op.block, op.block))
    if g == "mx":
        return lowbit.quantize_mx(t, op.fmt, block=op.block)
    if q is not None:
        q = np.asarray(q, F32)
        return lowbit.cast_scaled(t, q, op.fmt), (F32(1) / q).reshape(())
    return lowbit.quantize(t, op.fmt, "tensor")


def quantize_t_np(t, op, q=None):
    """The operand t^T: per column of t is per row of t^T; a tensor scale is the same."""
    if op.granularity == "columns":
        return lowbit.quantize(np.ascontiguousarray(t.T), op.fmt, "rows")
    return quantize_np(np.ascontiguousarray(t.T), op, q)


def mm_np(a, a_op, b, b_op, bias, accumulation):
    blk = {"blocks": lambda o: (1, o.block), "mx": lambda o: (1, o.block),
           "tiles": lambda o: (o.block, o.block)}
    return lowbit.scaled_matmul(
        a[0], b[0], a_fmt=a_op.fmt, b_fmt=b_op.fmt, a_scales=a[1], b_scales=b[1], bias=bias,
        accumulation=accumulation,
        a_block=blk[a_op.granularity](a_op) if a_op.granularity in blk else None,
        b_block=blk[b_op.granularity](b_op) if b_op.granularity in blk else None)


def delayed_q(history_row, fmt, most_recent=False):
    """fp8_max / the largest (or newest) finite positive entry, 1 without one, at most
    float32's largest value."""
    row = np.asarray(history_row, F32)
    usable = row[np.isfinite(row) & (row > 0)]
    if usable.size == 0:
        return F32(1)
    amax = usable[0] if most_recent else F32(usable.max())
    with np.errstate(over="ignore"):
        return min(F32(FP8_MAX[fmt]) / amax, np.finfo(F32).max)


@pytest.mark.parametrize("name", FP8_RECIPES)
def test_every_matmul_is_the_scaled_matmul_of_quantize_codes(name):
    layer, x = layer_and_input(name)
    r = layer.recipe
    xi = x.clone().requires_grad_(True)
    gy = torch.randn(x.shape[0], layer.out_features)
    steps = 3 if r.delayed("X") else 1
    for step in range(steps):
        hist = None if layer.amax_history is None else np_(layer.amax_history).copy()
        xi.grad = None
        layer.zero_grad()
        y = layer(xi)
        y.backward(gy)
        xn, wn, gn, bn = np_(xi), np_(layer.weight), np_(gy), np_(layer.bias)
        qx = qw = qg = None
        if hist is not None:
            qx = delayed_q(hist[0], "e4m3fn")
            qw = delayed_q(hist[1], "e4m3fn")
            qg = delayed_q(hist[2], "e5m2")
            # This step's amaxes entered the histories, newest first.
            h = np_(layer.amax_history)
            assert np.array_equal(h[:, 0], [np.abs(xn).max(), np.abs(wn).max(),
                                            np.abs(gn).max()])
            assert np.array_equal(h[:, 1:], hist[:, :-1])
        acc = r.accumulation
        f, gi, gw = r.forward, r.grad_input, r.grad_weight
        want_y = mm_np(quantize_np(xn, f.a, qx), f.a, quantize_np(wn, f.b, qw), f.b, bn, acc)
        assert np.array_equal(np_(y), want_y), (name, step, "y")
        want_dx = mm_np(quantize_np(gn, gi.a, qg), gi.a, quantize_t_np(wn, gi.b, qw), gi.b, None,
                        acc)
        assert np.array_equal(np_(xi.grad), want_dx), (name, step, "dx")
        want_dw = mm_np(quantize_t_np(gn, gw.a, qg), gw.a, quantize_t_np(xn, gw.b, qx), gw.b, None,
                        acc)
        assert np.array_equal(np_(layer.weight.grad), want_dw), (name, step, "dw")
        assert torch.equal(layer.bias.grad, gy.sum(0))


def test_the_hopper_model_is_the_sum_and_differs_from_fp32():
    layer, x = layer_and_input("fp8_tensorwise_delayed", fin=256, tokens=8, seed=3)
    hop = lnn.Float8Linear(256, 130, recipe=lnn.hopper_recipe(
        lowbit.Accumulation.block_fixed_point(32, 4)))
    hop.load_state_dict(layer.state_dict())
    assert hop.recipe.accumulation == lowbit.Accumulation.block_fixed_point(32, 4)
    assert not torch.equal(layer(x), hop(x))  # a 4-bit alignment loses most products' bits


def test_delayed_scaling_first_step_uses_scale_one_then_the_history():
    layer, x = layer_and_input("fp8_tensorwise_delayed", tokens=4)
    assert torch.equal(layer.amax_history, torch.zeros(3, 16))
    layer(x).sum().backward()
    h1 = layer.amax_history.clone()
    assert h1[0, 0] == x.abs().max() and h1[1, 0] == layer.weight.abs().max()
    assert (h1[:, 1:] == 0).all()
    r = lnn.fp8_recipe("tensorwise", "delayed", amax_history=2, amax_reduce="most_recent")
    small = lnn.Float8Linear(300, 130, recipe=r)
    assert small.amax_history.shape == (3, 2)
    for _ in range(3):
        small(x).sum().backward()
    assert small.amax_history[0, 0] == small.amax_history[0, 1] == x.abs().max()


@pytest.mark.parametrize("reduce", ["max", "most_recent"])
def test_delayed_scales_pass_over_zero_nan_inf_and_tiny_amaxes(reduce):
    """A history holding zeros, NaN, Inf (recorded from such tensors) and amaxes so small that
    fp8_max / amax overflows: the scale comes from the finite positive entries, capped at
    float32's largest value, and the layer keeps working on the next steps."""
    r = lnn.fp8_recipe("tensorwise", "delayed", amax_history=5, amax_reduce=reduce)
    nan, inf = float("nan"), float("inf")
    for row in ([nan, inf, 0.0, 3.0, 7.0], [0.0, nan, 1e-38, 0.0, 0.0], [inf, nan, 0.0, 0.0, 0.0],
                [0.0, 0.0, 0.0, 0.0, 0.0], [2.0, nan, 9.0, inf, 0.0]):
        layer, x = layer_and_input(r, tokens=6)
        with torch.no_grad():
            layer.amax_history[0] = torch.tensor(row)
            layer.amax_history[1] = torch.tensor(row[::-1])
        f = layer.recipe.forward
        qx = delayed_q(row, "e4m3fn", reduce == "most_recent")
        qw = delayed_q(row[::-1], "e4m3fn", reduce == "most_recent")
        y = layer(x)
        want = mm_np(quantize_np(np_(x), f.a, qx), f.a, quantize_np(np_(layer.weight), f.b, qw),
                     f.b, np_(layer.bias), None)
        assert np.array_equal(np_(y), want), row
    # Such tensors run: NaN gives NaN rows, Inf saturates (and both are recorded as they are),
    # and a tiny or empty tensor records an amax the later steps pass over.
    layer, x = layer_and_input(r, tokens=6)
    x[1, 3], x[4, 0] = nan, inf
    y = layer(x)
    assert torch.isnan(y[1]).all() and torch.isfinite(y[4]).all()
    assert torch.isnan(layer.amax_history[0, 0])
    for t in (x[:0], torch.full_like(x, 1e-38), torch.randn_like(x)):
        out = layer(t)
        out.sum().backward()
        assert out.shape == t.shape[:1] + (130,) and torch.isfinite(out).all()


def test_the_history_stays_float32_under_to_dtype():
    layer, x = layer_and_input("fp8_tensorwise_delayed", tokens=6)
    layer(x).sum().backward()
    before = layer.amax_history.clone()
    layer.to(torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16
    assert layer.amax_history.dtype == torch.float32 and torch.equal(layer.amax_history, before)
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    layer.half()
    assert layer.amax_history.dtype == torch.float32


def test_eval_mode_reads_the_history_and_leaves_it():
    layer, x = layer_and_input("fp8_tensorwise_delayed", tokens=6)
    layer(x).sum().backward()
    before = layer.amax_history.clone()
    y_train_next = lnn.Float8Linear(300, 130)
    y_train_next.load_state_dict(layer.state_dict())
    layer.eval()
    with torch.no_grad():
        y = layer(x * 5)
    assert torch.equal(layer.amax_history, before)
    assert torch.equal(y, y_train_next(x * 5))  # the same scales as a training step would use


def test_state_dict_round_trip_resumes_the_scales():
    layer, x = layer_and_input("fp8_tensorwise_delayed", tokens=6)
    for _ in range(2):
        layer(x * 3).sum().backward()
    sd = layer.state_dict()
    assert set(sd) == {"weight", "bias", "amax_history"}
    fresh = lnn.Float8Linear(300, 130)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.amax_history, layer.amax_history)
    assert torch.equal(fresh(x), layer(x))
    cold = lnn.Float8Linear(300, 130)
    cold.load_state_dict({k: v for k, v in sd.items() if k != "amax_history"}, strict=False)
    assert not torch.equal(cold(x), fresh(x))  # the history decides the scales


def test_convert_with_an_fp8_recipe_and_a_filter():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    params = [id(p) for p in net.parameters()]
    lnn.convert(net, "hopper_emulated", filter=lambda name, m: name == "0")
    assert type(net[0]) is lnn.LowPrecisionLinear and type(net[2]) is torch.nn.Linear
    assert net[0].recipe.name == "hopper_emulated" and net[0].amax_history.shape == (3, 16)
    assert net[0].amax_history.device.type == "cpu"
    assert [id(p) for p in net.parameters()] == params
    net(torch.randn(5, 16)).sum().backward()
    assert net[0].amax_history[0, 0] > 0


def test_named_recipes_and_their_checks():
    names = lnn.named_recipes()
    for n in FP8_RECIPES:
        assert names[n].name == n
    assert names["hopper_emulated"].accumulation == lnn.HOPPER
    assert names["fp8_blockwise_1x128"].forward.b.block_shape == (128, 128)
    assert names["mxfp8"].grad_weight.a.block_shape == (1, 32)
    with pytest.raises(ValueError, match="delayed.*tensor-wise operands only"):
        lnn.Operand("e4m3fn", "rows", scaling="delayed")
    with pytest.raises(ValueError, match="tensorwise granularity only"):
        lnn.fp8_recipe("rowwise", "delayed")
    with pytest.raises(ValueError, match="K blocks differ"):
        lnn.LinearRecipe("x", forward=lnn.Matmul(lnn.Operand("e4m3fn", "blocks", 64),
                                                 lnn.Operand("e4m3fn", "tiles", 128)))
    with pytest.raises(ValueError, match="one delayed scale per tensor"):
        lnn.LinearRecipe("x", forward=lnn.Matmul(lnn.Operand("e4m3fn", scaling="delayed"),
                                                 lnn.Operand("e4m3fn")),
                         grad_weight=lnn.Matmul(lnn.Operand("e5m2"),
                                                lnn.Operand("e5m2", scaling="delayed")))
    with pytest.raises(ValueError, match="amax_history"):
        lnn.fp8_recipe(amax_history=0)
    with pytest.raises(ValueError, match="Float8Linear needs an fp8 recipe"):
        lnn.Float8Linear(4, 4, recipe="switchback_int8")
    r = lnn.fp8_recipe("rowwise").with_accumulation("bfp:k=16,f=12")
    assert r.accumulation == lowbit.Accumulation.block_fixed_point(16, 12)


def test_new_ops_pass_opcheck():
    x = torch.randn(5, 70)
    torch.library.opcheck(ops.quantize_blocks, (x, "e4m3fn", 1, 32))
    torch.library.opcheck(ops.quantize_blocks, (x, "e5m2", 4, 32))
    torch.library.opcheck(ops.quantize_mx, (x, "e4m3fn", 32))
    torch.library.opcheck(ops.quantize_scaled, (x, torch.tensor(3.0), "e4m3fn"))
    a, sa = ops.quantize_blocks(x, "e4m3fn", 1, 32)
    b, sb = ops.quantize_blocks(torch.randn(3, 70), "e4m3fn", 128, 32)
    torch.library.opcheck(ops.scaled_mm, (a, sa, "e4m3fn", b, sb, "e4m3fn", None, torch.float32,
                                          "automatic", "bfp:k=32,f=13", [1, 32], [128, 32]))
    got = ops.scaled_mm(a, sa, "e4m3fn", b, sb, "e4m3fn", None, torch.float32, "automatic",
                        "bfp:k=32,f=13", [1, 32], [128, 32])
    want = lowbit.scaled_matmul(np_(a), np_(b), a_fmt="e4m3fn", b_fmt="e4m3fn", a_scales=np_(sa),
                                b_scales=np_(sb), a_block=(1, 32), b_block=(128, 32),
                                accumulation=lowbit.Accumulation.block_fixed_point(32, 13))
    assert np.array_equal(np_(got), want)


@pytest.mark.parametrize("name", ["fp8_blockwise_1x128", "fp8_tensorwise_delayed", "mxfp8"])
def test_torch_compile_fullgraph_matches_eager_bitwise(name):
    torch.manual_seed(0)
    eager_model = torch.nn.Sequential(lnn.Float8Linear(64, 32, recipe=name), torch.nn.ReLU(),
                                      lnn.Float8Linear(32, 8, recipe=name))
    compiled_model = torch.nn.Sequential(lnn.Float8Linear(64, 32, recipe=name), torch.nn.ReLU(),
                                         lnn.Float8Linear(32, 8, recipe=name))
    compiled_model.load_state_dict(eager_model.state_dict())
    x, gy = torch.randn(12, 64), torch.randn(12, 8)

    def step(model, m):
        xi = x.clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        y = m(xi)
        y.backward(gy)
        return [y.detach(), xi.grad] + [p.grad.clone() for p in model.parameters()]

    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    for _ in range(2):  # the second step reads the histories the first one wrote
        a, b = step(eager_model, eager_model), step(compiled_model, compiled)
        for i, (u, v) in enumerate(zip(a, b)):
            assert torch.equal(u, v), i
        for (n, u), (_, v) in zip(eager_model.state_dict().items(),
                                  compiled_model.state_dict().items()):
            assert torch.equal(u, v), n


def ddp_model(seed, recipe):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return lnn.convert(net, recipe)


def ddp_step(net, x, y):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
    return loss.detach()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_one_process_ddp_with_delayed_scaling_and_amax_all_reduce(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    recipe = lnn.fp8_recipe("tensorwise", "delayed", reduce_amax=True)
    plain = ddp_model(0, recipe)
    loss_plain = ddp_step(plain, x, y)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(ddp_model(0, recipe))
        loss_ddp = ddp_step(wrapped, x, y)
        assert torch.equal(loss_ddp, loss_plain)
        for (name, a), (_, b) in zip(plain.state_dict().items(),
                                     wrapped.module.state_dict().items()):
            assert torch.equal(a, b), name
        assert wrapped.module[0].amax_history[0, 1] > 0
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["hopper_emulated", "fp8_blockwise_1x128", "mxfp8"])
def test_cuda_emulation_equals_the_cpu_bit_for_bit(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cpu, x = layer_and_input(name)
    gpu = lnn.Float8Linear(300, 130, recipe=cpu.recipe.with_backend("simt"), device="cuda")
    gpu.load_state_dict(cpu.state_dict())
    gy = torch.randn(x.shape[0], 130)
    for _ in range(2):
        outs = []
        for layer, dev in ((cpu, "cpu"), (gpu, "cuda")):
            xi = x.detach().to(dev).clone().requires_grad_(True)  # a leaf on each device
            layer.zero_grad()
            y = layer(xi)
            y.backward(gy.to(dev))
            outs.append([t.detach().cpu() for t in (y, xi.grad, layer.weight.grad)])
        for i, (a, b) in enumerate(zip(*outs)):
            assert torch.equal(a, b), i
    if cpu.amax_history is not None:
        assert torch.equal(cpu.amax_history, gpu.amax_history.cpu())


def _two_rank_worker(rank, store, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        out = {}
        for reduce_amax in (True, False):
            recipe = lnn.fp8_recipe("tensorwise", "delayed", reduce_amax=reduce_amax)
            net = torch.nn.parallel.DistributedDataParallel(ddp_model(0, recipe),
                                                            broadcast_buffers=False)
            g = torch.Generator().manual_seed(10 + rank)  # each rank its own data and amaxes
            x = torch.randn(16, 32, generator=g) * (1 + 3 * rank)
            y = torch.randn(16, 8, generator=g)
            torch.nn.functional.mse_loss(net(x), y).backward()
            out[reduce_amax] = (net.module[0].amax_history.clone(), x.abs().max())
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_rank_ddp_amax_all_reduce(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_two_rank_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
             join=True)
    r = [torch.load(tmp_path / f"rank{i}.pt") for i in range(2)]
    # reduce_amax: every rank holds the global (max) amaxes of X, W and G.
    (h0, a0), (h1, a1) = r[0][True], r[1][True]
    assert torch.equal(h0, h1) and h0[0, 0] == max(a0, a1)
    # Without it (and without DDP's buffer broadcast) each rank records its own.
    (h0, a0), (h1, a1) = r[0][False], r[1][False]
    assert h0[0, 0] == a0 and h1[0, 0] == a1 and not torch.equal(h0[0], h1[0])
