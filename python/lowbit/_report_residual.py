"""The report's section on residual master weights (lowbit.optim, docs/techniques/residual.md):
per workload, 16-bit format and residual width, the reconstruction error of split then join in
float32 steps and relative to the value, the share reconstructed exactly, and the CPU time of a
split + join; and, unless left out, a small training run (a tiny MLP, AdamW) comparing bfloat16
+ residual16 with the step fused into the backward against a float32 master whose forward sees
the master rounded by the same rule (losses equal bit for bit), residual8, and plain bfloat16
without a master. bench/residual_torch.py runs the same training comparison. Needs PyTorch:
without it the section says so and measures nothing."""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any, Callable

import numpy as np

CASES = [("bfloat16", 16), ("bfloat16", 8), ("float16", 16), ("float16", 8)]
TINY_STEPS = 200


def measure(workloads: list[tuple[str, np.ndarray]], threads: int, training: bool,
            progress: Callable[[str], None]) -> dict[str, Any]:
    import torch

    import lowbit.optim as lo

    if threads:
        torch.set_num_threads(threads)
    rows = []
    for wname, values in workloads:
        x = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
        x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
        for fmt, bits in CASES:
            dtype = torch.bfloat16 if fmt == "bfloat16" else torch.float16
            w, r = lo.residual_split(x, dtype, bits)
            y = lo.residual_join(w, r, bits)
            steps = (y.view(torch.int32).to(torch.int64) & 0x7FFFFFFF) - \
                (x.view(torch.int32).to(torch.int64) & 0x7FFFFFFF)
            fin = torch.isfinite(y) & (x != 0)
            rel = ((y - x).abs()[fin] / x.abs()[fin]) if bool(fin.any()) else torch.zeros(1)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                lo.residual_join(*lo.residual_split(x, dtype, bits), bits)
                times.append(time.perf_counter() - t0)
            rows.append({"workload": wname, "format": fmt, "bits": bits,
                         "max_steps": int(steps.abs().max()),
                         "max_rel": float(rel.max()),
                         "exact": float((steps == 0).double().mean()),
                         "mvals_per_s": x.numel() / statistics.median(times) / 1e6})
    tiny = None
    if training:
        progress(f"residual: tiny MLP training, {TINY_STEPS} steps x 4 configurations")
        tiny = tiny_run("cpu", TINY_STEPS)
    return {"rows": rows, "tiny": tiny}


