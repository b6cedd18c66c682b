"""`lowbit report`: its JSON, table and plots, and the bounds its numbers must obey.

The bounds are derived from the rounding rules (docs/rounding.md), not from earlier output: a
rounding to nearest is never more than half an ulp of the input away, a directed or stochastic
one less than one ulp, and no mode is closer to the input than nearest_even. No test looks at
timings.
"""

from __future__ import annotations

import io
import json
import math
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import lowbit
from lowbit import cli, report

WORKLOADS = ["gaussian", "heavy_tailed", "outliers"]
QUICK_FORMATS = ["e4m3fn", "e5m2", "e2m1fn", "float16", "bfloat16"]
QUICK_ROUNDINGS = ["nearest_even", "toward_zero", "stochastic"]
ALL_FORMATS = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e4m3b11fnuz", "e4m3", "e3m4",
               "e8m0fnu", "e3m2fn", "e2m3fn", "e2m1fn", "float16", "bfloat16", "tfloat32"]
ALL_ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero", "up", "down", "odd",
                 "stochastic"]
ML_DTYPES_FORMATS = [f for f in ALL_FORMATS if f != "tfloat32"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# (name, extra arguments, formats, roundings): the --quick report, and every format and mode on
# small workloads (e8m0fnu's |x|, the directed modes).
RUNS = {
    "quick": (["--quick"], QUICK_FORMATS, QUICK_ROUNDINGS),
    "all": (["--size", "4096", "--no-training"], ALL_FORMATS, ALL_ROUNDINGS),
}


class Run:
    def __init__(self, name: str, out_dir: Path):
        args, self.formats, self.roundings = RUNS[name]
        self.out_dir = out_dir
        buffer = io.StringIO()
        assert cli.main(["report", *args, "--out", str(out_dir)], out=buffer) == 0
        self.text = buffer.getvalue()
        self.doc = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
        self.casts = self.doc["sections"]["casts"]["rows"]
        self.throughput = self.doc["sections"]["throughput"]["rows"]
        self.blockwise = self.doc["sections"]["blockwise"]["rows"]

    def cast_row(self, workload: str, fmt: str, rounding: str) -> dict:
        return next(r for r in self.casts
                    if (r["workload"], r["format"], r["rounding"]) == (workload, fmt, rounding))


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory) -> Run:
    return Run(request.param, tmp_path_factory.mktemp(f"report_{request.param}"))


# ---- the report's contents ---------------------------------------------------------------------


def test_json_has_every_workload_format_and_rounding(run):
    keys = [(r["workload"], r["format"], r["rounding"]) for r in run.casts]
    expected = {(w, f, r) for w in WORKLOADS for f in run.formats for r in run.roundings}
    assert len(keys) == len(set(keys))
    assert set(keys) == expected
    assert list(run.doc["workloads"]) == WORKLOADS
    assert [r["format"] for r in run.throughput] == run.formats


def test_histogram_counts_every_nonzero_value(run):
    for r in run.casts:
        size = run.doc["workloads"][r["workload"]]["size"]
        assert r["n"] + r["zeros_excluded"] == size
        assert sum(r["ulp_hist"]) == r["n"]
        assert all(c >= 0 for c in r["ulp_hist"])


def test_rounding_to_nearest_is_within_half_an_ulp(run):
    for r in run.casts:
        if r["rounding"] not in ("nearest_even", "nearest_away"):
            continue
        assert r["max_ulp_err"] <= 0.5, r
        # [0.5, 0.75) holds only exact ties (0.5 ulp); nothing lies further out.
        assert r["ulp_hist"][3:] == [0, 0, 0], r
        if r["ulp_hist"][2]:
            assert r["max_ulp_err"] == 0.5, r


def test_directed_and_stochastic_rounding_are_within_one_ulp(run):
    for r in run.casts:
        if r["rounding"] in ("nearest_even", "nearest_away"):
            continue
        assert r["max_ulp_err"] < 1.0, r
        assert r["ulp_hist"][4:] == [0, 0], r


