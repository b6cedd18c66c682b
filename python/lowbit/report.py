"""`lowbit report`: error and speed of every technique on built-in synthetic workloads.

The report is a list of sections (SECTIONS). A section is a function of the shared Context that
returns a SectionResult: rows (the JSON record), the text it prints, points for the
error-versus-speed plot and, optionally, its own plots. Later techniques (row-wise and block
quantization, optimizers) join by appending a Section; the driver (run_report) prints,
plots and writes JSON for all of them alike. docs/report.md describes every number.

Error metrics are computed in float64 from decoded values, chunk by chunk: a 4M-element float64
temporary costs more in page faults and memory traffic than the arithmetic on it, while chunks of
CHUNK elements stay in cache and are shared by every rounding mode of a format.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

import lowbit
from lowbit._api import FormatInfo, format_info

# ---- settings ----------------------------------------------------------------------------------

SEED = 20240229  # workloads
STOCHASTIC_SEED = 7  # Philox seed of stochastic rounding
STOCHASTIC_RANDOM_BITS = 8
DEFAULT_SIZE = 1 << 22
QUICK_SIZE = 1 << 18
QUICK_FORMATS = ("e4m3fn", "e5m2", "e2m1fn", "bfloat16", "float16")
QUICK_ROUNDINGS = ("nearest_even", "toward_zero", "stochastic")
TIMING_RUNS = 5  # timed runs after one warm-up; the median is reported
CHUNK = 1 << 14

# Upper edges of the ulp-error histogram bins; the last bin is [2, inf).
ULP_EDGES = (0.25, 0.5, 0.75, 1.0, 2.0)
ULP_BINS = ("[0,.25)", "[.25,.5)", "[.5,.75)", "[.75,1)", "[1,2)", ">=2")

# lowbit format -> the ml_dtypes type of the same name; float16 is numpy's own (np.float16).
ML_DTYPES_NAMES = {
    "e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2fnuz": "float8_e5m2fnuz",
    "e4m3b11fnuz": "float8_e4m3b11fnuz",
    "e4m3": "float8_e4m3",
    "e3m4": "float8_e3m4",
    "e8m0fnu": "float8_e8m0fnu",
    "e3m2fn": "float6_e3m2fn",
    "e2m3fn": "float6_e2m3fn",
    "e2m1fn": "float4_e2m1fn",
    "bfloat16": "bfloat16",
}


# ---- workloads ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A synthetic float32 tensor every section measures on."""

    name: str
    description: str
    values: np.ndarray

    def facts(self) -> dict[str, Any]:
        a = np.abs(self.values)
        absmax = float(a.max())
        return {
            "description": self.description,
            "size": int(self.values.size),
            "absmax": absmax,
            "absmax_count": int(np.count_nonzero(a == absmax)),
            "zeros": int(np.count_nonzero(a == 0)),
        }


