"""The report's fp8 section: a row per workload, K and accumulation model; fp32 within its
gamma_{K-1} bound and equal to a float32 sequential sum; the Hopper models worse than fp32 on the
many-binade rows, slow and fast equal up to K = 128 and fast falling behind as K grows; the
exact zeros the models' definitions imply on the cancelling rows; every model exact at K = 1;
the exact sums checked against math.fsum of the products; and (marker torch) Float8Linear's errors
small but not zero, with Hopper's slow and fast sums equal where K <= 128."""

from __future__ import annotations

import math
import sys
import types

import numpy as np
import pytest

import lowbit
from lowbit import _report_fp8 as rf

MODELS = ("fp32", "hopper_slow", "hopper_fast")


def quick_ctx() -> types.SimpleNamespace:
    return types.SimpleNamespace(workloads=[], threads=2, quick=True, training=False,
                                 progress=lambda message: None)


@pytest.fixture(scope="module")
def result():
    return rf.section(quick_ctx())


def acc(result, workload: str, k: int, model: str) -> dict:
    (row,) = [r for r in result.rows if r["kind"] == "accumulation" and
              (r["workload"], r["k"], r["model"]) == (workload, k, model)]
    return row


def test_accumulation_rows(result):
    rows = [r for r in result.rows if r["kind"] == "accumulation"]
    assert [(r["workload"], r["k"], r["model"]) for r in rows] == [
        (w, k, m) for w in rf.WORKLOADS for k in rf.QUICK_KS for m in MODELS]
    for r in rows:
        assert r["outputs"] == rf.QUICK_ROWS ** 2
        assert r["exact_zero"] == (r["workload"] == "cancellation")
    assert "max |err|/sum|ab|" in result.text


def test_fp32_within_its_bound(result):
    for w in rf.WORKLOADS:
        for k in rf.QUICK_KS:
            r = acc(result, w, k, "fp32")
            assert r["max_rel_err"] <= rf.gamma(k - 1)
            assert r["max_over_gamma"] <= 1


def test_hopper_worse_than_fp32_on_spread(result):
    for k in rf.QUICK_KS:
        fp32 = acc(result, "spread", k, "fp32")["mean_rel_err"]
        for m in ("hopper_slow", "hopper_fast"):
            assert acc(result, "spread", k, m)["mean_rel_err"] > 10 * fp32


def test_fast_falls_behind_slow_as_k_grows(result):
    # Slow mode promotes after every 4 blocks of 32: up to K = 128 that is once, at the end,
    # where fast mode's register is the result too, so the two are the same sum.
    small, *larger = rf.QUICK_KS
    for w in ("gaussian", "spread"):
        slow, fast = acc(result, w, small, "hopper_slow"), acc(result, w, small, "hopper_fast")
        assert {k: v for k, v in slow.items() if k not in ("model", "spec")} == \
            {k: v for k, v in fast.items() if k not in ("model", "spec")}
        ratios = [acc(result, w, k, "hopper_fast")["mean_rel_err"]
                  / acc(result, w, k, "hopper_slow")["mean_rel_err"] for k in larger]
        assert ratios == sorted(ratios) and ratios[0] > 1


def test_slow_and_fast_equal_up_to_128_products():
    a, b = rf.operands("spread", 16, 128, np.random.default_rng(1))
    slow = rf.dots(a, b, lowbit.Accumulation.hopper(), 2)
    np.testing.assert_array_equal(slow, rf.dots(a, b, lowbit.Accumulation.hopper(fast=True), 2))
    assert not np.array_equal(slow, rf.dots(a, b, lowbit.Accumulation.fp32(), 2))


def test_cancellation(result):
    # K = 32: both halves share one block, whose aligned terms cancel exactly (truncation toward
    # zero is odd), so the block sum is 0. K = 256: each half is one promotion group of slow
    # mode; the second starts from a zero register and meets the negated products on the same
    # grids, so its register is the first's negated and the promoted sum is exactly 0.
    for m in ("hopper_slow", "hopper_fast"):
        assert acc(result, "cancellation", 32, m)["max_rel_err"] == 0
    assert acc(result, "cancellation", 256, "hopper_slow")["max_rel_err"] == 0
    for k in rf.QUICK_KS[1:]:
        assert acc(result, "cancellation", k, "hopper_fast")["max_rel_err"] > 0
        r = acc(result, "cancellation", k, "fp32")
        assert r["max_rel_err"] <= rf.gamma(k - 1)


def test_one_product_is_exact_under_every_model():
    rows = rf.accumulation_rows((1,), 16, 2, workloads=("gaussian", "spread"))
    assert len(rows) == 2 * len(MODELS)
    for r in rows:
        assert r["max_rel_err"] == 0 and r["differ_fraction"] == 0


def test_fp32_is_the_float32_sequential_sum():
    a, b = rf.operands("spread", 16, 256, np.random.default_rng(2))
    da, db = (lowbit.decode(x, "e4m3fn", dtype="float64") for x in (a, b))
    s = np.zeros((16, 16), np.float32)
    for i in range(a.shape[1]):
        s = s + np.outer(da[:, i], db[:, i]).astype(np.float32)  # exact products, rounded sums
    np.testing.assert_array_equal(rf.dots(a, b, lowbit.Accumulation.fp32(), 2), s)
    assert not np.array_equal(rf.dots(a, b, lowbit.Accumulation.hopper(), 2), s)