def tiny_run(dev: str, steps: int) -> dict[str, Any]:
    """A 3-layer MLP regression on synthetic data (a random teacher network), four ways from the
    same start on the same batches: a float32 master whose forward sees the master rounded to
    bfloat16 by the residual rule (nearest, ties away); bfloat16 + residual16 and + residual8,
    stepped inside the backward; plain bfloat16 parameters without a master. AdamW, lr 1e-3."""
    import torch
    from torch import nn

    import lowbit.optim as lo

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 128), nn.GELU(),
                         nn.Linear(128, 8)).to(dev)
    teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8)).to(dev)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(64, 32, generator=g).to(dev) for _ in range(16)]
    with torch.no_grad():
        ys = [teacher(x) for x in xs]
    lr = 1e-3

    def loss_of(m: nn.Module, i: int) -> torch.Tensor:
        return nn.functional.mse_loss(m(xs[i % 16].to(torch.bfloat16)).float(), ys[i % 16])

    out: dict[str, list[float]] = {}
    master = copy.deepcopy(base)
    shadow = copy.deepcopy(base).to(torch.bfloat16)
    om = lo.AdamW(master.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        with torch.no_grad():
            for p, q in zip(master.parameters(), shadow.parameters()):
                q.copy_(lo.residual_split(p)[0])
        shadow.zero_grad()
        loss = loss_of(shadow, i)
        loss.backward()
        for p, q in zip(master.parameters(), shadow.parameters()):
            p.grad = q.grad.float()
        om.step()
        losses.append(float(loss))
    out["fp32 master"] = losses
    for name, mw in [("bf16 + residual16, fused", "residual16"),
                     ("bf16 + residual8, fused", "residual8")]:
        m = copy.deepcopy(base)
        o = lo.AdamW(m.parameters(), lr=lr, master_weights=mw)
        o.to_residual(torch.bfloat16)
        handle = lo.fuse_into_backward(m, o)
        losses = []
        for i in range(steps):
            loss = loss_of(m, i)
            loss.backward()
            losses.append(float(loss))
        handle.remove()
        out[name] = losses
    m = copy.deepcopy(base).to(torch.bfloat16)
    o = lo.AdamW(m.parameters(), lr=lr)
    losses = []
    for i in range(steps):
        o.zero_grad()
        loss = loss_of(m, i)
        loss.backward()
        o.step()
        losses.append(float(loss))
    out["bf16, no master"] = losses
    ref = out["fp32 master"]
    summary = {k: {"final_loss": v[-1], "equal_to_fp32_master": v == ref,
                   "max_abs_loss_diff": max(abs(a - b) for a, b in zip(v, ref))}
               for k, v in out.items()}
    return {"steps": steps, "lr": lr, "summary": summary, "curves": out}


def section(ctx: Any) -> Any:
    from lowbit.report import Column, SectionResult, _sci, render_table

    try:
        import torch  # noqa: F401
    except ImportError:
        note = "skipped: PyTorch is not installed (pip install torch), which lowbit.optim needs"
        return SectionResult(rows=[], text=f"note: {note}", notes=[note])
    wls = [(w.name, w.values) for w in ctx.workloads]
    m = measure(wls, ctx.threads, ctx.training, ctx.progress)
    rows = [{"kind": "split_join", **r} for r in m["rows"]]
    columns = [
        Column("workload", lambda r: r["workload"], left=True),
        Column("weight", lambda r: r["format"], left=True),
        Column("k", lambda r: str(r["bits"])),
        Column("max err (fp32 steps)", lambda r: str(r["max_steps"])),
        Column("max rel err", lambda r: _sci(r["max_rel"])),
        Column("exact", lambda r: f"{100 * r['exact']:.2f}%"),
        Column("split+join M/s", lambda r: f"{r['mvals_per_s']:.0f}"),
    ]
    notes = ["split then join of each workload's finite values (NaN/Inf set to 0): the error in "
             "float32 steps (bit-pattern distance) and relative; bfloat16 with k = 16 is exact by "
             "construction, float16 loses values outside [2^-17, 65520) (k = 16) or "
             "[2^-14, 65520) (k <= 13); CPU time of one split + join on the CPU twin"]
    lines = [f"note: {n}" for n in notes] + [""] + render_table(columns, rows)
    tiny = m["tiny"]
    train_rows: list[dict[str, Any]] = []
    if tiny:
        train_rows = [{"kind": "training", "config": k, **v} for k, v in tiny["summary"].items()]
        tc = [Column("configuration", lambda r: r["config"], left=True),
              Column("final loss", lambda r: f"{r['final_loss']:.6f}"),
              Column("= fp32 master", lambda r: "yes" if r["equal_to_fp32_master"] else "no"),
              Column("max |loss diff|", lambda r: _sci(r["max_abs_loss_diff"]))]
        notes.append(f"training: a tiny MLP regression, {tiny['steps']} steps of AdamW (lr "
                     f"{tiny['lr']}) on the CPU; the fp32 master's forward sees the master "
                     "rounded to bfloat16 by the residual rule")
        lines += ["", f"note: {notes[-1]}", ""] + render_table(tc, train_rows)
    else:
        notes.append("training comparison left out (--quick or --no-training)")
        lines += [f"note: {notes[-1]}"]
    return SectionResult(rows=rows + train_rows, text="\n".join(lines), notes=notes)
