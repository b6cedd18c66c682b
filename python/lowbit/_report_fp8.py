"""The report's section on fp8 training (docs/techniques/fp8-training.md), on the CPU: how far
each accumulation model's sum of e4m3fn x e4m3fn products is from the exact sum (float32
sequential, Hopper's slow and fast accumulation) on gaussian, many-binade and exactly cancelling
rows; the CPU speed of lowbit.scaled_matmul under each model; and lowbit.nn.Float8Linear's
forward + backward under each fp8 recipe against float64 matmuls, with its CPU time. The
first two parts need numpy alone; the Float8Linear part needs PyTorch and is left out, with a
note, without it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import lowbit
from lowbit.report import median_time

FMT = "e4m3fn"
SEED = 20241204
WORKLOADS = ("gaussian", "spread", "cancellation")
KS, ROWS = (32, 256, 1024, 4096), 64  # each (workload, K): ROWS x ROWS dot products of length K
QUICK_KS, QUICK_ROWS = (32, 256, 1024), 32
SPREAD_BINADES = 16  # the spread workload's |x| = 2^U(-16, 0) before per-tensor scaling
SPEED_SHAPE = (64, 64, 1024)  # M, N, K of the timed scaled_matmul
TOKENS, FAN_IN, FAN_OUT = 256, 128, 128
U = 2.0 ** -24  # float32's unit roundoff


def models() -> dict[str, lowbit.Accumulation]:
    """The accumulation models the section compares, by the name its rows carry."""
    return {"fp32": lowbit.Accumulation.fp32(),
            "hopper_slow": lowbit.Accumulation.hopper(),
            "hopper_fast": lowbit.Accumulation.hopper(fast=True)}


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): |fl(sum) - sum| <= gamma_{K-1} sum |p_i| for a float32
    sequential sum of K exact products (Higham, Accuracy and Stability, section 4.2)."""
    return n * U / (1 - n * U)


# ---- accumulation models against the exact sum ------------------------------------------------


