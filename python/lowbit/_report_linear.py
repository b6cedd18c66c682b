"""The report's section on the low-precision linear layers (lowbit.nn): the error of each
layer's forward output and input gradient against float64 matmuls of the same unquantized
tensors, the CPU time of forward + backward against nn.Linear, and a small training comparison
(lowbit._tiny) on the CPU. Needs PyTorch: without it the section says so and measures nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lowbit.report import median_time

# (label, lowbit.nn.convert / SwitchBackLinear keywords); None: nn.Linear itself.
LAYERS: list[tuple[str, dict[str, Any] | None]] = [
    ("nn.Linear bf16", None),
    ("switchback int8", dict(variant="switchback", fmt="int8")),
    ("switchback_m int8", dict(variant="switchback_m", fmt="int8")),
    ("switchback_q int8", dict(variant="switchback_q", fmt="int8")),
    ("switchback fp8", dict(variant="switchback", fmt="fp8")),
    ("tensorwise fp8", dict(variant="tensorwise", fmt="fp8")),
]
TOKENS, FAN_IN, FAN_OUT = 512, 256, 256
TRAIN_WIDTH, TRAIN_DEPTH, TRAIN_BATCH, TRAIN_LR = 64, 2, 32, 3e-3
TRAIN_STEPS = 60
TRAIN_CONFIGS = ("nn_linear", "switchback_int8", "switchback_fp8", "tensorwise_fp8")


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """Relative Frobenius error of a against b."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def measure(workloads: list[tuple[str, np.ndarray]], threads: int, quick: bool,
            training: bool, progress: Callable[[str], None]) -> dict[str, Any]:
    """Rows of layer errors and CPU times, and the training comparison's results."""
    import torch
    from torch import nn

    import lowbit.nn as lnn
    from lowbit import _tiny

    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(5)
    w = torch.randn(FAN_OUT, FAN_IN, generator=g) / FAN_IN ** 0.5
    b = torch.randn(FAN_OUT, generator=g) * 0.1
    grad = torch.randn(TOKENS, FAN_OUT, generator=g)
    rows: list[dict[str, Any]] = []
    for wl_name, values in workloads:
        x = np.resize(values, TOKENS * FAN_IN).astype(np.float32)
        x = torch.from_numpy(x)
        x = x.reshape(TOKENS, FAN_IN)
        x64, w64, g64 = x.double(), w.double(), grad.double()
        y_exact = (x64 @ w64.T + b.double()).numpy()
        dx_exact = (g64 @ w64).numpy()
        for label, kw in LAYERS:
            if kw is None:
                layer = nn.Linear(FAN_IN, FAN_OUT).to(torch.bfloat16)
                dtype = torch.bfloat16
            else:
                layer = lnn.SwitchBackLinear(FAN_IN, FAN_OUT, **kw)
                dtype = torch.float32
            with torch.no_grad():
                layer.weight.copy_(w)
                layer.bias.copy_(b)
            xi = x.to(dtype).clone().requires_grad_(True)
            y = layer(xi)
            y.backward(grad.to(dtype))
            row = {"workload": wl_name, "layer": label,
                   "forward_rel_err": _rel(y.detach().double().numpy(), y_exact),
                   "dx_rel_err": _rel(xi.grad.double().numpy(), dx_exact),
                   "cpu_ms": None, "vs_nn_linear": None}
            rows.append(row)
        progress(f"  linear layers measured on the {wl_name} workload")
    # CPU time of forward + backward, float32 layers against float32 nn.Linear.
    x = torch.randn(TOKENS, FAN_IN, generator=g)
    runs = 3 if quick else 5
    base = nn.Linear(FAN_IN, FAN_OUT)

    def step(layer: nn.Module) -> Callable[[], None]:
        xi = x.clone().requires_grad_(True)
        return lambda: layer(xi).backward(grad)

    t_base = 1e3 * median_time(step(base), runs)
    for label, kw in LAYERS[1:]:
        t = 1e3 * median_time(step(lnn.SwitchBackLinear(FAN_IN, FAN_OUT, **kw)), runs)
        for row in rows:
            if row["layer"] == label and row["workload"] == workloads[0][0]:
                row.update(cpu_ms=t, vs_nn_linear=t_base / t)
    progress("  linear layers timed on the CPU")
    train: dict[str, Any] = {}
    if training:
        train = {name: _tiny.train(name, TRAIN_STEPS, TRAIN_BATCH, "cpu", 0, width=TRAIN_WIDTH,
                                   depth=TRAIN_DEPTH, heads=2, lr=TRAIN_LR)
                 for name in TRAIN_CONFIGS}
        progress(f"  training comparison ({TRAIN_STEPS} steps on the CPU) done")
    return {"rows": rows, "nn_linear_cpu_ms": t_base, "train": train, "train_steps": TRAIN_STEPS}
