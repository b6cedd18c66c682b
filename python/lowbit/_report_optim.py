"""The report's section on the optimizers (lowbit.optim, docs/techniques/optimizers.md), on the
CPU: the error of AdamW8bit and StableAdamW8bit against their 32-bit twins after a few steps on
gradients drawn from the workloads (parameters, each dequantized state, the update), the state
bytes per parameter read from the state tensors, lowbit's 32-bit AdamW against torch.optim.AdamW
in ulps per step, the CPU time of one step over a model of about 1 M parameters, and (unless left
out) a short training comparison on a small MLP. Needs PyTorch: without it the section says so
and measures nothing.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from typing import Any

import numpy as np

# The section's own seed. Not report.SEED: default_rng([report.SEED, index]) drew the workloads,
# and the same generator would draw initial parameters equal to a workload's values, the values
# the gradients are drawn from.
SEED = 20241205
# Parameter shapes of the state-error rows: 8-bit states need two or more dimensions with rows
# of whole blocks (256) and at least 4096 elements, so the 1-D shapes keep 32-bit states.
SHAPES = [(256, 256), (40, 768), (4096,), (1000,)]
STEPS = 10
GRAD_SCALE = 1e-3  # gradients: the workloads' values times this
PARAM_STD = 0.02  # initial parameters: N(0, PARAM_STD^2)
# (8-bit optimizer, its 32-bit twin): lowbit.optim class names, each with its defaults.
PAIRS = [("AdamW8bit", "AdamW"), ("StableAdamW8bit", "StableAdamW")]
TWINS = dict(PAIRS)
STATES = ("exp_avg", "exp_avg_sq")
# The step-time model: two weights of rows of 3 blocks and their biases, 0.98 M parameters.
TIMING_SHAPES = [(1024, 768), (256, 768), (1024,), (768,)]
# The training comparison: an MLP 256-256-256-16 regressing a random tanh teacher.
TRAIN_STEPS, TRAIN_BATCH, TRAIN_LR = 200, 64, 1e-3
TRAIN_CONFIGS = ["torch.optim.AdamW", "AdamW", "AdamW8bit", "StableAdamW", "StableAdamW8bit"]


def _rel(a: Any, b: Any) -> float:
    """Relative Frobenius error of a against b, in float64 (0 where both are 0)."""
    a, b = a.detach().double(), b.detach().double()
    den = float(b.norm())
    num = float((a - b).norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _state_bytes(opt: Any, params: list[Any]) -> float:
    """Bytes of the optimizer's state tensors (codes, absmax, float states) per parameter; the
    step count (a tensor in torch.optim) is left out."""
    import torch

    held = sum(t.numel() * t.element_size() for p in params for k, t in opt.state[p].items()
               if isinstance(t, torch.Tensor) and k != "step")
    return held / sum(p.numel() for p in params)


def _run(cls: Any, p0: Any, grads: list[Any]) -> tuple[Any, Any]:
    """A parameter of p0's values stepped by a fresh optimizer of class cls on grads."""
    import torch

    p = torch.nn.Parameter(p0.clone())
    opt = cls([p])
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p, opt


def _ulp_of(x: Any) -> Any:
    import torch

    x = x.abs()
    return torch.where(x > 0, torch.nextafter(x, torch.tensor(math.inf)) - x,
                       torch.tensor(2.0 ** -149))