def operands(workload: str, rows: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """A (rows x k) and B (rows x k) as e4m3fn codes, each quantized per tensor (amax to 448,
    lowbit.quantize): "gaussian" N(0, 1) values; "spread" random signs times 2^U(-16, 0), so that
    the products span about 30 binades; "cancellation" N(0, 1) first halves, with A's second half
    the negated first half (the sign bit flipped, exact) and B's second half equal to its first,
    so that every product of the second half cancels one of the first and each exact sum is 0."""
    def codes(shape: tuple[int, int], spread: bool = False) -> np.ndarray:
        if spread:
            x = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-SPREAD_BINADES, 0, shape))
        else:
            x = rng.standard_normal(shape)
        c, _ = lowbit.quantize(x.astype(np.float32), FMT)
        return np.ascontiguousarray(c)

    if workload == "cancellation":
        if k % 2:
            raise ValueError(f"cancellation needs an even K, got {k}")
        a, b = codes((rows, k // 2)), codes((rows, k // 2))
        return (np.ascontiguousarray(np.concatenate([a, a ^ np.uint8(0x80)], axis=1)),
                np.ascontiguousarray(np.concatenate([b, b], axis=1)))
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: expected one of {', '.join(WORKLOADS)}")
    spread = workload == "spread"
    return codes((rows, k), spread), codes((rows, k), spread)


def dots(a: np.ndarray, b: np.ndarray, model: lowbit.Accumulation, threads: int = 0) -> np.ndarray:
    """A B^T under ``model`` (no scales, so the float32 result is the model's sum itself)."""
    return lowbit.scaled_matmul(a, b, a_fmt=FMT, b_fmt=FMT, accumulation=model, threads=threads)


def exact_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact A B^T and sum |a_i b_i| of e4m3fn codes, float64.

    Why integer arithmetic gives them exactly: an e4m3fn value is m * 2^(e - 3) with an integer
    0 <= m < 16 and -6 <= e <= 8, so it is an integer multiple of 2^-9 of magnitude at most 448
    (below 2^18 units of 2^-9). In those units A and B are int64 matrices, a product is an
    integer below 2^36 (in units of 2^-18) and the int64 matmul sums them exactly (K up to 2^27
    would fit). The sum is an integer of magnitude at most K max|a| max|b| units of 2^-18: below
    2^53 (K max|a| max|b| < 2^35, K up to 2^17 here) it converts to float64 exactly, and the
    scaling by 2^-18 is exact. Both premises are checked on the decoded operands first.
    """
    units = []
    for codes in (a, b):
        u = np.ldexp(lowbit.decode(codes, FMT, dtype="float64"), 9)
        if not np.array_equal(u, np.rint(u)):
            raise AssertionError("an e4m3fn value that is not a multiple of 2^-9")
        units.append(u.astype(np.int64))
    ia, ib = units
    k = a.shape[1]
    top = k * int(np.abs(ia).max(initial=0)) * int(np.abs(ib).max(initial=0))
    if top >= 2 ** 53:
        raise AssertionError(f"K = {k}: the exact sums may need more than float64's 53 bits")
    exact = np.ldexp((ia @ ib.T).astype(np.float64), -18)
    scale = np.ldexp((np.abs(ia) @ np.abs(ib).T).astype(np.float64), -18)
    return exact, scale


def accumulation_rows(ks: Sequence[int], rows: int, threads: int = 0,
                      workloads: Sequence[str] = WORKLOADS) -> list[dict[str, Any]]:
    """A row per (workload, K, model): the errors of rows x rows dot products of length K."""
    out = []
    for workload in workloads:
        for k in ks:
            rng = np.random.default_rng([SEED, WORKLOADS.index(workload), k])
            a, b = operands(workload, rows, k, rng)
            exact, scale = exact_sums(a, b)
            rounded = exact.astype(np.float32)  # the exact sum rounded once, nearest-even
            for name, model in models().items():
                y = dots(a, b, model, threads)
                err = np.abs(y.astype(np.float64) - exact)
                rel = np.divide(err, scale, out=np.zeros_like(err), where=scale > 0)
                out.append({"kind": "accumulation", "workload": workload, "k": k,
                            "model": name, "spec": str(model), "outputs": int(y.size),
                            "mean_rel_err": float(rel.mean()), "max_rel_err": float(rel.max()),
                            "gamma": gamma(k - 1),
                            "max_over_gamma": float(rel.max()) / gamma(k - 1) if k > 1 else 0.0,
                            "differ_fraction": float(np.mean(y != rounded)),
                            "exact_zero": bool(np.all(exact == 0))})
    return out


# ---- CPU speed of scaled_matmul under each model ----------------------------------------------


def speed_rows(runs: int, threads: int = 0) -> list[dict[str, Any]]:
    """Median CPU time of one scaled_matmul at SPEED_SHAPE per model, as products per second."""
    m, n, k = SPEED_SHAPE
    rng = np.random.default_rng([SEED, 99])
    a, b = operands("gaussian", m, k, rng)[0], operands("gaussian", n, k, rng)[0]
    out = []
    for name, model in models().items():
        s = median_time(lambda: dots(a, b, model, threads), runs)
        out.append({"kind": "speed", "model": name, "m": m, "n": n, "k": k, "cpu_ms": 1e3 * s,
                    "products_per_s": m * n * k / s})
    for row in out:
        row["vs_fp32"] = row["products_per_s"] / out[0]["products_per_s"]
    return out


# ---- Float8Linear -----------------------------------------------------------------------------


def recipes() -> dict[str, Any]:
    """The named fp8 recipes of lowbit.nn, and hopper_emulated under fast accumulation."""
    import lowbit.nn as lnn

    named = lnn.named_recipes()
    out = {name: named[name] for name in ("fp8_tensorwise", "fp8_tensorwise_delayed",
                                          "fp8_rowwise", "fp8_blockwise_1x128", "mxfp8",
                                          "hopper_emulated")}
    out["hopper_emulated_fast"] = lnn.hopper_recipe(lnn.HOPPER_FAST, name="hopper_emulated_fast")
    return out


def float8_rows(runs: int) -> tuple[list[dict[str, Any]], float]:
    """A row per recipe: the relative errors of Y, dX and dW of one Float8Linear step (after a
    warm-up step that fills delayed scaling's amax history) against float64 matmuls of the same
    float32 tensors, the Hopper recipes' difference from the same codes summed in float32, and
    the median CPU time of forward + backward; and nn.Linear's (float32) time."""
    import torch
    from torch import nn

    import lowbit.nn as lnn

    g = torch.Generator().manual_seed(SEED)
    base = nn.Linear(FAN_IN, FAN_OUT)
    with torch.no_grad():
        base.weight.copy_((torch.rand(FAN_OUT, FAN_IN, generator=g) * 2 - 1) / FAN_IN ** 0.5)
        base.bias.copy_((torch.rand(FAN_OUT, generator=g) * 2 - 1) / FAN_IN ** 0.5)
    x0, x1 = (torch.randn(TOKENS, FAN_IN, generator=g) for _ in range(2))
    g0, g1 = (torch.randn(TOKENS, FAN_OUT, generator=g) for _ in range(2))
    w64, x64, g64 = base.weight.detach().double(), x1.double(), g1.double()
    ref = {"y": x64 @ w64.T + base.bias.detach().double(), "dx": g64 @ w64, "dw": g64.T @ x64}

    def rel(a: Any, b: Any) -> float:
        return float((a.double() - b).norm() / b.norm())

    def step(layer: nn.Module, x: Any, grad: Any) -> dict[str, Any]:
        layer.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        y.backward(grad)
        return {"y": y.detach(), "dx": xi.grad, "dw": layer.weight.grad.clone()}

    out, got = [], {}
    for name, recipe in recipes().items():
        layer = lnn.Float8Linear(FAN_IN, FAN_OUT, recipe=recipe)
        with torch.no_grad():
            layer.weight.copy_(base.weight)
            layer.bias.copy_(base.bias)
        step(layer, x0, g0)  # warm-up: delayed scaling's first step scales by 1
        got[name] = step(layer, x1, g1)
        row = {"kind": "float8_linear", "recipe": name, "tokens": TOKENS, "in": FAN_IN,
               "out": FAN_OUT, "accumulation": str(recipe.accumulation or "backend")}
        for t in ("y", "dx", "dw"):
            row[f"{t}_rel_err"] = rel(got[name][t], ref[t])
        # Same recipe, same codes and scales, only the sum differs: the accumulation's share.
        for t in ("y", "dx", "dw"):
            row[f"{t}_vs_fp32_sum"] = (rel(got[name][t], got["fp8_tensorwise_delayed"][t].double())
                                       if name.startswith("hopper") else None)
        row["cpu_ms"] = 1e3 * median_time(lambda: step(layer, x1, g1), runs)
        out.append(row)
    base_ms = 1e3 * median_time(lambda: step(base, x1, g1), runs)
    for row in out:
        row["vs_nn_linear"] = base_ms / row["cpu_ms"]
    return out, base_ms


# ---- the section ------------------------------------------------------------------------------


def section(ctx: Any) -> Any:
    from lowbit.report import Column, Plot, SectionResult, _ratio, _sci, log_floor, render_table

    quick = ctx.quick
    threads = ctx.threads or 0
    ks, rows = (QUICK_KS, QUICK_ROWS) if quick else (KS, ROWS)
    acc = accumulation_rows(ks, rows, threads)
    ctx.progress("  fp8 accumulation models measured against the exact sums")
    speed = speed_rows(3 if quick else 7, threads)
    ctx.progress("  fp8 scaled_matmul timed under each accumulation model")
    try:
        import torch
    except ImportError:
        torch = None
    linear: list[dict[str, Any]] = []
    base_ms = None
    if torch is not None:
        if ctx.threads:
            torch.set_num_threads(ctx.threads)
        linear, base_ms = float8_rows(3 if quick else 7)
        ctx.progress("  Float8Linear measured under each fp8 recipe")

    acc_columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("K", lambda r: str(r["k"])),
        Column("model", lambda r: r["model"], left=True),
        Column("mean |err|/sum|ab|", lambda r: _sci(r["mean_rel_err"])),
        Column("max |err|/sum|ab|", lambda r: _sci(r["max_rel_err"])),
        Column("max / gamma", lambda r: _sci(r["max_over_gamma"])),
        Column("!= fl32(exact)", lambda r: f"{100 * r['differ_fraction']:.1f}%"),
    ]
    speed_columns = [
        Column("model", lambda r: r["model"], left=True),
        Column("M x N x K", lambda r: f"{r['m']} x {r['n']} x {r['k']}"),
        Column("CPU ms", lambda r: f"{r['cpu_ms']:.2f}"),
        Column("M products/s", lambda r: f"{r['products_per_s'] / 1e6:.0f}"),
        Column("speed vs fp32", lambda r: _ratio(r["vs_fp32"])),
    ]

    def vs(key: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: "-" if r[key] is None else _sci(r[key])

    linear_columns = [
        Column("recipe", lambda r: r["recipe"], left=True),
        Column("Y rel err", lambda r: _sci(r["y_rel_err"])),
        Column("dX rel err", lambda r: _sci(r["dx_rel_err"])),
        Column("dW rel err", lambda r: _sci(r["dw_rel_err"])),
        Column("Y vs fp32 sum", vs("y_vs_fp32_sum")),
        Column("dX vs fp32 sum", vs("dx_vs_fp32_sum")),
        Column("dW vs fp32 sum", vs("dw_vs_fp32_sum")),
        Column("CPU ms", lambda r: f"{r['cpu_ms']:.1f}"),
        Column("time / nn.Linear's", lambda r: f"{1 / r['vs_nn_linear']:.1f}"),
    ]

    def mean_err(workload: str, k: int, model: str) -> float:
        return next(r["mean_rel_err"] for r in acc
                    if (r["workload"], r["k"], r["model"]) == (workload, k, model))

    def fast_over_slow(workload: str) -> str:
        parts = []
        for k in ks:
            slow, fast = mean_err(workload, k, "hopper_slow"), mean_err(workload, k, "hopper_fast")
            parts.append(f"{fast / slow:.2f}" if slow else "- (slow 0)" if fast else "- (both 0)")
        return f"{workload} " + ", ".join(parts)

    notes = [
        f"accumulation: per workload and K, {rows} x {rows} dot products of e4m3fn x e4m3fn "
        f"rows (lowbit.quantize per tensor; gaussian N(0,1); spread random signs times "
        f"2^U(-{SPREAD_BINADES},0); cancellation N(0,1) with A's second half the negated first "
        "half and B's second half equal to its first, so every exact sum is 0), summed by "
        "lowbit.scaled_matmul under "
        "each model (fp32 = Accumulation.fp32(), hopper_slow = Accumulation.hopper(), "
        "hopper_fast = Accumulation.hopper(fast=True)) against the exact sum (in int64 units of "
        "2^-18: e4m3fn values are multiples of 2^-9 below 2^9, so the products are integers "
        "below 2^36 and the sums fit float64's 53 bits); |err| / sum|ab| per output (on "
        "cancellation that is |out| / sum|ab|); gamma = gamma_{K-1} with u = 2^-24, which "
        "bounds fp32's error; != fl32(exact): the outputs that differ from the exact sum "
        "rounded once to float32",
        "hopper_fast / hopper_slow mean error at K = " + ", ".join(map(str, ks)) + ": "
        + "; ".join(fast_over_slow(w) for w in WORKLOADS)
        + " (the two are the same model up to K = 128, where slow mode's first promotion is "
        "its last)",
        f"speed: median CPU time of one lowbit.scaled_matmul of e4m3fn codes (threads "
        f"{threads or 'all'}), {3 if quick else 7} runs after a warm-up",
    ]
    if torch is None:
        notes.append("Float8Linear: skipped: PyTorch is not installed (pip install torch), which "
                     "lowbit.nn needs")
    else:
        notes.append(
            f"Float8Linear: {TOKENS} tokens, {FAN_IN} -> {FAN_OUT}, float32 on the CPU, one "
            "forward + backward after a warm-up step on other data (delayed scaling's amax "
            "history then holds that step's amaxes); rel err = relative Frobenius error of Y, "
            "dX and dW against float64 matmuls of the same float32 X, W and G; vs fp32 sum: the "
            "Hopper recipes' relative difference from fp8_tensorwise_delayed (the same codes "
            "and scales summed in float32 by the CPU twin); CPU ms: median forward + backward; "
            f"time / nn.Linear's: over float32 nn.Linear's ({base_ms:.2f} ms)")

    def draw(fig: Any) -> None:
        # One error axis for the three panels, its bottom at report.log_floor (as the report's
        # other error axes): an error of exactly 0 is an open triangle on that floor.
        floor = log_floor([r["mean_rel_err"] for r in acc])
        first = None
        for i, workload in enumerate(WORKLOADS):
            ax = fig.add_subplot(1, len(WORKLOADS), i + 1, sharey=first)
            first = first or ax
            for j, name in enumerate(models()):
                mine = [(r["k"], r["mean_rel_err"]) for r in acc
                        if r["workload"] == workload and r["model"] == name]
                nonzero = [(k, e) for k, e in mine if e > 0]
                if nonzero:
                    ax.plot(*zip(*nonzero), marker="o", color=f"C{j}", label=name)
                zeros = [k for k, e in mine if e == 0]
                ax.scatter(zeros, [floor] * len(zeros), marker="v", facecolors="none",
                           edgecolors=f"C{j}", clip_on=False, zorder=3,
                           label=None if nonzero or i else name)
            ax.plot(ks, [gamma(k - 1) for k in ks], color="gray", linestyle="--",
                    label="gamma_{K-1} (fp32's bound on the max)")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor)
            ax.set_xlabel("K (products per dot product)")
            ax.set_title(workload, fontsize="medium")
            ax.grid(which="both", alpha=0.3)
            if i == 0:
                ax.set_ylabel("mean |err| / sum|ab| (log scale; lower is better)")
                ax.legend(fontsize="small")
        fig.suptitle("fp8 accumulation models against the exact sum: lower is better\n(e4m3fn x "
                     "e4m3fn dot products of length K, CPU; an open triangle on the axis: error 0)",
                     fontsize="medium")

    lines = [f"note: {n}" for n in notes] + [""] + render_table(acc_columns, acc) + [""] + \
        render_table(speed_columns, speed)
    if linear:
        lines += [""] + render_table(linear_columns, linear)
    return SectionResult(rows=acc + speed + linear, text="\n".join(lines), notes=notes,
                         plots=[Plot("fp8_accumulation.png", draw, (12.0, 4.0))])
