"""lowbit.nn's layers under DistributedDataParallel (marker torch, the gloo backend on the CPU,
one process): the layer's state is its nn.Linear parameters, so DDP wraps, broadcasts and
all-reduces it like any module's, and a step gives the bits of the same step without DDP."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed")

import lowbit.nn as lnn  # noqa: E402

pytestmark = pytest.mark.torch


def model(seed: int):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    return lnn.convert(net, variant="switchback", fmt="int8")


def step(net, x, y):
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_one_process_ddp_step_equals_the_plain_step(tmp_path):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
    plain = model(0)
    loss_plain = step(plain, x, y)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        wrapped = torch.nn.parallel.DistributedDataParallel(model(0))
        loss_ddp = step(wrapped, x, y)
        assert torch.equal(loss_ddp, loss_plain)
        for (name, a), (_, b) in zip(plain.state_dict().items(),
                                     wrapped.module.state_dict().items()):
            assert torch.equal(a, b), name
        assert type(wrapped.module[0]) is lnn.LowPrecisionLinear
    finally:
        dist.destroy_process_group()