def _vs_torch(p0: Any, grads: list[Any]) -> dict[str, float]:
    """lowbit's AdamW (32-bit) against torch.optim.AdamW (foreach=False), each step from
    identical values (torch's): the parameters' largest difference in ulps of the largest of old
    value, new value and update (the update times (b1 |m| + (1 - b1) |g|) / |b1 m + (1 - b1) g|,
    the cancellation the first moment passes on), the states' in units of 2^-24 times the
    recurrence evaluated on absolute values (docs/techniques/optimizers.md's measures), and the
    relative error of the parameters after all steps without that reset."""
    import torch

    import lowbit.optim as lo

    pl, pt = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
    ol = lo.AdamW([pl])
    ot = torch.optim.AdamW([pt], lr=ol.defaults["lr"], betas=ol.defaults["betas"],
                           eps=ol.defaults["eps"], weight_decay=ol.defaults["weight_decay"],
                           foreach=False)
    b1, b2 = ol.defaults["betas"]
    worst_p = worst_s = 0.0
    for g in grads:
        pl.grad, pt.grad = g.clone(), g.clone()
        old = pt.detach().clone()
        olds = {n: ot.state[pt][n].clone() if n in ot.state[pt] else torch.zeros_like(old)
                for n in STATES}
        ol.step()
        ot.step()
        new = pt.detach()
        ga = g.double().abs()
        mags = {"exp_avg": b1 * olds["exp_avg"].double().abs() + (1 - b1) * ga,
                "exp_avg_sq": b2 * olds["exp_avg_sq"].double() + (1 - b2) * ga * ga}
        # Where b1 m + (1 - b1) g cancels, the update carries the rounding errors of its
        # operands' magnitude: the update is scaled by that magnitude over |m|.
        m = ot.state[pt]["exp_avg"].double().abs()
        cancel = (mags["exp_avg"] / m.clamp_min(1e-300)).clamp_min(1.0).float()
        scale = torch.maximum(torch.maximum(old.abs(), new.abs()), (new - old).abs() * cancel)
        worst_p = max(worst_p, float(((pl.detach() - new).abs() / _ulp_of(scale)).max()))
        for n in STATES:
            d = (ol.state[pl][n].double() - ot.state[pt][n].double()).abs()
            worst_s = max(worst_s, float((d / (mags[n] * 2.0 ** -24 + 2.0 ** -149)).max()))
        with torch.no_grad():
            pl.copy_(pt)
        for n in STATES:
            ol.state[pl][n].copy_(ot.state[pt][n])
    free_l, _ = _run(lo.AdamW, p0, grads)
    pt = torch.nn.Parameter(p0.clone())
    ot = torch.optim.AdamW([pt], lr=ol.defaults["lr"], betas=ol.defaults["betas"],
                           eps=ol.defaults["eps"], weight_decay=ol.defaults["weight_decay"],
                           foreach=False)
    for g in grads:
        pt.grad = g.clone()
        ot.step()
    return {"max_param_ulps": worst_p, "max_state_units": worst_s,
            "param_rel_err": _rel(free_l, pt)}


def _state_error_rows(workloads: list[tuple[str, np.ndarray]]) -> list[dict[str, Any]]:
    import torch

    import lowbit.optim as lo

    rows: list[dict[str, Any]] = []
    for index, (name, values) in enumerate(workloads):
        v = np.asarray(values, dtype=np.float32)
        v = v[np.isfinite(v)]
        rng = np.random.default_rng([SEED, index])
        for shape in SHAPES:
            n = math.prod(shape)
            p0 = torch.from_numpy(rng.standard_normal(n, dtype=np.float32) *
                                  np.float32(PARAM_STD)).reshape(shape)
            # Each step a fresh draw (with replacement) of the workload's values.
            grads = [torch.from_numpy(v[rng.integers(0, v.size, n)] * np.float32(GRAD_SCALE))
                     .reshape(shape) for _ in range(STEPS)]
            for eight, twin in PAIRS:
                p8, o8 = _run(getattr(lo, eight), p0, grads)
                p32, o32 = _run(getattr(lo, twin), p0, grads)
                row = {"kind": "state_error", "workload": name, "shape": list(shape),
                       "optimizer": eight, "twin": twin, "steps": STEPS,
                       "state_bits": 8 if o8.state[p8]["exp_avg"].dtype == torch.uint8 else 32,
                       "param_rel_err": _rel(p8, p32),
                       "update_rel_err": _rel(p8 - p0, p32 - p0),
                       "bytes_per_param": _state_bytes(o8, [p8]),
                       "twin_bytes_per_param": _state_bytes(o32, [p32])}
                for s in STATES:
                    row[f"{s}_rel_err"] = _rel(o8.state_float(p8, s), o32.state_float(p32, s))
                rows.append(row)
            rows.append({"kind": "vs_torch", "workload": name, "shape": list(shape),
                         "optimizer": "AdamW", "twin": "torch.optim.AdamW", "steps": STEPS,
                         **_vs_torch(p0, grads)})
    return rows


def _make(label: str, params: list[Any], **kw: Any) -> Any:
    """The optimizer called ``label``: torch.optim.AdamW (torch's default implementation) or a
    lowbit.optim class, with lowbit's AdamW defaults for torch's."""
    import torch

    import lowbit.optim as lo

    if label == "torch.optim.AdamW":
        return torch.optim.AdamW(params, lr=kw.get("lr", 1e-3), weight_decay=1e-2)
    return getattr(lo, label)(params, **kw)


def _timing_rows(quick: bool) -> list[dict[str, Any]]:
    import torch

    g = torch.Generator().manual_seed(SEED)
    params0 = [torch.randn(s, generator=g) * PARAM_STD for s in TIMING_SHAPES]
    grads = [torch.randn(s, generator=g) * GRAD_SCALE for s in TIMING_SHAPES]
    count = sum(p.numel() for p in params0)
    runs = 3 if quick else 7
    rows = []
    for label in TRAIN_CONFIGS:
        params = [torch.nn.Parameter(p.clone()) for p in params0]
        for p, gr in zip(params, grads):
            p.grad = gr  # the steps read the gradients and leave them as they are
        opt = _make(label, params)
        opt.step()  # warm-up: makes the states
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        rows.append({"kind": "step_time", "optimizer": label, "params": count,
                     "ms_per_step": 1e3 * sec, "mparams_per_s": count / sec / 1e6,
                     "bytes_per_param": _state_bytes(opt, params)})
    base = rows[0]["ms_per_step"]
    for r in rows:
        r["vs_torch"] = base / r["ms_per_step"]
    return rows


