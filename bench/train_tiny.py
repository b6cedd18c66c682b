"""A small ViT trained on synthetic images, once per low-precision configuration of its linear
layers, to show each technique on a real (small) model: the same seed, data and schedule for
every configuration, so the loss curves differ only by the layers' numerics.

    python bench/train_tiny.py --out results/ [--steps 300] [--device cuda] [--configs a,b,...]

Writes <out>/train_tiny.json (per configuration: the loss of every step, the final loss as the
mean of the last 20 steps, the time per step) and <out>/train_tiny.png (the loss curves) when
matplotlib is there. The model and the data are lowbit._tiny's (the report's training comparison
runs the same code, smaller, on the CPU): width 384, 6 blocks of 6 heads by default.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from lowbit._tiny import CONFIGS, draw_losses, train


def plot(results: dict, path: str, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    draw_losses(ax, results, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for name in a.configs.split(","):
        results[name] = train(name, a.steps, a.batch, a.device, a.seed, width=a.width,
                              depth=a.depth, heads=max(1, a.width // 64))
        r = results[name]
        print(f"{name:28s} final loss {r['final']:.4f}  {1e3 * r['s_per_step']:.1f} ms/step",
              flush=True)
    meta = {"device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
            "steps": a.steps, "batch": a.batch, "seed": a.seed, "width": a.width, "depth": a.depth,
            "torch": torch.__version__}
    with open(os.path.join(a.out, "train_tiny.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f)
    plot(results, os.path.join(a.out, "train_tiny.png"),
         f"TinyViT ({a.depth}x{a.width}) on synthetic images, {a.steps} steps, {meta['device']}")
    if "nn_linear" in results:
        base = results["nn_linear"]["final"]
        for name, r in results.items():
            print(f"{name:28s} final/nn_linear = {r['final'] / base:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
