"""Float8Linear forward + backward on the GPU against bf16 nn.Linear, measured in the same run:
the fp8 recipe run natively (the fp8 tensor cores where the device has them), emulated by
widening the fp8 codes to bf16 tensor cores (backend "widened"), and emulated under an
accumulation model on the CUDA cores (simt: the Hopper model, bit-identical to the CPU twin).

    python bench/float8_torch.py out.json [--tokens 65536] [--model-tokens 8192] [--iters 10]
        [--accumulation SPEC]

Each row: the median time of one forward + backward (input, weight and bias gradients), CUDA
events around each iteration after warm-up; `vs_bf16` is bf16 nn.Linear's time over the row's
at the same shape (above 1: faster). The accumulation model runs on CUDA cores, far slower
than tensor cores: its rows use --model-tokens tokens (with their own bf16 row) so that the
whole run stays within about 90 s on an H200. SPEC is a lowbit.Accumulation spec
("bfp:k=32,f=13,..."); the default is lowbit.nn.HOPPER (fitted to the H200).
Shapes: the ViT-H MLP's two layers (1280 -> 5120, 5120 -> 1280) and an attention projection.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

from torch_baselines import median_ms  # bench/ is the script's directory: CUDA-event medians

SHAPES = [(1280, 5120), (5120, 1280), (1280, 1280)]


def fwd_bwd_ms(layer, x, grad, iters: int) -> float:
    def step() -> None:
        x.grad = None
        layer(x).backward(grad)

    return median_ms(step, reps=iters, warmup=2)


def main(argv: list[str] | None = None) -> int:
    import lowbit
    import lowbit.nn as lnn

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--model-tokens", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--accumulation", default=None)
    a = ap.parse_args(argv)
    model = lnn.HOPPER if a.accumulation is None else \
        lowbit.Accumulation.parse(a.accumulation)
    recipes = {
        "fp8_tensorwise_delayed_native": (lnn.fp8_recipe("tensorwise", "delayed"), a.tokens),
        "fp8_tensorwise_delayed_widened": (
            lnn.fp8_recipe("tensorwise", "delayed", backend="widened"), a.tokens),
        "fp8_rowwise_native": (lnn.fp8_recipe("rowwise"), a.tokens),
        "hopper_emulated_simt": (lnn.hopper_recipe(model, backend="simt"), a.model_tokens),
        "fp8_blockwise_1x128_simt": (lnn.fp8_recipe("blockwise", backend="simt"), a.model_tokens),
    }
    torch.manual_seed(0)
    rows, notes = [], [f"accumulation model: {model!r}"]
    for fin, fout in SHAPES:
        base = nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16)
        bf16_ms = {}
        for tokens in sorted({a.tokens, a.model_tokens}):
            x = torch.randn(tokens, fin, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn(tokens, fout, device="cuda", dtype=torch.bfloat16)
            shape = f"{tokens}x{fin}->{fout}"
            flop = 6.0 * tokens * fin * fout
            t = fwd_bwd_ms(base, x, grad, a.iters)
            bf16_ms[tokens] = t
            rows.append({"shape": shape, "layer": "bf16_nn_linear", "ms": t, "vs_bf16": 1.0,
                         "tflops": flop / t / 1e9})
            for name, (recipe, want_tokens) in recipes.items():
                if want_tokens != tokens:
                    continue
                layer = lnn.Float8Linear(fin, fout, device="cuda", dtype=torch.bfloat16,
                                         recipe=recipe)
                layer.load_state_dict(base.state_dict(), strict=False)
                # The CUDA-core rows are slow: fewer iterations keep the run short.
                iters = a.iters if want_tokens == a.tokens else max(3, a.iters // 2)
                try:
                    t = fwd_bwd_ms(layer, x, grad, iters)
                except Exception as e:  # noqa: BLE001 - a backend that refuses is reported
                    rows.append({"shape": shape, "layer": name,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
                    continue
                rows.append({"shape": shape, "layer": name, "ms": t,
                             "vs_bf16": bf16_ms[tokens] / t, "tflops": flop / t / 1e9})
            del x, grad
            torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "tokens": a.tokens, "model_tokens": a.model_tokens, "iters": a.iters,
            "notes": notes}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    for n in notes:
        print("#", n)
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:22s} {r['layer']:34s} ERROR {r['error']}")
        else:
            print(f"{r['shape']:22s} {r['layer']:34s} {r['ms']:9.3f} ms  x{r['vs_bf16']:.3f} "
                  f"{r['tflops']:7.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