def test_no_rounding_is_closer_than_nearest_even(run):
    # Value by value, nearest_even's error is the smallest possible; so are its mean and max.
    for r in run.casts:
        best = run.cast_row(r["workload"], r["format"], "nearest_even")
        assert r["mean_rel_err"] >= best["mean_rel_err"] * (1 - 1e-12), r
        assert r["max_rel_err"] >= best["max_rel_err"], r


def test_toward_zero_shrinks_and_flushes_at_least_as_much(run):
    for r in run.casts:
        if r["rounding"] != "toward_zero":
            continue
        assert r["mean_signed_rel_err"] <= 0, r
        nearest = run.cast_row(r["workload"], r["format"], "nearest_even")
        # Whatever rounds to zero under nearest_even (|x| <= half the smallest value) does so
        # toward zero as well.
        assert r["flushed_count"] >= nearest["flushed_count"], r


def test_shares_are_fractions(run):
    for r in run.casts:
        for key in ("saturated", "flushed"):
            assert 0.0 <= r[key] <= 1.0, r
        assert r["saturated"] == r["saturated_count"] / r["n"]
        assert r["flushed"] == r["flushed_count"] / r["n"]
        assert 0.0 <= r["max_rel_err"] and 0.0 <= r["mean_rel_err"] <= r["rms_rel_err"]
        assert r["rms_rel_err"] <= r["max_rel_err"]


def test_scaling_to_max_saturates_at_most_the_absmax_values(run):
    # x * fl(max/absmax) reaches max only at |x| = absmax, and the two float32 roundings can put
    # that product just above max (by a relative 2^-23 or so): nothing else can saturate.
    for r in run.casts:
        assert r["saturated_count"] <= run.doc["workloads"][r["workload"]]["absmax_count"], r


def test_unsigned_format_casts_magnitudes(run):
    for r in run.casts:
        assert r["input"] == ("|x|" if r["format"] == "e8m0fnu" else "x")
        if r["format"] == "e8m0fnu":
            assert r["flushed_count"] == 0  # E8M0 has no zero


def test_throughput_rows(run):
    for r in run.throughput:
        assert r["lowbit_1t"] > 0 and r["lowbit_nt"] > 0 and r["copy"] > 0
        if r["format"] in ML_DTYPES_FORMATS:
            assert r["reference_rate"] > 0
            assert r["ratio"] == pytest.approx(r["lowbit_1t"] / r["reference_rate"])
            # Scaled finite inputs, no overflow: docs/ml_dtypes.md's exceptions cannot occur.
            assert r["same_codes"] is True, r
        else:
            assert r["reference"] is None and r["ratio"] is None


def test_error_speed_points(run):
    labels = [p["label"] for p in run.doc["points"]]
    casts = [label for label in labels if not label.startswith("blockwise")]
    assert [label.split()[0] for label in casts] == run.formats
    assert labels[len(casts):] == ["blockwise 256 (dynamic)", "blockwise 2048 (dynamic)"]
    for p in run.doc["points"]:
        assert p["throughput"] > 0 and p["error"] > 0


def test_blockwise_rows(run):
    assert [(r["workload"], r["block"]) for r in run.blockwise] == [
        (w, b) for w in WORKLOADS for b in (256, 2048)]
    values = lowbit.Codebook.dynamic_tree().values.astype(np.float64)
    # Nearest entry: |t - entry| is at most half the widest gap (-1 below the first entry
    # included), plus the float32 roundings of t = x / a and of entry * a.
    half_gap = max(np.diff(values).max(), values[0] + 1) / 2
    for r in run.blockwise:
        assert r["codebook"] == "dynamic" and r["rounding"] == "nearest_toward_zero"
        assert r["bits_per_value"] == 8 + 32 / r["block"]
        assert r["n"] + r["zeros_excluded"] == run.doc["settings"]["size"]
        assert 0 < r["mean_err_over_absmax"] <= r["max_err_over_absmax"] <= half_gap + 2**-22
        assert 0 < r["mean_rel_err"] <= r["rms_rel_err"] and r["mean_rel_err"] <= r["max_rel_err"]
        assert r["max_rel_err"] <= 1 + 2**-22  # nearest never overshoots by more than |x|
        assert 0 <= r["flushed"] <= 1 and r["flushed_count"] == round(r["flushed"] * r["n"])
        timed = r["workload"] == "gaussian"
        for key in ("quantize_1t", "quantize_nt", "dequantize_1t", "copy"):
            assert (r[key] > 0) if timed else (r[key] is None), (key, r)
        if timed:
            assert r["quantize_vs_copy"] == pytest.approx(r["quantize_1t"] / r["copy"])
            assert r["dequantize_vs_copy"] == pytest.approx(r["dequantize_1t"] / r["copy"])
        else:
            assert r["quantize_vs_copy"] is None and r["dequantize_vs_copy"] is None