def train_runs(steps: int, configs: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """An MLP 256-256-256-16 (GELU) regressing a random tanh teacher (256-64-16) with MSE, from
    the same start on the same batches for every optimizer of ``configs`` (TRAIN_CONFIGS), lr
    TRAIN_LR and each optimizer's other defaults; returns {name: {"losses", "final" (mean of
    the last 20 steps), "s_per_step", "bytes_per_param", "eight_bit_share"}}. The three weights
    ([256, 256] twice, [16, 256]) get 8-bit states with the 8-bit optimizers, the biases 32-bit
    ones."""
    import torch
    from torch import nn

    torch.manual_seed(SEED)
    base = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 16))
    teacher = nn.Sequential(nn.Linear(256, 64), nn.Tanh(), nn.Linear(64, 16))
    g = torch.Generator().manual_seed(SEED + 1)
    xs = torch.randn(steps, TRAIN_BATCH, 256, generator=g)
    with torch.no_grad():
        ys = teacher(xs)
    out = {}
    for label in configs or TRAIN_CONFIGS:
        model = copy.deepcopy(base)
        params = list(model.parameters())
        opt = _make(label, params, lr=TRAIN_LR)
        losses = []
        t0 = time.perf_counter()
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model(xs[i]), ys[i])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        dt = (time.perf_counter() - t0) / steps
        eight = sum(p.numel() for p in params
                    if any(isinstance(t, torch.Tensor) and t.dtype == torch.uint8
                           for t in opt.state[p].values()))
        tail = losses[-20:]
        out[label] = {"losses": losses, "final": sum(tail) / len(tail), "s_per_step": dt,
                      "bytes_per_param": _state_bytes(opt, params),
                      "eight_bit_share": eight / sum(p.numel() for p in params)}
    return out


