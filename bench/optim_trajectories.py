"""Training trajectories of lowbit's optimizers: each 8-bit optimizer against its 32-bit twin on
the same model, data and seed (lowbit._tiny's ViT on its synthetic images), so that the curves
differ only by the states' precision.

    python bench/optim_trajectories.py [--steps 500] [--device cuda] [--out DIR]

Writes DIR/optim_trajectories.json (every step's loss, the final loss: the mean of the last 20
steps) and, where matplotlib imports, DIR/optim_trajectories.png; prints one row per optimizer:
the two final losses and their ratio (8-bit over 32-bit).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
from torch import nn

import lowbit.optim as lo
from lowbit import _tiny

# name -> (class name, keyword arguments): the learning rates each optimizer is usually run with
# on a small transformer.
OPTIMIZERS = {
    "Adam": ("Adam", dict(lr=1e-3)),
    "AdamW": ("AdamW", dict(lr=1e-3, weight_decay=0.05)),
    "StableAdamW": ("StableAdamW", dict(lr=1e-3, weight_decay=0.05)),
    "SGD": ("SGD", dict(lr=0.05, momentum=0.9)),
    "Lion": ("Lion", dict(lr=1e-4, weight_decay=0.5)),
    "RMSprop": ("RMSprop", dict(lr=3e-4)),
    "Adagrad": ("Adagrad", dict(lr=1e-2)),
    "LAMB": ("LAMB", dict(lr=3e-3, weight_decay=0.05)),
    "LARS": ("LARS", dict(lr=0.5, momentum=0.9)),
}


def run(cls, kw: dict, bits: int, steps: int, batch: int, device: str, width: int,
        depth: int) -> list[float]:
    torch.manual_seed(0)
    model = _tiny.TinyViT(width=width, depth=depth, heads=4).to(device)
    opt = cls(model.parameters(), bits=bits, **kw)
    warmup = max(1, min(30, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    losses = []
    for x, y in _tiny.make_data(steps, batch, 1, device):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
    return losses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--width", type=int, default=192)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=".")
    ap.add_argument("--only", nargs="*", default=None)
    a = ap.parse_args(argv)
    results = {}
    for name, (cls_name, kw) in OPTIMIZERS.items():
        if a.only and name not in a.only:
            continue
        cls = getattr(lo, cls_name, None)
        if cls is None:
            print(f"# {name}: not in lowbit.optim, skipped")
            continue
        r = {}
        for bits in (32, 8):
            losses = run(cls, kw, bits, a.steps, a.batch, a.device, a.width, a.depth)
            tail = losses[-20:]
            r[f"{bits}bit"] = {"losses": losses, "final": sum(tail) / len(tail)}
        r["ratio"] = r["8bit"]["final"] / r["32bit"]["final"]
        results[name] = r
        print(f"{name:12s} 32-bit {r['32bit']['final']:.4f}  8-bit {r['8bit']['final']:.4f}"
              f"  ratio {r['ratio']:.4f}", flush=True)
    meta = {"steps": a.steps, "batch": a.batch, "width": a.width, "depth": a.depth,
            "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
            "torch": torch.__version__}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "optim_trajectories.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the plot is optional
        return 0
    n = len(results)
    cols = 3
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, (name, r) in zip(axes.flat, results.items()):
        for bits, style in (("32bit", "-"), ("8bit", "--")):
            ax.plot(r[bits]["losses"], style, lw=0.8, label=bits.replace("bit", "-bit"))
        ax.set_title(name)
        ax.set_yscale("log")
        ax.legend()
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "optim_trajectories.png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
