"""The report's optimizer section (marker torch): a row per workload, shape and optimizer; 8-bit
errors above 0 and within bounds read off the dynamic map's spacing; shapes outside the 8-bit rule
equal to their 32-bit twins; lowbit's 32-bit AdamW within the documented ulps of torch's; the state
bytes per parameter of codes plus absmax against float states; the step-time rows; and a short
training run in which the 8-bit optimizers follow their 32-bit twins."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from lowbit import _report_optim as ro  # noqa: E402
from lowbit import report  # noqa: E402
from lowbit._blockwise import Codebook  # noqa: E402

pytestmark = pytest.mark.torch

WORKLOADS = ("gaussian", "heavy_tailed", "outliers")
EIGHT_BIT_SHAPES = [s for s in ro.SHAPES if len(s) >= 2]
# 8-bit states: one uint8 code per element and state plus one float32 absmax per block of 256.
EIGHT_BIT_BYTES = 2 + 2 * 4 / 256


def _top_decade_half_gap(signed: bool) -> float:
    """The largest gap between neighbouring entries of the dynamic tree map in [0.1, 1], halved,
    relative to the smaller entry: the worst relative error of rounding a value there to the
    nearest entry."""
    v = np.sort(np.asarray(Codebook.dynamic_tree(signed).values, dtype=np.float64))
    v = v[v >= 0.1]
    return float(np.max(np.diff(v) / (2 * v[:-1])))


@pytest.fixture(scope="module")
def result():
    # The report's own workloads, small: the gradients are draws (with replacement) of them.
    ctx = types.SimpleNamespace(workloads=report.make_workloads(1 << 12), threads=2, quick=True,
                                training=False, progress=lambda message: None)
    return ro.section(ctx)


def _rows(result, kind):
    return [r for r in result.rows if r["kind"] == kind]


def test_state_error_rows_cover_every_workload_shape_and_optimizer(result):
    rows = _rows(result, "state_error")
    assert [(r["workload"], tuple(r["shape"]), r["optimizer"]) for r in rows] == [
        (w, s, o) for w in WORKLOADS for s in ro.SHAPES for o in ("AdamW8bit", "StableAdamW8bit")]
    for r in rows:
        assert r["state_bits"] == (8 if tuple(r["shape"]) in EIGHT_BIT_SHAPES else 32), r
    assert "exp_avg_sq rel err" in result.text and "8-bit" in result.text


def test_8bit_errors_are_above_zero_and_within_the_dynamic_maps_spacing(result):
    # In the top decade of a block's absmax, [0.1, 1], the signed map (first moments) rounds with
    # a relative error of at most h (about 6.6 %), the unsigned map (second moments) with half
    # that. Most of a Gaussian or Student-t block's squared state lies there, and each of the
    # STEPS requantizations adds an error whose direction varies from element to element and step
    # to step, so a state's relative Frobenius error stays below h (measured: 1-3 %). The update
    # m / sqrt(v) carries the error of m plus half that of v: below 1.5 h, bounded here by 2 h.
    # A state read from the wrong map or not requantized errs by far more. The parameter's error
    # is the update's times ||p - p0|| / ||p||, which is below 1 after STEPS steps of about lr =
    # 1e-3 from parameters of size PARAM_STD = 0.02.
    h = _top_decade_half_gap(signed=True)
    assert 0.05 < h < 0.07  # the map's spacing the bound rests on
    rows = [r for r in _rows(result, "state_error") if r["state_bits"] == 8]
    assert rows
    for r in rows:
        keys = ("param_rel_err", "update_rel_err", "exp_avg_rel_err", "exp_avg_sq_rel_err")
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in keys), r
        assert r["param_rel_err"] < r["update_rel_err"], r
        if r["workload"] == "outliers":
            # A block holding a 1000x gradient leaves the other elements' second moments near
            # the bottom of the unsigned map: their updates err by tens of per cent. A second
            # moment flushed to 0 under a nonzero first moment would instead make a step of
            # lr m / eps, thousands of times the 32-bit one.
            assert r["update_rel_err"] < 10, r
            assert r["exp_avg_rel_err"] < h and r["exp_avg_sq_rel_err"] < h, r
            continue
        assert r["exp_avg_rel_err"] < h, r
        assert r["exp_avg_sq_rel_err"] < h, r
        assert r["update_rel_err"] < 2 * h, r


def test_shapes_outside_the_8bit_rule_equal_their_32bit_twins(result):
    rows = [r for r in _rows(result, "state_error") if r["state_bits"] == 32]
    assert {tuple(r["shape"]) for r in rows} == set(ro.SHAPES) - set(EIGHT_BIT_SHAPES)
    for r in rows:
        assert r["param_rel_err"] == r["update_rel_err"] == 0, r
        assert r["exp_avg_rel_err"] == r["exp_avg_sq_rel_err"] == 0, r


def test_state_bytes_per_parameter(result):
    for r in _rows(result, "state_error"):
        expected = EIGHT_BIT_BYTES if r["state_bits"] == 8 else 8.0
        assert r["bytes_per_param"] == pytest.approx(expected, rel=1e-12), r
        assert r["twin_bytes_per_param"] == pytest.approx(8.0, rel=1e-12), r


def test_32bit_adamw_stays_within_the_documented_ulps_of_torch(result):
    # docs/techniques/optimizers.md: per step from identical values, parameters within 8 ulps,
    # states within 6 u of their magnitude. Run apart for STEPS steps, the parameters stay within
    # STEPS times a few ulps (u = 2^-24, about 6e-8) relative.
    rows = _rows(result, "vs_torch")
    assert [(r["workload"], tuple(r["shape"])) for r in rows] == [
        (w, s) for w in WORKLOADS for s in ro.SHAPES]
    for r in rows:
        assert r["max_param_ulps"] <= 8, r
        assert r["max_state_units"] <= 6, r
        assert r["param_rel_err"] < ro.STEPS * 8 * 2.0 ** -24, r


def test_step_time_rows(result):
    rows = _rows(result, "step_time")
    assert [r["optimizer"] for r in rows] == ro.TRAIN_CONFIGS
    numel = [math.prod(s) for s in ro.TIMING_SHAPES]
    # Weights (rows of whole blocks) keep 8-bit states, the biases 32-bit ones.
    eight = sum(n * EIGHT_BIT_BYTES if len(s) >= 2 else n * 8.0
                for n, s in zip(numel, ro.TIMING_SHAPES)) / sum(numel)
    for r in rows:
        assert r["params"] == sum(numel)
        assert r["ms_per_step"] > 0 and r["mparams_per_s"] > 0
        expected = eight if r["optimizer"].endswith("8bit") else 8.0
        assert r["bytes_per_param"] == pytest.approx(expected, rel=1e-12), r
    assert rows[0]["vs_torch"] == 1.0
    assert "M params/s" in result.text


def test_8bit_training_follows_its_32bit_twin():
    # 40 steps of the section's MLP regression: both descend, and the 8-bit runs end within 10 %
    # of their 32-bit twins (docs/techniques/optimizers.md's 300-step MLP test allows 25 % +
    # 0.005; this task is easier, and the section reports about 0.1 % over 200 steps).
    runs = ro.train_runs(40, ["AdamW", "AdamW8bit", "StableAdamW", "StableAdamW8bit"])
    for eight, twin in ro.PAIRS:
        a, b = runs[eight], runs[twin]
        assert a["losses"][0] == b["losses"][0]  # the same start and batch
        assert b["final"] < 0.5 * b["losses"][0] and a["final"] < 0.5 * a["losses"][0]
        assert abs(a["final"] - b["final"]) <= 0.1 * b["final"], (eight, a["final"], b["final"])
        assert a["losses"] != b["losses"]  # the 8-bit states do change the trajectory
        assert a["eight_bit_share"] > 0.99 and b["eight_bit_share"] == 0
        assert 2 < a["bytes_per_param"] < 2.1 and b["bytes_per_param"] == 8.0


def test_without_torch_the_section_says_so_and_measures_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    ctx = types.SimpleNamespace(workloads=report.make_workloads(64), threads=1, quick=True,
                                training=True, progress=lambda message: None)
    r = ro.section(ctx)
    assert r.rows == [] and r.plots == []
    assert r.notes == [r.text.removeprefix("note: ")]
    assert "skipped: PyTorch is not installed" in r.text
