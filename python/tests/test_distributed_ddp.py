"""lowbit.nn layers and lowbit.optim optimizers in a model wrapped by DistributedDataParallel,
on 2 and 4 CPU processes with the gloo backend (marker torch; docs/distributed.md).

Each rank runs its slice of the same global batch. With a communication hook that sums the
ranks' gradients in rank order, the run equals, bit for bit, the single-process run that averages
the slices' gradients in that order: the layers compute each slice's gradient with the same bits
in and out of DDP, and the 8-bit optimizer's step depends on the gradient alone. With DDP's own
all-reduce (gloo sums in its own order) the averaged gradient is within the bound of any order of
summation, and every rank ends with the same parameters and states."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import distributed_workers as dw  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = 3


def _equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _same_snapshots(a, b):
    for n in a["params"]:
        assert _equal(a["params"][n], b["params"][n]), n
        for k, v in a["states"][n].items():
            if isinstance(v, torch.Tensor):
                assert _equal(v, b["states"][n][k]), (n, k)
            else:
                assert v == b["states"][n][k], (n, k)


# StableAdamW (a per-tensor RMS) is fine under DDP: every rank holds whole tensors.
@pytest.mark.parametrize("world,opt", [(2, "StableAdamW8bit"), (4, "AdamW8bit")])
def test_ddp_with_rank_ordered_mean_equals_the_single_process_run_bitwise(world, opt):
    ranks = dw.spawn(dw.ddp_worker, world, opt, STEPS, True)
    ref = dw.ddp_reference(world, opt, STEPS)
    assert ranks[0]["kinds"][0] == "LowPrecisionLinear"
    # 8-bit states where the rule gives them, 32-bit elsewhere.
    st = ref["states"]
    assert st["0.weight"]["exp_avg"].dtype == torch.uint8
    assert st["0.weight"]["exp_avg_absmax"].shape == (24, 1)
    assert st["2.weight"]["exp_avg"].dtype == torch.float32
    for r in ranks:
        _same_snapshots(r, ref)


def test_ddp_with_its_own_all_reduce_stays_within_the_summation_bound():
    world = 4
    ranks = dw.spawn(dw.ddp_worker, world, "Lion8bit", STEPS, False)
    ref = dw.ddp_reference(world, "Lion8bit", 1)
    # Every rank applies the same reduced gradient: identical parameters and states.
    for r in ranks[1:]:
        _same_snapshots(r, ranks[0])
    # The reduced gradient of the first step against the mean of the slices' gradients: any
    # order of summing W terms is within (W - 1) u sum |g_r| of the exact sum (u = 2^-24); the
    # division by W (a power of two) is exact; the mean itself as summed here is within the same
    # of the exact mean, so the two within twice that (over W, for the mean).
    u = 2.0 ** -24
    for n, g in ranks[0]["first_grads"].items():
        mags = sum(pr[n].abs() for pr in ref["per_rank"]) / world
        bound = 2 * (world - 1) * u * mags + 2.0 ** -149
        assert torch.all((g - ref["mean"][n]).abs() <= bound), n