def section(ctx: Any) -> Any:
    from lowbit.report import Column, Plot, SectionResult, _ratio, _sci, render_table

    try:
        import torch
    except ImportError:
        note = "skipped: PyTorch is not installed (pip install torch), which lowbit.optim needs"
        return SectionResult(rows=[], text=f"note: {note}", notes=[note])
    if ctx.threads:
        torch.set_num_threads(ctx.threads)
    se = _state_error_rows([(w.name, w.values) for w in ctx.workloads])
    err_rows = [r for r in se if r["kind"] == "state_error"]
    torch_rows = [r for r in se if r["kind"] == "vs_torch"]
    ctx.progress("  optimizer state errors measured")
    timing = _timing_rows(ctx.quick)
    ctx.progress("  optimizer step times measured")

    def shape(r: dict[str, Any]) -> str:
        return "x".join(str(d) for d in r["shape"])

    err_columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("shape", shape, left=True),
        Column("optimizer", lambda r: r["optimizer"], left=True),
        Column("states", lambda r: f"{r['state_bits']}-bit"),
        Column("param rel err", lambda r: _sci(r["param_rel_err"])),
        Column("update rel err", lambda r: _sci(r["update_rel_err"])),
        Column("exp_avg rel err", lambda r: _sci(r["exp_avg_rel_err"])),
        Column("exp_avg_sq rel err", lambda r: _sci(r["exp_avg_sq_rel_err"])),
        Column("B/param", lambda r: f"{r['bytes_per_param']:.3f}"),
        Column("32-bit B/param", lambda r: f"{r['twin_bytes_per_param']:.3f}"),
    ]
    torch_columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("shape", shape, left=True),
        Column("max param ulps/step", lambda r: f"{r['max_param_ulps']:.1f}"),
        Column("max state u/step", lambda r: f"{r['max_state_units']:.1f}"),
        Column(f"param rel err ({STEPS} steps)", lambda r: _sci(r["param_rel_err"])),
    ]
    t_columns = [
        Column("optimizer", lambda r: r["optimizer"], left=True),
        Column("ms/step", lambda r: f"{r['ms_per_step']:.1f}"),
        Column("M params/s", lambda r: f"{r['mparams_per_s']:.1f}"),
        Column("torch/this", lambda r: _ratio(r["vs_torch"])),
        Column("state B/param", lambda r: f"{r['bytes_per_param']:.3f}"),
    ]
    train: dict[str, Any] = {}
    steps = TRAIN_STEPS
    if ctx.training:
        train = train_runs(steps)
        ctx.progress(f"  optimizer training comparison ({steps} steps on the CPU) done")
    train_rows = [{"kind": "training", "config": k, "final_loss": v["final"],
                   "vs_adamw32": v["final"] / train["AdamW"]["final"],
                   "vs_twin": (v["final"] / train[TWINS[k]]["final"]
                               if TWINS.get(k) in train else None),
                   "s_per_step": v["s_per_step"], "bytes_per_param": v["bytes_per_param"],
                   "eight_bit_share": v["eight_bit_share"]} for k, v in train.items()]
    train_columns = [
        Column("optimizer", lambda r: r["config"], left=True),
        Column("final loss", lambda r: f"{r['final_loss']:.5f}"),
        Column("vs AdamW", lambda r: f"{r['vs_adamw32']:.4f}"),
        Column("vs 32-bit twin", lambda r: "-" if r["vs_twin"] is None else f"{r['vs_twin']:.4f}"),
        Column("state B/param", lambda r: f"{r['bytes_per_param']:.3f}"),
        Column("s/step", lambda r: f"{r['s_per_step']:.4f}"),
    ]
    ms = {r["optimizer"]: r["ms_per_step"] for r in timing}
    notes = [
        f"state error: one parameter tensor per shape, N(0, {PARAM_STD}^2), stepped {STEPS} "
        f"times by each 8-bit optimizer and by its 32-bit twin (bits=32) from the same start on "
        f"the same gradients (each step {GRAD_SCALE:g} x a fresh draw of the workload's values), "
        "each with lowbit.optim's defaults (AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd "
        "1e-2; StableAdamW lr 1e-3, betas (0.9, 0.99), eps 1e-6, wd 1e-2), blocks of 256; rel "
        "err = relative Frobenius error against the twin (update: of p - p0; states: the 8-bit "
        "ones dequantized); B/param = bytes of the state tensors (codes, absmax, float states) per "
        "parameter; parameters with one dimension, fewer than 4096 elements or rows that are not "
        "whole blocks keep 32-bit states (docs/techniques/optimizers.md), so the 1-D rows equal "
        "their twins; on outliers, a block that receives a 1000x gradient takes its absmax from "
        "it, and the second moments of its other elements fall orders of magnitude below, where "
        "the dynamic map's entries are sparse: their updates carry far larger errors, while the "
        "states' Frobenius errors, dominated by the outliers, stay small",
        f"vs torch: lowbit.optim.AdamW (32-bit) against torch.optim.AdamW (foreach=False) on the "
        f"same {STEPS} steps, each step from torch's values: parameters in ulps of the largest "
        "of old value, new value and update (the update times the first moment's cancellation, "
        "(b1 |m| + (1-b1) |g|) / |b1 m + (1-b1) g|; documented bound 8), states in units of "
        "2^-24 times the recurrence on absolute values (bound 6); param rel err: the two run "
        f"apart for {STEPS} steps",
        f"step time: median of {3 if ctx.quick else 7} steps (after one warm-up) over "
        f"{timing[0]['params'] / 1e6:.2f} M parameters in {len(TIMING_SHAPES)} tensors "
        f"({', '.join('x'.join(map(str, s)) for s in TIMING_SHAPES)}), float32 on the CPU, "
        f"{torch.get_num_threads()} torch threads; torch.optim.AdamW in its default "
        f"implementation on the CPU ({ms['torch.optim.AdamW']:.1f} ms: the single-tensor loop, "
        "vectorized torch operations on each tensor); lowbit.optim's steps run lowbit's CPU "
        "twin of the kernel, element by element",
    ]
    if train:
        eight = train["AdamW8bit"]
        notes.append(
            f"training: an MLP 256-256-256-16 (GELU) regressing a random tanh teacher, {steps} "
            f"steps of batch {TRAIN_BATCH} on the CPU, MSE, lr {TRAIN_LR} and each optimizer's "
            f"other defaults, the same start and batches; the 8-bit optimizers keep 8-bit states "
            f"for the weights ({100 * eight['eight_bit_share']:.1f}% of the parameters); final "
            "loss = mean of the last 20 steps; vs AdamW: against lowbit's 32-bit AdamW")
    else:
        notes.append("training comparison left out (--quick or --no-training)")

    def draw(fig: Any) -> None:
        from lowbit._tiny import draw_losses

        draw_losses(fig.add_subplot(1, 1, 1), train,
                    f"8-bit optimizers: training comparison on the CPU ({steps} steps)")

    lines = [f"note: {n}" for n in notes] + [""] + render_table(err_columns, err_rows) + [""] + \
        render_table(torch_columns, torch_rows) + [""] + render_table(t_columns, timing)
    if train_rows:
        lines += [""] + render_table(train_columns, train_rows)
    plots = [Plot("optim_training.png", draw, (7.0, 4.0))] if train else []
    return SectionResult(rows=se + timing + train_rows, text="\n".join(lines), notes=notes,
                         plots=plots)
