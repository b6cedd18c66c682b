"""lowbit.optim's states through torch.distributed.checkpoint (marker torch; docs/distributed.md):
saved by FSDP2 on N ranks (get_state_dict, dcp.save), loaded on M != N ranks and into one
process without FSDP2 (dcp.load, set_state_dict). The 8-bit codes and their absmax are DTensors
sharded on dim 0 like the parameter, whole rows' blocks on every mesh, so they are resharded
without requantization: the loaded states equal the saved ones bit for bit, and continuing on the
new mesh equals continuing on the old one (given the same gradients)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)
fsdp = pytest.importorskip("torch.distributed.fsdp")
if not hasattr(fsdp, "fully_shard"):
    pytest.skip("this torch has no FSDP2 (fully_shard)", allow_module_level=True)
pytest.importorskip("torch.distributed.checkpoint.state_dict")

import distributed_workers as dw  # noqa: E402

pytestmark = pytest.mark.torch

STEPS, MORE = 2, 2


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


@pytest.mark.parametrize("name,save_on,load_on", [("AdamW8bit", 4, 3)])
def test_checkpoint_saved_on_n_ranks_loads_on_m_ranks_and_in_one_process(tmp_path, name,
                                                                          save_on, load_on):
    path = str(tmp_path / "ckpt")
    saved = dw.spawn(dw.ckpt_save_worker, save_on, name, path, STEPS, MORE)[0]
    st = saved["saved"]["states"]
    assert st["0.weight"][next(k for k in st["0.weight"] if k != "step")].dtype == torch.uint8
    loaded = dw.spawn(dw.ckpt_load_worker, load_on, name, path, STEPS, MORE)
    single = dw.ckpt_load_single(name, path, STEPS, MORE)
    for what, run in [(f"{load_on} ranks", loaded[0]), ("one process", single)]:
        _same(run["loaded"], saved["saved"], what + ", loaded")
        _same(run["final"], saved["final"], what + ", continued")
        assert run["rng_offset"] == saved["rng_offset"], what