def make_workloads(size: int, seed: int = SEED) -> list[Workload]:
    """gaussian, heavy_tailed and outliers, each ``size`` float32 values.

    Each workload has its own generator (seeded with (seed, index)), so that one workload's
    values do not depend on which others were drawn before it.
    """
    def rng(index: int) -> np.random.Generator:
        return np.random.default_rng([seed, index])

    gaussian = rng(0).standard_normal(size, dtype=np.float32)
    heavy = rng(1).standard_t(3, size).astype(np.float32)
    r = rng(2)
    outliers = r.standard_normal(size, dtype=np.float32)
    picked = r.choice(size, size // 1000, replace=False)
    outliers[picked] *= np.float32(1000)
    return [
        Workload("gaussian", "N(0,1)", gaussian),
        Workload("heavy_tailed", "Student t, 3 degrees of freedom", heavy),
        Workload("outliers", "N(0,1), 0.1% of the values times 1000", outliers),
    ]


# ---- scaling and error metrics -----------------------------------------------------------------


def cast_input(x: np.ndarray, info: FormatInfo) -> np.ndarray:
    """What is cast to a format: x itself, or |x| for a format without sign (e8m0fnu)."""
    return x if info.signed else np.abs(x)


def per_tensor_scale(x: np.ndarray, info: FormatInfo) -> np.float32:
    """fl(max / absmax) in float32: current per-tensor scaling, as fp8 training does it and as
    lowbit's per_tensor quantization computes it (docs/techniques/quantization.md)."""
    absmax = np.float32(np.abs(x).max())
    if absmax == 0:
        return np.float32(1)
    return np.float32(info.max) / absmax


def ulp(x: Any, info: FormatInfo) -> np.ndarray:
    """The ulp of ``info``'s format at |x|: 2^(max(floor(log2|x|), emin) - man_bits), float64.

    Exact (frexp, not log2, which may round up just below a power of two). At x = 0 it is the
    subnormal spacing 2^(emin - man_bits).
    """
    a = np.abs(np.asarray(x, dtype=np.float64))
    return np.ldexp(1.0, _ulp_exponent(a, info))


def _ulp_exponent(a: np.ndarray, info: FormatInfo) -> np.ndarray:
    _, e = np.frexp(a)  # a = m * 2^e with 0.5 <= m < 1, so floor(log2 a) = e - 1
    binade = np.where(a == 0, info.emin, e - 1)
    return np.maximum(binade, info.emin) - info.man_bits


class _Reference:
    """One chunk of a cast's (float32) inputs, with what every rounding mode's errors need."""

    def __init__(self, xs: np.ndarray, info: FormatInfo):
        x = xs.astype(np.float64)
        nonzero = x != 0
        # Relative error is undefined at exact zeros: they are left out (and counted).
        self.mask: np.ndarray | None = None if nonzero.all() else nonzero
        if self.mask is not None:
            x = x[nonzero]
        self.x = x
        self.zeros = int(xs.size - x.size)
        self.inv_x = 1.0 / x
        a = np.abs(x)
        # Powers of two: multiplying by them is exact, unlike dividing by the ulp.
        self.inv_ulp = np.ldexp(1.0, -_ulp_exponent(a, info))
        self.saturated = int(np.count_nonzero(a > info.max))

    def select(self, decoded: np.ndarray) -> np.ndarray:
        return decoded if self.mask is None else decoded[self.mask]


@dataclass
class ErrorStats:
    """Error statistics of one cast, accumulated over chunks (see docs/report.md)."""

    n: int = 0
    zeros: int = 0
    sum_rel: float = 0.0
    sum_sq_rel: float = 0.0
    sum_signed_rel: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    below: list[int] = field(default_factory=lambda: [0] * len(ULP_EDGES))  # count(u < edge)
    saturated: int = 0
    flushed: int = 0

    def add(self, ref: _Reference, decoded: np.ndarray) -> None:
        """Adds a chunk: ``decoded`` are the float64 values of the codes of ``ref``'s inputs."""
        d = ref.select(decoded)
        self.n += d.size
        self.zeros += ref.zeros
        self.saturated += ref.saturated
        if d.size == 0:
            return
        # Exact unless d and x are more than 2^29 apart (float32 operands, 53-bit difference).
        diff = d - ref.x
        rel = diff * ref.inv_x
        self.sum_signed_rel += float(rel.sum())
        np.abs(rel, out=rel)
        self.sum_rel += float(rel.sum())
        self.max_rel = max(self.max_rel, float(rel.max()))
        # Not np.dot: BLAS may start threads for it, which costs far more than it saves here.
        self.sum_sq_rel += float(np.square(rel, out=rel).sum())
        u = np.abs(diff, out=diff)
        u *= ref.inv_ulp
        self.max_ulp = max(self.max_ulp, float(u.max()))
        for i, edge in enumerate(ULP_EDGES):
            self.below[i] += int(np.count_nonzero(u < edge))
        self.flushed += int(np.count_nonzero(d == 0))

    def ulp_histogram(self) -> list[int]:
        """Counts of the ULP_BINS bins."""
        cumulative = self.below + [self.n]
        return [cumulative[0]] + [b - a for a, b in zip(cumulative, cumulative[1:])]

    def result(self) -> dict[str, Any]:
        n = max(self.n, 1)
        return {
            "n": self.n,
            "zeros_excluded": self.zeros,
            "max_rel_err": self.max_rel,
            "mean_rel_err": self.sum_rel / n,
            "rms_rel_err": (self.sum_sq_rel / n) ** 0.5,
            "mean_signed_rel_err": self.sum_signed_rel / n,
            "max_ulp_err": self.max_ulp,
            "ulp_hist": self.ulp_histogram(),
            "saturated": self.saturated / n,
            "saturated_count": self.saturated,
            "flushed": self.flushed / n,
            "flushed_count": self.flushed,
        }


def error_stats(x: np.ndarray, decoded: np.ndarray, info: FormatInfo) -> dict[str, Any]:
    """Error statistics of ``decoded`` (values of a cast of the float32 inputs ``x``)."""
    stats = ErrorStats()
    stats.add(_Reference(np.asarray(x, np.float32), info), np.asarray(decoded, np.float64))
    return stats.result()


def cast_errors(xs: np.ndarray, info: FormatInfo, roundings: Sequence[str],
                threads: int) -> dict[str, dict[str, Any]]:
    """Casts the float32 array ``xs`` (already scaled) to ``info``'s format under each rounding
    (saturate=True) and returns each rounding's ErrorStats.result()."""
    codes = {r: _cast(xs, info, r, threads) for r in roundings}
    decode = _decoder(info)
    stats = {r: ErrorStats() for r in roundings}
    for start in range(0, xs.size, CHUNK):
        ref = _Reference(xs[start:start + CHUNK], info)
        for r in roundings:
            stats[r].add(ref, decode(codes[r][start:start + CHUNK]))
    return {r: s.result() for r, s in stats.items()}


def _decoder(info: FormatInfo) -> Callable[[np.ndarray], np.ndarray]:
    """codes -> float64 values of ``info``'s format, through lowbit.decode."""
    if info.bits <= 16:
        # Decoding every code once and indexing the table gives lowbit.decode's values at a
        # fraction of the cost of decoding each chunk again (per-call overhead dominates).
        table = lowbit.decode(np.arange(1 << info.bits, dtype=info.code_dtype), info.fmt,
                              "float64")
        return table.take
    return lambda codes: lowbit.decode(codes, info.fmt, "float64", threads=1)


def _cast(xs: np.ndarray, info: FormatInfo, rounding: str, threads: int) -> np.ndarray:
    stochastic = rounding == "stochastic"
    return lowbit.cast(xs, info.fmt, rounding=rounding, saturate=True,
                       random_bits=STOCHASTIC_RANDOM_BITS if stochastic else None,
                       seed=STOCHASTIC_SEED, threads=threads)


# ---- sections ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Point:
    """A point of the error-versus-speed plot: one technique/format on the gaussian workload."""

    label: str
    throughput: float  # M values/s
    error: float  # mean relative error; 0 is drawn on the axis floor, marked
    device: str = "CPU, 1 thread"  # where the throughput was measured


@dataclass(frozen=True)
class Plot:
    """A section's own figure: ``draw`` fills a matplotlib Figure, saved as ``filename``."""

    filename: str
    draw: Callable[[Any], None]
    size: tuple[float, float] = (10.0, 5.0)


@dataclass
class SectionResult:
    rows: list[dict[str, Any]]
    text: str
    points: list[Point] = field(default_factory=list)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Context:
    """What sections share: settings, workloads and the results of earlier sections."""

    workloads: list[Workload]
    formats: list[str]
    roundings: list[str]
    threads: int
    quick: bool
    results: dict[str, SectionResult] = field(default_factory=dict)
    progress: Callable[[str], None] = lambda message: None

    def workload(self, name: str) -> Workload:
        return next(w for w in self.workloads if w.name == name)


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[[Context], SectionResult]


# ---- table rendering ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[dict[str, Any]], str]
    left: bool = False


def render_table(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> list[str]:
    """Fixed-width lines: a header, a rule, one line per row."""
    cells = [[c.cell(row) for c in columns] for row in rows]
    widths = [max([len(c.header)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]

    def line(texts: Sequence[str]) -> str:
        return "  ".join(t.ljust(w) if c.left else t.rjust(w)
                         for c, w, t in zip(columns, widths, texts)).rstrip()

    return [line([c.header for c in columns]), line(["-" * w for w in widths])] + [
        line(r) for r in cells]


def _sci(v: float) -> str:
    return f"{v:.2e}" if v else "0"


def _percent(count: int, n: int) -> str:
    """A share as a percentage in at most 5 characters; "0" only when nothing is there."""
    if count == 0:
        return "0"
    p = 100.0 * count / n
    if p < 0.1:
        return "<0.1"
    return f"{p:.1f}" if p < 99.95 or count == n else ">99.9"


def _small_percent(share: float) -> str:
    """A possibly tiny share as a percentage with 3 significant digits."""
    return "0" if share == 0 else f"{100.0 * share:.3g}"


def _rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


# ---- section: per-tensor scaled casts ----------------------------------------------------------


def _casts_columns() -> list[Column]:
    def hist(i: int) -> Column:
        return Column(ULP_BINS[i], lambda r: _percent(r["ulp_hist"][i], r["n"]))

    return [
        Column("format", lambda r: r["format"] + ("*" if r["input"] == "|x|" else ""), left=True),
        Column("rounding", lambda r: r["rounding"], left=True),
        Column("max rel", lambda r: _sci(r["max_rel_err"])),
        Column("mean rel", lambda r: _sci(r["mean_rel_err"])),
        *[hist(i) for i in range(len(ULP_BINS))],
        Column("sat %", lambda r: _small_percent(r["saturated"])),
        Column("flush %", lambda r: _small_percent(r["flushed"])),
    ]


def casts_section(ctx: Context) -> SectionResult:
    """Every format and rounding mode on every workload, per-tensor scaled to the format's max."""
    rows: list[dict[str, Any]] = []
    lines: list[str] = []
    for w in ctx.workloads:
        started = time.perf_counter()
        block: list[dict[str, Any]] = []
        for name in ctx.formats:
            info = format_info(name)
            x = cast_input(w.values, info)
            scale = per_tensor_scale(x, info)
            xs = x * scale
            for rounding, stats in cast_errors(xs, info, ctx.roundings, ctx.threads).items():
                block.append({"workload": w.name, "format": name, "rounding": rounding,
                              "input": "x" if info.signed else "|x|", "scale": float(scale),
                              **stats})
        ctx.progress(f"  casts of the {w.name} workload measured in "
                     f"{time.perf_counter() - started:.1f} s")
        rows += block
        lines += ["", f"workload {w.name}: {w.description}, {w.values.size} float32 values, "
                      f"absmax {float(np.abs(w.values).max()):.6g}"]
        lines += render_table(_casts_columns(), block)
    notes = [
        "x is scaled by fl(max/absmax) (float32) and cast with saturate=True; errors are "
        "relative to the scaled float32 input, in float64, over its nonzero values",
        "ulp columns: % of values whose |error| / ulp(x) falls in each bin",
        f"stochastic: random_bits={STOCHASTIC_RANDOM_BITS}, seed={STOCHASTIC_SEED}",
        "* unsigned format (no sign bit): |x| is scaled and cast",
    ]
    header = [f"note: {n}" for n in notes]
    return SectionResult(rows=rows, text="\n".join(header + lines), notes=notes,
                         plots=[_rounding_plot(rows, ctx)])


def log_floor(values: Sequence[float]) -> float:
    """The bottom of a log axis for ``values``: the largest 1, 2 or 5 times a power of ten that
    is at least a factor 2 below the smallest positive value, so that every bar rises visibly
    from the axis and no bar starts below it (1e-3 when there is no positive value)."""
    positive = [v for v in values if v > 0 and np.isfinite(v)]
    if not positive:
        return 1e-3
    limit = min(positive) / 2
    decade = 10.0 ** np.floor(np.log10(limit))
    if decade > limit:  # log10 rounded up across a power of ten
        decade /= 10
    return float(max(m * decade for m in (1, 2, 5) if m * decade <= limit))


def _rounding_plot(rows: list[dict[str, Any]], ctx: Context) -> Plot:
    workload = "gaussian"
    formats = list(ctx.formats)
    roundings = list(ctx.roundings)
    err = {(r["format"], r["rounding"]): r["mean_rel_err"] for r in rows
           if r["workload"] == workload}

    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.set_yscale("log")
        floor = log_floor(list(err.values()))
        width = 0.8 / len(roundings)
        positions = np.arange(len(formats))
        for i, rounding in enumerate(roundings):
            xs = positions + (i - (len(roundings) - 1) / 2) * width
            values = np.array([err.get((f, rounding), np.nan) for f in formats], np.float64)
            # Bars start at the axis floor, not at 0 (which a log axis cannot show).
            heights = np.where(values > 0, values - floor, np.nan)
            ax.bar(xs, heights, width, bottom=floor, label=rounding, color=f"C{i}")
            # An error of exactly 0 has no bar: a "0" on the axis floor says so.
            for x in xs[values == 0]:
                ax.text(x, floor, "0", ha="center", va="bottom", fontsize="x-small",
                        color=f"C{i}", fontweight="bold")
        ax.set_ylim(bottom=floor)
        ax.set_xticks(positions, formats, rotation=45, ha="right")
        ax.set_ylabel("mean relative error (log scale; lower is better)")
        ax.set_title(f"Mean relative error per rounding mode: lower is better\n({workload} "
                     "workload, per-tensor scaled, saturate; a 0 on the axis marks an error of "
                     "exactly 0)", fontsize="medium")
        ax.legend(fontsize="small", ncols=min(len(roundings), 4))
        ax.grid(axis="y", which="both", alpha=0.3)

    return Plot("rounding_modes.png", draw, size=(max(8.0, 0.9 * len(formats) + 3), 5.0))


# ---- section: CPU cast throughput --------------------------------------------------------------


def median_time(fn: Callable[[], Any], runs: int = TIMING_RUNS) -> float:
    """Median wall time of ``runs`` calls of fn, after one warm-up call (seconds)."""
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _reference_type(name: str, ml_dtypes: Any) -> Any:
    """The numpy type of format ``name`` in ml_dtypes (numpy for float16), or None."""
    if name == "float16":
        return np.float16
    attr = ML_DTYPES_NAMES.get(name)
    if attr is None or ml_dtypes is None:
        return None
    return getattr(ml_dtypes, attr, None)


def _import_ml_dtypes() -> Any:
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes


def throughput_section(ctx: Context) -> SectionResult:
    """CPU cast throughput of lowbit (1 thread and ctx.threads) against ml_dtypes' astype and a
    plain copy, all on the gaussian workload and measured in this run."""
    ml_dtypes = _import_ml_dtypes()
    notes = []
    if ml_dtypes is None:
        notes.append("ml_dtypes is not installed: no comparison with it (pip install ml_dtypes)")
    gaussian = ctx.workload("gaussian").values
    n = gaussian.size

    def mvals(fn: Callable[[], Any]) -> float:
        return n / median_time(fn) / 1e6

    copy_target = np.empty_like(gaussian)
    copy_rate = mvals(lambda: np.copyto(copy_target, gaussian))
    threads_label = f"{ctx.threads}T" if ctx.threads else f"{os.cpu_count()}T (all)"
    rows = []
    for name in ctx.formats:
        info = format_info(name)
        x = cast_input(gaussian, info)
        xs = x * per_tensor_scale(x, info)
        one = mvals(lambda: lowbit.cast(xs, name, saturate=True, threads=1))
        many = mvals(lambda: lowbit.cast(xs, name, saturate=True, threads=ctx.threads))
        row: dict[str, Any] = {
            "format": name, "lowbit_1t": one, "lowbit_nt": many, "threads": ctx.threads,
            "copy": copy_rate, "vs_copy": one / copy_rate,
            "reference": None, "reference_rate": None, "ratio": None, "same_codes": None,
        }
        ref_type = _reference_type(name, ml_dtypes)
        if ref_type is not None:
            ref = mvals(lambda: xs.astype(ref_type))
            ours = lowbit.cast(xs, name, saturate=True, threads=1)
            theirs = xs.astype(ref_type).view(ours.dtype)
            row.update(reference=("numpy." if ref_type is np.float16 else "ml_dtypes.")
                       + np.dtype(ref_type).name, reference_rate=ref, ratio=one / ref,
                       same_codes=bool(np.array_equal(ours, theirs)))
        rows.append(row)
    points = _cast_points(rows, ctx)
    columns = [
        Column("format", lambda r: r["format"], left=True),
        Column("lowbit 1T", lambda r: _rate(r["lowbit_1t"])),
        Column(f"lowbit {threads_label}", lambda r: _rate(r["lowbit_nt"])),
        Column("reference", lambda r: r["reference"] or "-", left=True),
        Column("ref 1T", lambda r: _rate(r["reference_rate"])),
        Column("1T/ref", lambda r: _ratio(r["ratio"])),
        Column("1T/copy", lambda r: _ratio(r["vs_copy"])),
        Column("same codes", lambda r: {None: "-", True: "yes", False: "NO"}[r["same_codes"]]),
    ]
    notes += [
        f"M values/s, median of {TIMING_RUNS} runs after a warm-up; input: the gaussian workload "
        f"({n} float32) scaled per format as above; nearest_even, saturate=True",
        f"copy: np.copyto of the float32 input, {copy_rate:.1f} M values/s",
        "1T/ref: lowbit on 1 thread over the reference's astype (1 thread); same codes: both "
        "casts give identical codes",
    ]
    text = "\n".join([f"note: {note}" for note in notes] + [""] + render_table(columns, rows))
    return SectionResult(rows=rows, text=text, points=points, notes=notes)


def _cast_points(rows: list[dict[str, Any]], ctx: Context) -> list[Point]:
    """Error-versus-speed points: the casts section's mean error (gaussian, nearest_even)
    against the 1-thread throughput of ``rows``."""
    if "casts" not in ctx.results:
        return []
    errors = {r["format"]: r["mean_rel_err"] for r in ctx.results["casts"].rows
              if r["workload"] == "gaussian" and r["rounding"] == "nearest_even"}
    points = []
    for r in rows:
        if r["format"] in errors:
            unsigned = not format_info(r["format"]).signed
            points.append(Point(r["format"] + (" (|x|)" if unsigned else ""), r["lowbit_1t"],
                                errors[r["format"]]))
    return points


# ---- section: block-wise codebook quantization -------------------------------------------------

BLOCKWISE_BLOCKS = (256, 2048)
BLOCKWISE_CODEBOOK = "dynamic"
BLOCKWISE_ROUNDING = "nearest_toward_zero"  # the nearest entry, ties to the smaller magnitude


def blockwise_errors(x: np.ndarray, back: np.ndarray, absmax: np.ndarray,
                     block: int) -> dict[str, Any]:
    """Error statistics of a block-wise round trip: ``back`` (float32, dequantized) against the
    float32 input ``x``, relative to each value (over the nonzero ones) and to its block's
    absmax, in float64, chunk by chunk (CHUNK is a multiple of every block length)."""
    n = x.size
    a_all = np.asarray(absmax, np.float64)
    sums = {"rel": 0.0, "sq": 0.0, "signed": 0.0, "abs_a": 0.0}
    max_rel = max_abs_a = 0.0
    nonzero = flushed = 0
    for start in range(0, n, CHUNK):
        xs = x[start:start + CHUNK].astype(np.float64)
        d = back[start:start + CHUNK].astype(np.float64)
        a = np.repeat(a_all[start // block:(start + xs.size - 1) // block + 1], block)
        a = a[:xs.size]
        diff = d - xs
        with np.errstate(divide="ignore", invalid="ignore"):
            err_a = np.where(a > 0, np.abs(diff) / a, 0.0)
        sums["abs_a"] += float(err_a.sum())
        max_abs_a = max(max_abs_a, float(err_a.max(initial=0.0)))
        keep = xs != 0
        nonzero += int(np.count_nonzero(keep))
        flushed += int(np.count_nonzero(keep & (d == 0)))
        rel = diff[keep] / xs[keep]
        sums["signed"] += float(rel.sum())
        np.abs(rel, out=rel)
        sums["rel"] += float(rel.sum())
        max_rel = max(max_rel, float(rel.max(initial=0.0)))
        sums["sq"] += float(np.square(rel).sum())
    m = max(nonzero, 1)
    return {
        "n": nonzero,
        "zeros_excluded": n - nonzero,
        "max_rel_err": max_rel,
        "mean_rel_err": sums["rel"] / m,
        "rms_rel_err": (sums["sq"] / m) ** 0.5,
        "mean_signed_rel_err": sums["signed"] / m,
        "mean_err_over_absmax": sums["abs_a"] / max(n, 1),
        "max_err_over_absmax": max_abs_a,
        "flushed": flushed / m,
        "flushed_count": flushed,
    }


def blockwise_section(ctx: Context) -> SectionResult:
    """Block-wise quantization with the dynamic tree map (blocks of 256 and 2048, nearest entry)
    on every workload: round-trip error, and on the gaussian workload the CPU throughput of
    quantize and dequantize."""
    threads_label = f"{ctx.threads}T" if ctx.threads else f"{os.cpu_count()}T (all)"
    gaussian = ctx.workload("gaussian").values
    copy_target = np.empty_like(gaussian)
    copy_rate = gaussian.size / median_time(lambda: np.copyto(copy_target, gaussian)) / 1e6
    rows: list[dict[str, Any]] = []
    for w in ctx.workloads:
        for block in BLOCKWISE_BLOCKS:
            codes, absmax = lowbit.quantize_blockwise(w.values, BLOCKWISE_CODEBOOK, block,
                                                      rounding=BLOCKWISE_ROUNDING,
                                                      threads=ctx.threads)
            back = lowbit.dequantize_blockwise(codes, absmax, BLOCKWISE_CODEBOOK, block,
                                               threads=ctx.threads)
            row: dict[str, Any] = {
                "workload": w.name, "codebook": BLOCKWISE_CODEBOOK, "block": block,
                "rounding": BLOCKWISE_ROUNDING, "bits_per_value": 8 + 32 / block,
                **blockwise_errors(w.values, back, absmax, block),
                "quantize_1t": None, "quantize_nt": None, "dequantize_1t": None,
                "copy": None, "quantize_vs_copy": None, "dequantize_vs_copy": None,
                "threads": ctx.threads,
            }
            if w.name == "gaussian":
                x, cb, r = w.values, BLOCKWISE_CODEBOOK, BLOCKWISE_ROUNDING

                def rate(fn: Callable[[], Any]) -> float:
                    return x.size / median_time(fn) / 1e6

                row["quantize_1t"] = rate(lambda: lowbit.quantize_blockwise(
                    x, cb, block, rounding=r, threads=1))
                row["quantize_nt"] = rate(lambda: lowbit.quantize_blockwise(
                    x, cb, block, rounding=r, threads=ctx.threads))
                row["dequantize_1t"] = rate(lambda: lowbit.dequantize_blockwise(
                    codes, absmax, cb, block, threads=1))
                row.update(copy=copy_rate, quantize_vs_copy=row["quantize_1t"] / copy_rate,
                           dequantize_vs_copy=row["dequantize_1t"] / copy_rate)
            rows.append(row)
        ctx.progress(f"  block-wise quantization of the {w.name} workload measured")
    columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("block", lambda r: str(r["block"])),
        Column("bits/value", lambda r: f"{r['bits_per_value']:.3f}"),
        Column("max rel", lambda r: _sci(r["max_rel_err"])),
        Column("mean rel", lambda r: _sci(r["mean_rel_err"])),
        Column("rms rel", lambda r: _sci(r["rms_rel_err"])),
        Column("mean err/absmax", lambda r: _sci(r["mean_err_over_absmax"])),
        Column("flush %", lambda r: _small_percent(r["flushed"])),
        Column("quantize 1T", lambda r: _rate(r["quantize_1t"])),
        Column(f"quantize {threads_label}", lambda r: _rate(r["quantize_nt"])),
        Column("dequantize 1T", lambda r: _rate(r["dequantize_1t"])),
        Column("q 1T/copy", lambda r: _ratio(r["quantize_vs_copy"])),
        Column("dq 1T/copy", lambda r: _ratio(r["dequantize_vs_copy"])),
    ]
    notes = [
        f"lowbit.quantize_blockwise with the signed dynamic tree map, rounding="
        f"{BLOCKWISE_ROUNDING} (the nearest entry, ties to the smaller magnitude): codes (8 "
        "bits) and one float32 absmax per block; errors of the dequantized float32 values "
        "against the input, in float64, relative to each nonzero value and to its block's absmax",
        f"M values/s on the gaussian workload, median of {TIMING_RUNS} runs after a warm-up "
        "(quantize: codes and absmax; dequantize: float32 values)",
        f"copy: np.copyto of the gaussian float32 input, {copy_rate:.1f} M values/s; the /copy "
        "columns divide the one-thread rates by it",
    ]
    points = [Point(f"blockwise {r['block']} (dynamic)", r["quantize_1t"], r["mean_rel_err"])
              for r in rows if r["workload"] == "gaussian"]
    text = "\n".join([f"note: {note}" for note in notes] + [""] + render_table(columns, rows))
    return SectionResult(rows=rows, text=text, points=points, notes=notes)


# ---- section: low-precision linear layers ------------------------------------------------------


def linear_section(ctx: Context) -> SectionResult:
    """SwitchBack's linear layers (lowbit.nn) on the CPU: the forward output's and the input
    gradient's error against float64 matmuls, forward + backward time against nn.Linear, and the
    small-model training comparison (lowbit._tiny). Measures nothing without PyTorch."""
    from lowbit import _report_linear as rl

    try:
        import torch  # noqa: F401
    except ImportError:
        note = "skipped: PyTorch is not installed (pip install torch), which lowbit.nn needs"
        return SectionResult(rows=[], text=f"note: {note}", notes=[note])
    wls = [(w.name, w.values) for w in ctx.workloads
           if w.values.size >= rl.TOKENS * rl.FAN_IN]
    m = rl.measure(wls, ctx.threads, ctx.quick, ctx.progress)
    rows = [{"kind": "layer", **r} for r in m["rows"]]
    columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("layer", lambda r: r["layer"], left=True),
        Column("forward rel err", lambda r: _sci(r["forward_rel_err"])),
        Column("dX rel err", lambda r: _sci(r["dx_rel_err"])),
        Column("CPU ms", lambda r: "-" if r["cpu_ms"] is None else f"{r['cpu_ms']:.1f}"),
        Column("nn.Linear/this", lambda r: _ratio(r["vs_nn_linear"])),
    ]
    train = m["train"]
    base = train["nn_linear"]["final"]
    train_rows = [{"kind": "training", "config": k, "final_loss": v["final"],
                   "vs_nn_linear": v["final"] / base,
                   "s_per_step": v["s_per_step"]} for k, v in train.items()]
    train_columns = [
        Column("configuration", lambda r: r["config"], left=True),
        Column("final loss", lambda r: f"{r['final_loss']:.4f}"),
        Column("vs nn.Linear", lambda r: f"{r['vs_nn_linear']:.4f}"),
        Column("s/step", lambda r: f"{r['s_per_step']:.3f}"),
    ]
    notes = [
        f"layers {rl.FAN_IN} -> {rl.FAN_OUT} on {rl.TOKENS} tokens (the first "
        f"{rl.TOKENS * rl.FAN_IN} values of each workload), W Gaussian / sqrt({rl.FAN_IN}), "
        "G Gaussian: the relative Frobenius error of the output and of dX against float64 "
        "matmuls of the unquantized tensors; nn.Linear bf16 is the same layer in bfloat16",
        f"CPU ms: median forward + backward of float32 layers (the CPU twins), the "
        f"{wls[0][0]} row of each layer; nn.Linear float32 took {m['nn_linear_cpu_ms']:.1f} ms",
        f"training: lowbit._tiny's ViT ({rl.TRAIN_DEPTH} blocks, width {rl.TRAIN_WIDTH}) on its "
        f"synthetic images, {m['train_steps']} steps of batch {rl.TRAIN_BATCH} on the CPU in "
        f"float32 (AdamW, lr {rl.TRAIN_LR}); nn_linear is the model as it is; final loss = mean of "
        "the last 20 steps",
    ]

    def draw(fig: Any) -> None:
        from lowbit._tiny import draw_losses

        draw_losses(fig.add_subplot(1, 1, 1), train,
                    f"training comparison on the CPU ({m['train_steps']} steps)")

    text = "\n".join([f"note: {note}" for note in notes] + [""] + render_table(columns, rows)
                     + [""] + render_table(train_columns, train_rows))
    return SectionResult(rows=rows + train_rows, text=text, notes=notes,
                         plots=[Plot("linear_training.png", draw, (7.0, 4.0))])


SECTIONS: list[Section] = [
    Section("casts", "Per-tensor scaled casts: error of every format and rounding mode",
            casts_section),
    Section("throughput", "CPU cast throughput", throughput_section),
    Section("blockwise", "Block-wise codebook quantization (dynamic map): error and CPU "
            "throughput", blockwise_section),
    Section("linear", "Low-precision linear layers (SwitchBack): error, CPU time, training",
            linear_section),
]


# ---- driver ------------------------------------------------------------------------------------


@dataclass
class Options:
    out: Path = Path("out/report")
    quick: bool = False
    threads: int = 0
    size: int | None = None
    json: Path | None = None
    sections: Sequence[Section] | None = None  # None: SECTIONS as it is when the report runs


class OutputError(Exception):
    """The report's directory or JSON file cannot be written (found before measuring)."""


def _probe_directory(directory: Path, for_file: Path | None = None) -> None:
    """Creates ``directory`` (and its parents) and checks that a file can be made in it; the
    error names ``for_file`` when the directory is only where that file goes."""
    import tempfile

    def fail(reason: str) -> OutputError:
        if for_file is None:
            return OutputError(f"{directory}: {reason}")
        return OutputError(f"{for_file}: cannot write: {directory} {reason}")

    if directory.exists() and not directory.is_dir():
        raise fail("exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        reason = e.strerror or str(e)
        raise (fail(f"cannot write there: {reason}") if for_file is None
               else fail(f"cannot be written in: {reason}")) from e


def prepare_output(options: Options) -> Path:
    """Makes the output directory and checks that the plots and the JSON can be written, so
    that a bad path fails at once rather than after minutes of measuring; returns the JSON
    file's path."""
    _probe_directory(options.out)
    json_path = options.json or options.out / "report.json"
    if json_path.is_dir():
        raise OutputError(f"{json_path}: is a directory; name the JSON file (--json FILE)")
    if json_path.exists():
        # Rewriting a file needs its permission, not its directory's.
        try:
            with open(json_path, "ab"):  # opened for writing, left as it is
                pass
        except OSError as e:
            raise OutputError(f"{json_path}: cannot write: {e.strerror or e}") from e
    else:
        _probe_directory(json_path.parent, for_file=json_path)
    return json_path


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    processor = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), None)
    except OSError:
        model = None
    ml_dtypes = _import_ml_dtypes()
    return {
        "processor": processor,
        "cpu_model": model,
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "ml_dtypes": getattr(ml_dtypes, "__version__", None),
        "lowbit": lowbit.__version__,
    }


def _header(m: dict[str, Any], settings: dict[str, Any], date: str) -> str:
    load = " ".join(f"{v:.2f}" for v in m["load_average"]) if m["load_average"] else "?"
    cpu = m["cpu_model"] or m["processor"]
    return "\n".join([
        f"lowbit {m['lowbit']} report, {date}",
        f"machine: {cpu} ({m['processor']}), os.cpu_count() = {m['cpu_count']}, "
        f"load average {load}",
        f"software: {m['platform']}, Python {m['python']}, numpy {m['numpy']}, "
        f"ml_dtypes {m['ml_dtypes'] or 'not installed'}",
        f"settings: {settings['size']} values per workload, seed {settings['seed']}, "
        f"threads {settings['threads'] or 'all'}{', quick' if settings['quick'] else ''}",
    ])


def save_plots(plots: Sequence[Plot], out_dir: Path) -> list[Path]:
    """Draws each plot with matplotlib's Agg canvas (no pyplot, no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    for plot in plots:
        fig = Figure(figsize=plot.size, layout="constrained")
        FigureCanvasAgg(fig)
        plot.draw(fig)
        path = out_dir / plot.filename
        fig.savefig(path, dpi=110)
        paths.append(path)
    return paths


def speed_axis_label(points: Sequence[Point], cpu: str | None) -> str:
    """Where the throughputs were measured, e.g. "CPU, 1 thread (AMD EPYC 7B13)"."""
    devices = list(dict.fromkeys(p.device for p in points)) or ["CPU, 1 thread"]
    where = "; ".join(f"{d} ({cpu})" if cpu and d.startswith("CPU") else d for d in devices)
    return f"throughput, M values/s (log scale; higher is better)\nmeasured on: {where}"


def error_speed_plot(points: Sequence[Point], cpu: str | None = None) -> Plot:
    """Error versus throughput, one labelled point per technique/format; ``cpu`` names the
    processor of the CPU measurements."""
    def draw(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.set_xscale("log")
        ax.set_yscale("log")
        floor = log_floor([p.error for p in points])
        devices = list(dict.fromkeys(p.device for p in points))
        for i, device in enumerate(devices):
            mine = [p for p in points if p.device == device]
            nonzero = [p for p in mine if p.error > 0]
            ax.scatter([p.throughput for p in nonzero], [p.error for p in nonzero], zorder=2,
                       color=f"C{i}", label=device)
            # An error of exactly 0 sits on the axis floor as an open marker.
            zeros = [p for p in mine if p.error == 0]
            ax.scatter([p.throughput for p in zeros], [floor] * len(zeros), zorder=2,
                       marker="v", facecolors="none", edgecolors=f"C{i}", clip_on=False)
        ax.margins(x=0.15, y=0.1)
        ax.set_ylim(bottom=floor)
        ax.set_xlabel(speed_axis_label(points, cpu))
        ax.set_ylabel("mean relative error (log scale; lower is better)")
        ax.set_title("Error versus speed: lower right is better\n(gaussian workload; casts per-"
                     "tensor scaled, nearest_even; an open triangle on the axis: error 0)",
                     fontsize="medium")
        ax.grid(which="both", alpha=0.3)
        if len(devices) > 1:
            ax.legend(fontsize="small")
        _label_points(ax, points, floor)

    return Plot("error_vs_speed.png", draw, size=(8.0, 6.0))


def _boxes_overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _label_points(ax: Any, points: Sequence[Point], floor: float) -> None:
    """Labels each point at the first of a few offsets where the text overlaps no marker and no
    earlier label: formats with the same error and similar speed (e4m3fn, e4m3fnuz) sit close
    together, and fixed offsets would print their names on top of each other."""
    fig = ax.figure
    fig.canvas.draw()  # final axes position and limits
    to_points = 72.0 / fig.dpi
    ys = [p.error if p.error > 0 else floor for p in points]
    at = ax.transData.transform([(p.throughput, y) for p, y in zip(points, ys)]) * to_points
    char_width, height = 5.5, 9.0  # fontsize "small", in points
    taken = [(x - 4, y - 4, x + 4, y + 4) for x, y in at]
    (x0, y0), (x1, y1) = ax.get_window_extent().get_points() * to_points
    offsets = [(5, 3), (5, -11), (-5, 3), (-5, -11), (5, 13), (5, -21), (-5, 13), (-5, -21)]
    for p, y_data, (x, y) in zip(points, ys, at):
        text = p.label + (" (error 0)" if p.error == 0 else "")
        width = char_width * len(text)
        for dx, dy in offsets:
            left = x + dx if dx > 0 else x + dx - width
            box = (left, y + dy, left + width, y + dy + height)
            # Inside the axes (a label across the frame covers the axis labels), on nothing.
            inside = x0 <= box[0] and box[2] <= x1 and y0 <= box[1] and box[3] <= y1
            if inside and not any(_boxes_overlap(box, t) for t in taken):
                break
        else:
            dx, dy = offsets[0]
            left = x + dx
            box = (left, y + dy, left + width, y + dy + height)
        taken.append(box)
        ax.annotate(text, (p.throughput, y_data), textcoords="offset points",
                    xytext=(dx, dy), ha="left" if dx > 0 else "right", fontsize="small")


def run_report(options: Options, out: TextIO,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs every section, prints the table to ``out``, writes JSON and plots; returns the
    JSON document. Progress lines (what is being measured, with the time since the start) go
    to ``progress``, stderr by default. Raises OutputError before measuring anything when the
    output cannot be written."""
    started = time.perf_counter()
    json_path = prepare_output(options)
    if progress is None:
        def progress(message: str) -> None:
            print(f"report: {message}", file=sys.stderr, flush=True)

    def elapsed() -> str:
        return f"{time.perf_counter() - started:.1f} s"

    size = options.size or (QUICK_SIZE if options.quick else DEFAULT_SIZE)
    names = [f for f in lowbit.formats() if f != "float32"]
    roundings = lowbit.roundings()
    if options.quick:
        names = [f for f in names if f in QUICK_FORMATS]
        roundings = [r for r in roundings if r in QUICK_ROUNDINGS]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    m = machine()
    settings = {"size": size, "seed": SEED, "threads": options.threads, "quick": options.quick,
                "formats": names, "roundings": roundings, "saturate": True,
                "stochastic": {"random_bits": STOCHASTIC_RANDOM_BITS, "seed": STOCHASTIC_SEED},
                "timing_runs": TIMING_RUNS}
    progress(f"{len(names)} formats x {len(roundings)} roundings, 3 workloads of {size} values "
             f"(threads {options.threads or 'all'}); output in {options.out}")
    ctx = Context(workloads=make_workloads(size), formats=names, roundings=roundings,
                  threads=options.threads, quick=options.quick, progress=progress)
    sections = list(SECTIONS if options.sections is None else options.sections)
    out.write(_header(m, settings, date) + "\n")
    for i, section in enumerate(sections, 1):
        t0 = time.perf_counter()
        progress(f"[{i}/{len(sections)}] {section.title} ... (at {elapsed()})")
        result = section.run(ctx)
        ctx.results[section.name] = result
        progress(f"[{i}/{len(sections)}] {section.name} done in "
                 f"{time.perf_counter() - t0:.1f} s (at {elapsed()})")
        out.write(f"\n== {section.title} ==\n{result.text}\n")
        out.flush()

    points = [p for r in ctx.results.values() for p in r.points]
    plots = ([error_speed_plot(points, m["cpu_model"] or m["processor"])]
             + [p for r in ctx.results.values() for p in r.plots])
    progress(f"drawing {len(plots)} plots (at {elapsed()})")
    plot_files: list[str] = []
    try:
        plot_files = [str(p) for p in save_plots(plots, options.out)]
    except ImportError:
        out.write("\nmatplotlib is not installed: no plots (pip install matplotlib); the table "
                  "and the JSON are complete\n")
    doc = {
        "lowbit_version": lowbit.__version__,
        "date": date,
        "machine": m,
        "settings": settings,
        "workloads": {w.name: w.facts() for w in ctx.workloads},
        "sections": {s.name: {"title": s.title, "notes": ctx.results[s.name].notes,
                              "rows": ctx.results[s.name].rows} for s in sections},
        "points": [vars(p) for p in points],
        "plots": plot_files,
        "wall_s": time.perf_counter() - started,
    }
    json_path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    out.write(f"\nwrote {json_path}" + "".join(f", {p}" for p in plot_files)
              + f" in {doc['wall_s']:.1f} s\n")
    progress(f"done in {elapsed()}")
    return doc
