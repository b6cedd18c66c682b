"""fp8 training, four ways, on lowbit._tiny's ViT and synthetic data (same seed, data and
schedule for each): (a) native fp8 on the GPU's fp8 tensor cores (the tensor-wise delayed
recipe, backend --native-backend), (b) lowbit's emulation of the same recipe under the Hopper
accumulation model on the same GPU without fp8 instructions (simt), (c) the same emulation on
the CPU for the first --cpu-steps steps, (d) bf16 nn.Linear.

    python bench/train_fp8.py --out results/ [--steps 300] [--batch 32] [--cpu-steps 2]
        [--accumulation SPEC] [--native-backend cublaslt] [--replay-matmuls 48]
        [--cpu-replay-matmuls 12]

Writes <out>/train_fp8.json (each run's loss per step; the first step where (a) and (b) differ,
and where (c) and (b) differ; the matmul replay below) and <out>/train_fp8.png (the four loss
curves) where matplotlib imports. PyTorch runs in deterministic mode (CUBLAS_WORKSPACE_CONFIG
set, torch.use_deterministic_algorithms(True, warn_only=True)), so (a) and (b) differ only by
their fp8 matmuls, and the first step where their losses part is the first step where the model
is not the hardware's sum (or where that difference reaches the loss).

The matmul replay: the first --replay-matmuls fp8 matmuls of run (a) (their codes, scales and
native outputs, recorded from lowbit's scaled_mm op) are run again under the accumulation model
on the GPU (simt) and the first --cpu-replay-matmuls of them on the CPU (the twin), and the
outputs compared bit for bit with the native ones: the report counts the outputs compared and
the mismatches (0 when the model is the hardware's). SPEC is a lowbit.Accumulation spec; the
default is lowbit.nn.HOPPER, fitted to the H200's probes (e4m3 x e4m3, one cuBLASLt kernel):
the replay is where it meets the layer's other shapes and the e5m2 x e4m3 gradient matmuls.

Cost: the CPU twin sums under a model at about 60 M products per second per core (measured on
this project's 2-core machine), and one step of the default ViT at batch 32 is about 65 G
products, so (c) takes about a minute per step on 16 cores; keep --cpu-steps small.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402

import lowbit  # noqa: E402
import lowbit.nn as lnn  # noqa: E402
from lowbit import _tiny  # noqa: E402
from lowbit import _torch_ops as ops  # noqa: E402


def first_difference(a: list[float], b: list[float]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


class Recorder:
    """Records the first `limit` calls of the eager scaled_mm op: inputs on the CPU, output."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[tuple[tuple, torch.Tensor]] = []
        self.orig = ops.EAGER["scaled_mm"]

    def __enter__(self) -> Recorder:
        def record(*args):
            out = self.orig(*args)
            if len(self.calls) < self.limit:
                cpu = tuple(a.detach().cpu() if isinstance(a, torch.Tensor) else a for a in args)
                self.calls.append((cpu, out.detach().cpu()))
            return out

        ops.EAGER["scaled_mm"] = record
        return self

    def __exit__(self, *exc) -> None:
        ops.EAGER["scaled_mm"] = self.orig


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def replay(calls, spec: str, device: str) -> dict:
    """Each recorded matmul under the model on `device`: outputs compared, mismatches."""
    compared = mismatched = 0
    first = None
    for i, (args, native) in enumerate(calls):
        args = list(args)
        args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
        args[8] = "simt" if device.startswith("cuda") else "automatic"  # backend
        args[9] = spec  # accumulation
        out = ops.EAGER["scaled_mm"](*args).cpu()
        bad = int((bits(out) != bits(native)).sum())
        compared += native.numel()
        mismatched += bad
        if bad and first is None:
            first = i
    return {"matmuls": len(calls), "outputs": compared, "mismatches": mismatched,
            "first_mismatching_matmul": first}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cpu-steps", type=int, default=2)
    ap.add_argument("--width", type=int, default=384)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--accumulation", default=None)
    ap.add_argument("--native-backend", default="cublaslt")
    ap.add_argument("--replay-matmuls", type=int, default=48)
    ap.add_argument("--cpu-replay-matmuls", type=int, default=12)
    a = ap.parse_args(argv)
    torch.use_deterministic_algorithms(True, warn_only=True)
    model = lnn.HOPPER if a.accumulation is None else \
        lowbit.Accumulation.parse(a.accumulation)
    native = lnn.fp8_recipe("tensorwise", "delayed", backend=a.native_backend,
                            name="fp8_native")
    emulated = lnn.hopper_recipe(model, backend="simt")
    kw = dict(batch=a.batch, width=a.width, depth=a.depth, autocast=True)
    runs = {}
    with Recorder(a.replay_matmuls) as rec:
        runs["a_native_fp8"] = _tiny.train(dict(recipe=native), a.steps, device="cuda", **kw)
    runs["b_emulated_gpu"] = _tiny.train(dict(recipe=emulated), a.steps, device="cuda", **kw)
    runs["c_emulated_cpu"] = _tiny.train(dict(recipe=emulated.with_backend("automatic")),
                                         a.cpu_steps, device="cpu", **kw)
    runs["d_bf16"] = _tiny.train("nn_linear", a.steps, device="cuda", **kw)
    la, lb, lc = (runs[k]["losses"] for k in ("a_native_fp8", "b_emulated_gpu",
                                              "c_emulated_cpu"))
    result = {
        "meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "accumulation": str(model), "native_backend": a.native_backend,
                 "steps": a.steps, "cpu_steps": a.cpu_steps, "batch": a.batch,
                 "width": a.width, "depth": a.depth},
        "runs": runs,
        "first_step_a_vs_b_differ": first_difference(la, lb),
        "first_step_c_vs_b_differ": first_difference(lc, lb),
        "max_abs_loss_diff_a_vs_b": max((abs(x - y) for x, y in zip(la, lb)), default=0.0),
        "replay_gpu_simt": replay(rec.calls, str(model), "cuda"),
        "replay_cpu_twin": replay(rec.calls[:a.cpu_replay_matmuls], str(model), "cpu"),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_fp8.json").write_text(json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5))
        _tiny.draw_losses(ax, runs, f"ViT ({a.depth} x {a.width}), fp8 four ways: "
                          f"{torch.cuda.get_device_name()}")
        fig.tight_layout()
        fig.savefig(out / "train_fp8.png", dpi=120)
    except ImportError:
        print("# matplotlib not importable: no plot")
    for k in ("first_step_a_vs_b_differ", "first_step_c_vs_b_differ",
              "max_abs_loss_diff_a_vs_b", "replay_gpu_simt", "replay_cpu_twin"):
        print(f"{k}: {result[k]}")
    for name, r in runs.items():
        print(f"{name:16s} final {r['final']:.4f}  {1000 * r['s_per_step']:.1f} ms/step  "
              f"({len(r['losses'])} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