def test_exact_sums_equal_fsum_of_the_products():
    # The section sums in int64 units of 2^-18; math.fsum of the float64 products (each exact) is
    # an independent way to the same numbers: it rounds the exact sum once, and the sum fits
    # float64 here, so it returns the sum itself.
    for w in rf.WORKLOADS:
        a, b = rf.operands(w, 6, 4096, np.random.default_rng(3))
        exact, scale = rf.exact_sums(a, b)
        da, db = (lowbit.decode(x, "e4m3fn", dtype="float64") for x in (a, b))
        np.testing.assert_array_equal(
            exact, [[math.fsum(da[i] * db[j]) for j in range(6)] for i in range(6)])
        np.testing.assert_array_equal(
            scale, [[math.fsum(np.abs(da[i] * db[j])) for j in range(6)] for i in range(6)])
        assert np.all(scale > 0) and np.all(np.abs(exact) <= scale)
        assert np.all(exact == 0) == (w == "cancellation")
    # 448 x 448 products: from K = 2^53 / (448 * 2^9)^2 = 171196 on, the sums may need more than
    # 53 bits, and the section says so rather than rounding.
    ok = np.full((1, 171196), 0x7E, np.uint8)
    assert rf.exact_sums(ok, ok)[0][0, 0] == 171196 * 448.0 ** 2
    big = np.full((1, 171197), 0x7E, np.uint8)
    with pytest.raises(AssertionError, match="53 bits"):
        rf.exact_sums(big, big)


def test_speed_rows(result):
    rows = [r for r in result.rows if r["kind"] == "speed"]
    assert [r["model"] for r in rows] == list(MODELS)
    m, n, k = rf.SPEED_SHAPE
    for r in rows:
        assert (r["m"], r["n"], r["k"]) == (m, n, k)
        assert r["cpu_ms"] > 0
        assert r["products_per_s"] == pytest.approx(m * n * k / (r["cpu_ms"] / 1e3), rel=1e-9)
        assert r["vs_fp32"] == pytest.approx(r["products_per_s"] / rows[0]["products_per_s"],
                                             rel=1e-12)


def test_plot(result, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from lowbit.report import save_plots

    (path,) = save_plots(result.plots, tmp_path)
    assert path.name == "fp8_accumulation.png" and path.stat().st_size > 0
    # The report's rule for error axes: the bottom at log_floor, at least a factor 2 below the
    # smallest nonzero error; each error of exactly 0 an open marker on that floor.
    fig = Figure(figsize=result.plots[0].size)
    FigureCanvasAgg(fig)
    result.plots[0].draw(fig)
    errors = [r["mean_rel_err"] for r in result.rows if r["kind"] == "accumulation"]
    assert len(fig.axes) == len(rf.WORKLOADS)
    for ax, w in zip(fig.axes, rf.WORKLOADS):
        bottom, _ = ax.get_ylim()
        assert bottom <= min(e for e in errors if e > 0) / 2
        on_floor = [y for c in ax.collections for _, y in c.get_offsets()]
        assert on_floor == [bottom] * sum(
            1 for r in result.rows if r["kind"] == "accumulation" and r["workload"] == w
            and r["mean_rel_err"] == 0)
    assert "lower is better" in fig.get_suptitle()


def test_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setattr(rf, "QUICK_KS", (32,))
    monkeypatch.setattr(rf, "QUICK_ROWS", 4)
    r = rf.section(quick_ctx())
    assert {row["kind"] for row in r.rows} == {"accumulation", "speed"}
    assert any("skipped: PyTorch is not installed" in n for n in r.notes)
    assert "skipped: PyTorch" in r.text


@pytest.mark.torch
def test_float8_linear_rows(result):
    rows = {r["recipe"]: r for r in result.rows if r["kind"] == "float8_linear"}
    assert list(rows) == ["fp8_tensorwise", "fp8_tensorwise_delayed", "fp8_rowwise",
                          "fp8_blockwise_1x128", "mxfp8", "hopper_emulated",
                          "hopper_emulated_fast"]
    for r in rows.values():
        for t in ("y", "dx", "dw"):
            assert 0 < r[f"{t}_rel_err"] < 0.1
        assert r["cpu_ms"] > 0
    slow, fast = rows["hopper_emulated"], rows["hopper_emulated_fast"]
    for r in (slow, fast):
        for t in ("y", "dx", "dw"):
            assert 0 < r[f"{t}_vs_fp32_sum"] < 1e-3
    # Y and dX sum 128 products (in, out features): the same sum in both modes; dW sums 256.
    assert slow["y_vs_fp32_sum"] == fast["y_vs_fp32_sum"]
    assert slow["dx_vs_fp32_sum"] == fast["dx_vs_fp32_sum"]
    assert slow["dw_vs_fp32_sum"] != fast["dw_vs_fp32_sum"]
    assert rows["fp8_tensorwise_delayed"]["y_vs_fp32_sum"] is None
    assert "dW rel err" in result.text
