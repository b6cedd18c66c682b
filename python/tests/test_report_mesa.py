"""The report's Mesa section (marker torch): a row per workload and grouping, per-head grouping
no worse than per-tensor on head-wise scaled data, the round trip within the rule's alpha/2, the
block's saved bytes below native, and gradient errors small but not zero."""

from __future__ import annotations

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from lowbit import _report_mesa as rm  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def result():
    rng = np.random.default_rng(4)
    workloads = [types.SimpleNamespace(name="gaussian",
                                       values=rng.standard_normal(4096).astype(np.float32)),
                 types.SimpleNamespace(name="outliers", values=(np.where(
                     rng.random(4096) < 0.01, 50.0, 1.0) * rng.standard_normal(4096)).astype(
                         np.float32))]
    ctx = types.SimpleNamespace(workloads=workloads, threads=2, quick=True, training=False,
                                progress=lambda message: None)
    return rm.section(ctx)


def test_round_trip_rows(result):
    rows = [r for r in result.rows if r["kind"] == "round_trip"]
    assert [(r["workload"], r["grouping"]) for r in rows] == [
        (w, g) for w in ("gaussian", "outliers") for g in ("per tensor", "per head")]
    for r in rows:
        assert 0 < r["rel_err"] < 0.2
        assert r["max_err_over_alpha"] <= 0.5 + 1e-3
    for w in ("gaussian", "outliers"):
        tensor, head = [r for r in rows if r["workload"] == w]
        assert head["worst_head_rel_err"] < tensor["worst_head_rel_err"]


def test_model_rows(result):
    rows = [r for r in result.rows if r["kind"] == "model"]
    assert len(rows) == 5
    for r in rows:
        assert 0 < r["grad_rel_err"] < 0.05
        assert r["saved_fraction"] > 0.45
    # The fused MLP keeps no 8-bit act(h): fewer bytes than the same core module by module.
    sdpa = {r["mlp"]: r for r in rows if r["core"] == "sdpa" and r["rounding"] == "nearest_even"}
    assert sdpa["fused"]["saved_bytes"] < sdpa["modules"]["saved_bytes"]
    assert "grad rel err" in result.text and "fused" in result.text