def test_blockwise_errors_equal_a_direct_computation(run):
    x = run_workload(run, "gaussian")
    codes, absmax = lowbit.quantize_blockwise(x, "dynamic", 256)
    back = lowbit.dequantize_blockwise(codes, absmax, "dynamic", 256).astype(np.float64)
    x64 = x.astype(np.float64)
    nz = x64 != 0
    rel = np.abs(back[nz] - x64[nz]) / np.abs(x64[nz])
    a = np.repeat(absmax.astype(np.float64), 256)[:x.size]
    row = next(r for r in run.blockwise if (r["workload"], r["block"]) == ("gaussian", 256))
    assert row["mean_rel_err"] == pytest.approx(rel.mean(), rel=1e-9)
    assert row["max_rel_err"] == rel.max()
    assert row["rms_rel_err"] == pytest.approx(np.sqrt(np.mean(rel**2)), rel=1e-9)
    assert row["mean_err_over_absmax"] == pytest.approx(np.mean(np.abs(back - x64) / a),
                                                        rel=1e-9)
    assert row["flushed_count"] == int(np.count_nonzero(nz & (back == 0)))


def run_workload(run, name):
    size = run.doc["settings"]["size"]
    return next(w for w in report.make_workloads(size) if w.name == name).values


def test_plots_are_png_files(run):
    names = sorted(Path(p).name for p in run.doc["plots"])
    # Both runs leave the training comparisons out, so no training plot; the fp8 section's
    # accumulation plot needs numpy alone.
    assert names == ["error_vs_speed.png", "fp8_accumulation.png", "rounding_modes.png"]
    for name in names:
        data = (run.out_dir / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 1000


def test_table_names_every_format_rounding_and_workload(run):
    words = set(run.text.replace("*", " ").split())
    for name in run.formats + run.roundings:
        assert name in words, name
    for w in WORKLOADS:
        assert f"workload {w}:" in run.text
    assert run.text.startswith(f"lowbit {lowbit.__version__} report")
    assert "os.cpu_count() =" in run.text.splitlines()[1]


# ---- ulp and the error statistics --------------------------------------------------------------


@pytest.mark.parametrize("fmt, x, expected", [
    ("e4m3fn", [1.0, 1.9, 2.0, 448.0, 2.0**-6, 2.0**-7, 2.0**-9, 0.0],
     [2.0**-3, 2.0**-3, 2.0**-2, 32.0, 2.0**-9, 2.0**-9, 2.0**-9, 2.0**-9]),
    ("e5m2", [1.0, 57344.0, 2.0**-14, 2.0**-16, -3.0],
     [2.0**-2, 2.0**13, 2.0**-16, 2.0**-16, 0.5]),
    ("e2m1fn", [0.25, 0.5, 1.0, 1.5, 3.0, 6.0, -5.0], [0.5, 0.5, 0.5, 0.5, 1.0, 2.0, 2.0]),
    ("e8m0fnu", [2.0**-127, 1.0, 3.0, 2.0**127], [2.0**-127, 1.0, 2.0, 2.0**127]),
    ("float16", [1.0, 65504.0, 2.0**-20, 1000.0], [2.0**-10, 32.0, 2.0**-24, 0.5]),
    ("bfloat16", [1.0, 3.0e38, 2.0**-130], [2.0**-7, 2.0**120, 2.0**-133]),
])
def test_ulp_exact_values(fmt, x, expected):
    got = report.ulp(np.array(x), lowbit.format_info(fmt))
    assert got.dtype == np.float64
    assert got.tolist() == expected


@pytest.mark.parametrize("fmt", [f for f in ALL_FORMATS if lowbit.format_info(f).bits <= 16])
def test_ulp_is_the_spacing_of_the_grid(fmt):
    # Independent of the formula: decode every code and look at the gaps between neighbours.
    info = lowbit.format_info(fmt)
    values = lowbit.decode(np.arange(1 << info.bits, dtype=info.code_dtype), fmt, "float64")
    grid = np.unique(values[np.isfinite(values) & (values > 0)])
    gaps = np.diff(grid)
    assert np.array_equal(report.ulp(grid[:-1], info), gaps)
    # Strictly inside each gap the ulp is the gap's; negative values mirror positive ones.
    assert np.array_equal(report.ulp(-(grid[:-1] + gaps / 2), info), gaps)


def test_error_stats_of_a_hand_computed_example():
    info = lowbit.format_info("e2m1fn")  # values 0 0.5 1 1.5 2 3 4 6; emin 0, 1 mantissa bit
    x = np.array([1.0, 1.1, -3.0, 0.0, 0.2, 7.0], dtype=np.float32)
    decoded = np.array([1.0, 1.0, -3.0, 0.0, 0.0, 6.0])
    s = report.error_stats(x, decoded, info)
    x11 = float(np.float32(1.1))  # the float32 input is the reference
    rel = [0.0, (x11 - 1.0) / x11, 0.0, 1.0, 1 / 7]
    ulps = [0.0, (x11 - 1.0) / 0.5, 0.0, float(np.float32(0.2)) / 0.5, 1 / 2]
    assert s["n"] == 5 and s["zeros_excluded"] == 1
    assert s["max_rel_err"] == 1.0
    assert s["mean_rel_err"] == pytest.approx(sum(rel) / 5, rel=1e-15)
    assert s["rms_rel_err"] == pytest.approx(math.sqrt(sum(v * v for v in rel) / 5), rel=1e-15)
    assert s["mean_signed_rel_err"] == pytest.approx(
        (-(x11 - 1.0) / x11 - 1.0 - 1 / 7) / 5, rel=1e-15)
    assert s["max_ulp_err"] == pytest.approx(max(ulps), rel=1e-15)
    assert s["ulp_hist"] == [3, 1, 1, 0, 0, 0]  # 0, 0.2, 0 | 0.4 | 0.5
    assert (s["saturated_count"], s["flushed_count"]) == (1, 1)  # 7 > max = 6 | 0.2 -> 0


def test_workloads_are_fixed_by_the_seed():
    a, b = report.make_workloads(5000), report.make_workloads(5000)
    assert [w.name for w in a] == WORKLOADS
    for wa, wb in zip(a, b):
        assert wa.values.dtype == np.float32 and wa.values.size == 5000
        assert np.array_equal(wa.values, wb.values)
    gaussian, heavy, outliers = (w.values for w in a)
    # The outliers workload is a gaussian with 5 values (0.1%) multiplied by 1000.
    assert np.count_nonzero(np.abs(outliers) > 50) <= 5 < np.count_nonzero(np.abs(heavy) > 5)
    assert not np.array_equal(gaussian, outliers)


# ---- options, missing packages, new sections ---------------------------------------------------


def _small_report(tmp_path: Path, *extra: str) -> tuple[str, dict]:
    out = io.StringIO()
    json_path = tmp_path / "elsewhere" / "r.json"
    argv = ["report", "--quick", "--size", "2048", "--threads", "1", "--out", str(tmp_path),
            "--json", str(json_path), *extra]
    assert cli.main(argv, out=out) == 0
    return out.getvalue(), json.loads(json_path.read_text(encoding="utf-8"))


def test_without_matplotlib_the_table_and_json_are_still_written(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends",
                 "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # `import` raises ImportError
    text, doc = _small_report(tmp_path)
    assert "matplotlib is not installed" in text
    assert doc["plots"] == [] and not list(tmp_path.glob("*.png"))
    assert doc["settings"]["size"] == 2048 and doc["settings"]["threads"] == 1
    assert len(doc["sections"]["casts"]["rows"]) == 3 * 5 * 3
    assert not (tmp_path / "report.json").exists()  # --json put it elsewhere


def test_without_ml_dtypes_the_comparison_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    text, doc = _small_report(tmp_path)
    assert "ml_dtypes is not installed" in text
    refs = {r["format"]: r["reference"] for r in doc["sections"]["throughput"]["rows"]}
    assert refs == {f: ("numpy.float16" if f == "float16" else None) for f in QUICK_FORMATS}
    assert doc["machine"]["ml_dtypes"] is None


def test_a_new_section_joins_the_table_json_and_plot(tmp_path):
    def blocks(ctx: report.Context) -> report.SectionResult:
        rows = [{"technique": "made-up", "workload": w.name} for w in ctx.workloads]
        return report.SectionResult(rows=rows, text="made-up section body",
                                    points=[report.Point("made-up", 123.0, 0.5)])

    section = report.Section("blocks", "Made-up technique", blocks)
    out = io.StringIO()
    options = report.Options(out=tmp_path, quick=True, size=1024,
                             sections=[*report.SECTIONS, section])
    doc = report.run_report(options, out, progress=lambda message: None)
    assert "== Made-up technique ==\nmade-up section body" in out.getvalue()
    assert [r["workload"] for r in doc["sections"]["blocks"]["rows"]] == WORKLOADS
    assert {"label": "made-up", "throughput": 123.0, "error": 0.5,
            "device": "CPU, 1 thread"} in doc["points"]


@pytest.mark.parametrize("argv", [["report", "--size", "8"], ["report", "--threads", "-1"],
                                  ["report", "--size", "many"], ["report", "--bogus"]])
def test_usage_errors_exit_with_2(argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


# ---- plots: which way is better, where speed was measured, nothing below the axis -------------


def _draw(plot: report.Plot):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=plot.size, layout="constrained")
    FigureCanvasAgg(fig)
    plot.draw(fig)
    fig.canvas.draw()
    (ax,) = fig.axes
    return ax


def _rounding_plot(run, zero=()):
    # `zero`: (format, rounding) pairs whose error is set to exactly 0.
    rows = [dict(r, mean_rel_err=0.0) if (r["format"], r["rounding"]) in zero else r
            for r in run.casts]
    ctx = types.SimpleNamespace(formats=run.formats, roundings=run.roundings)
    gaussian = [r["mean_rel_err"] for r in rows if r["workload"] == "gaussian"]
    return _draw(report._rounding_plot(rows, ctx)), gaussian


def test_plots_say_which_way_is_better_and_where_speed_was_measured(run):
    pytest.importorskip("matplotlib")
    points = [report.Point(**p) for p in run.doc["points"]]
    ax = _draw(report.error_speed_plot(points, "Made-up CPU 9000"))
    assert "lower is better" in ax.get_ylabel() and "higher is better" in ax.get_xlabel()
    assert "measured on: CPU, 1 thread (Made-up CPU 9000)" in ax.get_xlabel()
    assert "lower right is better" in ax.get_title()
    ax, _ = _rounding_plot(run)
    assert "lower is better" in ax.get_ylabel() and "lower is better" in ax.get_title()


def test_the_speed_axis_names_every_device():
    points = [report.Point("a", 1.0, 0.1), report.Point("b", 2.0, 0.2, device="NVIDIA H200")]
    label = report.speed_axis_label(points, "Made-up CPU")
    assert label.endswith("measured on: CPU, 1 thread (Made-up CPU); NVIDIA H200")


@pytest.mark.parametrize("zero", [(), (("e5m2", "nearest_even"), ("e2m1fn", "stochastic"))])
def test_no_bar_falls_below_the_axis(run, zero):
    pytest.importorskip("matplotlib")
    ax, errors = _rounding_plot(run, zero)
    bottom, _ = ax.get_ylim()
    positive = [e for e in errors if e > 0]
    assert bottom <= min(positive) / 2  # the smallest bar rises visibly
    bars = [b for b in ax.patches if np.isfinite(b.get_height())]
    assert len(bars) == len(positive)
    for bar in bars:
        assert bar.get_y() == pytest.approx(bottom, rel=1e-12)
        assert bar.get_y() + bar.get_height() > bottom
    marks = [t for t in ax.texts if t.get_text() == "0"]
    assert len(marks) == len(zero) == len(errors) - len(positive)
    assert all(t.get_position()[1] == bottom for t in marks)


def test_zero_error_points_sit_on_the_axis_floor():
    pytest.importorskip("matplotlib")
    points = [report.Point("a", 10.0, 0.02), report.Point("b", 20.0, 3e-4),
              report.Point("exact", 30.0, 0.0)]
    ax = _draw(report.error_speed_plot(points))
    bottom, _ = ax.get_ylim()
    assert bottom <= 1.5e-4
    ys = [y for c in ax.collections for _, y in c.get_offsets()]
    assert sorted(ys) == [bottom, 3e-4, 0.02]
    assert "exact (error 0)" in [t.get_text() for t in ax.texts]


@pytest.mark.parametrize("values, floor", [([1.7e-4, 0.3], 5e-5), ([1e-3], 5e-4), ([0.021], 0.01),
                                           ([0.0, 0.0], 1e-3), ([0.0, 4.0], 2.0),
                                           ([np.nan, 0.3], 0.1)])
def test_log_floor(values, floor):
    got = report.log_floor(values)
    assert got == pytest.approx(floor, rel=1e-12)
    assert all(got <= v / 2 for v in values if v > 0)


# ---- progress and output checks ----------------------------------------------------------------


def test_progress_says_what_is_measured_and_how_long_it_took(tmp_path):
    messages: list[str] = []
    options = report.Options(out=tmp_path, quick=True, size=1024, threads=1)
    report.run_report(options, io.StringIO(), progress=messages.append)
    n = len(report.SECTIONS)
    assert messages[0].startswith(f"{len(QUICK_FORMATS)} formats x {len(QUICK_ROUNDINGS)} "
                                  "roundings, 3 workloads of 1024 values")
    for i, section in enumerate(report.SECTIONS, 1):
        start = next(m for m in messages if m.startswith(f"[{i}/{n}] {section.title} ..."))
        end = next(m for m in messages if m.startswith(f"[{i}/{n}] {section.name} done in "))
        assert messages.index(start) < messages.index(end)
        assert start.endswith(" s)") and end.endswith(" s)")
    assert messages[-1].startswith("done in ")


def test_progress_goes_to_stderr(tmp_path, capsys):
    out = io.StringIO()
    assert cli.main(["report", "--quick", "--size", "1024", "--threads", "1", "--out",
                     str(tmp_path)], out=out) == 0
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("report: ") for line in err)
    assert "report:" not in out.getvalue()


def test_an_unwritable_output_fails_before_measuring(tmp_path):
    (tmp_path / "file").write_text("x")
    messages: list[str] = []
    with pytest.raises(report.OutputError, match="exists and is not a directory"):
        report.run_report(report.Options(out=tmp_path / "file", quick=True, size=1024),
                          io.StringIO(), progress=messages.append)
    assert messages == []
    with pytest.raises(report.OutputError, match="is a directory; name the JSON file"):
        report.run_report(report.Options(out=tmp_path / "ok", json=tmp_path, quick=True,
                                         size=1024), io.StringIO(), progress=messages.append)
    assert messages == []


def test_a_plot_that_cannot_be_written_keeps_the_json(tmp_path):
    """A plot path that is taken (here by a directory) fails the run with one line naming it,
    after the table and the JSON are written."""
    (tmp_path / "error_vs_speed.png").mkdir()
    out = io.StringIO()
    options = report.Options(out=tmp_path, quick=True, size=1024,
                             sections=[s for s in report.SECTIONS if s.name == "casts"])
    with pytest.raises(report.OutputError, match=r"error_vs_speed.png: cannot write: "):
        report.run_report(options, out, progress=lambda message: None)
    doc = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert doc["sections"]["casts"]["rows"]
