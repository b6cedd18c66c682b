"""The report's linear-layer section and the small-model training comparison it shares with
bench/train_tiny.py (marker torch): the numbers are what they claim to be, and a training run is
deterministic and trains."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from lowbit import _report_linear as rl  # noqa: E402
from lowbit import _tiny  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def measured():
    rng = np.random.default_rng(3)
    workloads = [("gaussian", rng.standard_normal(4096).astype(np.float32)),
                 ("outliers", np.where(rng.random(4096) < 0.01, 50.0, 1.0).astype(np.float32)
                  * rng.standard_normal(4096).astype(np.float32))]
    return workloads, rl.measure(workloads, threads=2, quick=True, training=False,
                                 progress=lambda message: None)


def test_every_layer_and_workload_has_a_row(measured):
    workloads, m = measured
    keys = [(r["workload"], r["layer"]) for r in m["rows"]]
    assert keys == [(w, label) for w, _ in workloads for label, _ in rl.LAYERS]
    assert m["train"] == {}


def test_errors_are_those_of_the_formats(measured):
    """The relative errors sit where each format's precision puts them: bfloat16 (8 significant
    bits) near 2^-9, int8 absmax rows (7 bits of magnitude) a few times larger, fp8 E4M3 (4
    significant bits) larger again; none is 0 (every layer quantizes) and none is garbage."""
    _, m = measured
    for r in m["rows"]:
        for key in ("forward_rel_err", "dx_rel_err"):
            err = r[key]
            assert math.isfinite(err) and err > 0, (r["layer"], key, err)
            if r["layer"].startswith("nn.Linear"):
                assert err < 2 ** -7
            elif "int8" in r["layer"]:
                assert 2 ** -9 < err < 0.05, (r, key)
            else:
                assert 2 ** -7 < err < 0.15, (r, key)


def test_cpu_times_only_on_the_first_workload(measured):
    workloads, m = measured
    for r in m["rows"]:
        timed = r["workload"] == workloads[0][0] and not r["layer"].startswith("nn.Linear")
        assert (r["cpu_ms"] is not None) == timed
        if timed:
            assert r["cpu_ms"] > 0 and r["vs_nn_linear"] == pytest.approx(
                m["nn_linear_cpu_ms"] / r["cpu_ms"])


def test_training_is_deterministic_and_int8_follows_nn_linear():
    kw = dict(width=32, depth=1, heads=2, lr=3e-3)
    a = _tiny.train("nn_linear", 40, 16, "cpu", 0, **kw)
    b = _tiny.train("nn_linear", 40, 16, "cpu", 0, **kw)
    c = _tiny.train("switchback_int8", 40, 16, "cpu", 0, **kw)
    assert a["losses"] == b["losses"]
    assert len(c["losses"]) == 40 and all(math.isfinite(v) for v in c["losses"])
    assert c["losses"] != a["losses"]  # the converted layers quantize
    # The same data, seed and schedule: int8 SwitchBack's curve stays close to the baseline's.
    assert abs(c["final"] - a["final"]) < 0.02 * a["final"]
    for r in (a, c):
        assert sum(r["losses"][-10:]) < sum(r["losses"][:10])
