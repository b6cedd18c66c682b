"""lowbit.optim under FSDP2 (torch.distributed.fsdp.fully_shard) on 2 and 4 CPU processes with
the gloo backend (marker torch; docs/distributed.md): parameters sharded on dim 0, each rank's
optimizer keeping the 8-bit codes and the absmax of its own rows.

Mesh invariance: whether a parameter gets 8-bit states, and its blocks, depend on the global
parameter only, and blocks are whole rows' blocks, so that given the same gradients every mesh
(one process without FSDP2, 2 or 4 ranks, shards uneven or empty) computes the same bits for the
element-wise optimizers. Trained through FSDP2's own reduce-scatter, the gradients are within the
bound of any order of summing the ranks' slices. StableAdamW (a per-tensor RMS), percentile
clipping (a per-tensor norm) and stochastic rounding (random bits by the element's index) are
refused on sharded parameters."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("this torch has no FSDP2 (fully_shard)", allow_module_level=True)

import distributed_workers as dw  # noqa: E402

pytestmark = pytest.mark.torch

STEPS = 3
NAMES = list(dw.OPTIMIZERS)


def _equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _same(a, b, what):
    for n in a["params"]:
        assert _equal(a["params"][n], b["params"][n]), (what, n)
        assert a["states"][n].keys() == b["states"][n].keys(), (what, n)
        for k, v in a["states"][n].items():
            if isinstance(v, torch.Tensor):
                assert _equal(v, b["states"][n][k]), (what, n, k)
            else:
                assert v == b["states"][n][k], (what, n, k)


@pytest.fixture(scope="module")
def plain():
    return {name: dw.plain_given_grads(name, STEPS) for name in NAMES}


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp2_steps_are_mesh_invariant_and_refuse_what_a_shard_cannot_do(world, plain):
    ranks = dw.spawn(dw.fsdp_worker, world, NAMES, STEPS)
    r0 = ranks[0]
    for name in NAMES:
        # The same bits as one process without FSDP2, on every rank.
        for r in ranks:
            _same(r[name], plain[name], name)
        st = plain[name]["states"]
        state = [k for k in st["0.weight"] if k != "step" and not k.endswith("_absmax")][0]
        assert st["0.weight"][state].dtype == torch.uint8, name
        assert st["4.weight"][state].dtype == torch.uint8, name
        assert st["4.weight"][state + "_absmax"].shape == (6, 2), name
        assert st["2.weight"][state].dtype == torch.float32, name  # rows of 24
        assert st["0.bias"][state].dtype == torch.float32, name  # 1-D
    # Each rank keeps the absmax of its own rows, in torch.chunk's pieces of ceil(rows / W).
    for rank, r in enumerate(ranks):
        for n, rows, blocks in [("0.weight", 24, 1), ("4.weight", 6, 2)]:
            chunk = -(-rows // world)
            mine = max(0, min(chunk, rows - rank * chunk))
            assert r["AdamW8bit"]["local_absmax"][n] == (mine, blocks), (rank, n)
    if world == 4:
        assert ranks[3]["AdamW8bit"]["local_absmax"]["4.weight"] == (0, 2)  # an empty shard
    # Training through FSDP2: its reduce-scatter's sum of the slices' gradients against the
    # rank-ordered mean of the same slices in one process: any order of summing W terms is within
    # (W - 1) u sum |g_r| of the exact sum, so the two within twice that (over W, the mean).
    ref = dw.ddp_reference(world, "AdamW8bit", 1)
    u = 2.0 ** -24
    for n, g in r0["train_grads"].items():
        mags = sum(pr[n].abs() for pr in ref["per_rank"]) / world
        bound = 2 * (world - 1) * u * mags + 2.0 ** -149
        assert torch.all((g - ref["mean"][n]).abs() <= bound), n
    for r in ranks[1:]:
        _same(r["train"], r0["train"], "train")
    start = dw.mlp(0).state_dict()
    assert any(not torch.equal(r0["train"]["params"][n], start[n]) for n in start)
    refusals = r0["refusals"]
    assert refusals["stable"] is not None and "whole parameter" in refusals["stable"]
    assert refusals["clip"] is not None and "percentile_clipping" in refusals["clip"]
    assert refusals["sr"] is not None and "stochastic_rounding" in refusals["sr"]
    assert refusals["dim1"] is not None and "dim 0 only" in refusals["dim1"]


def test_the_8bit_rule_depends_on_the_global_shape_only():
    from lowbit.optim._distributed import absmax_shape, blocks_align

    assert blocks_align((24, 256), 256) and blocks_align((3, 2, 128), 256)
    assert not blocks_align((24, 255), 256) and not blocks_align((4096,), 256)
    assert not blocks_align((8, 256), 2048) and blocks_align((8, 4096), 2048)
    assert absmax_shape((6, 512), 256) == (6, 2) and absmax_shape((0, 512), 256) == (0, 2)
