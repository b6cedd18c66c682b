"""Forward + backward of one linear layer at the SwitchBack paper's ViT-H shapes, on the GPU:
lowbit's low-precision linears against bf16 nn.Linear measured in the same run, and the peers a
user would pick instead (torchao's int8 mixed-precision training and float8 training with the
tensorwise and rowwise recipes, under torch.compile as torchao intends) where torchao imports.

    python bench/linear_torch.py out.json [--tokens 65536] [--iters 20]

Each row: the median time of one forward + backward (the input gradient, the weight gradient and
the bias gradient all computed), CUDA events around each iteration, after warm-up; `vs_bf16` is
bf16 nn.Linear's time over the row's time (above 1: faster). Each iteration starts on an idle
GPU, so a layer whose host work exceeds its GPU work shows the host's time; `queued_ms` is the
mean of the same number of iterations queued back to back (CUDA events around all of them), the
steady state of a model whose layers follow each other, and `queued_vs_bf16` its ratio.
Shapes: tokens x in -> out for the MLP's two layers (1280 -> 5120, 5120 -> 1280) and an
attention projection (1280 -> 1280).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch import nn

from torch_baselines import median_ms  # bench/ is the script's directory: CUDA-event medians

SHAPES = [(1280, 5120), (5120, 1280), (1280, 1280)]


def time_fwd_bwd(fn, x, grad, iters: int) -> tuple[float, float]:
    """Milliseconds of fn(x).backward(grad), x's gradient cleared before each: the median of
    iterations timed one by one, and the mean of `iters` iterations queued back to back."""

    def step() -> None:
        x.grad = None
        fn(x).backward(grad)

    one_by_one = median_ms(step, reps=iters)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        step()
    b.record()
    b.synchronize()
    return one_by_one, a.elapsed_time(b) / iters


def time_call(fn, iters: int) -> float:
    return median_ms(fn, reps=iters)


def lowbit_layers(fin: int, fout: int, base: nn.Linear) -> dict:
    import lowbit.nn as lnn

    layers = {}
    for name, kw in [("switchback_int8", dict(variant="switchback", fmt="int8")),
                     ("switchback_q_int8", dict(variant="switchback_q", fmt="int8")),
                     ("switchback_fp8", dict(variant="switchback", fmt="fp8")),
                     ("switchback_fp8_emulated", dict(variant="switchback", fmt="fp8",
                                                      backend="widened")),
                     ("tensorwise_fp8", dict(variant="tensorwise", fmt="fp8"))]:
        m = nn.Sequential(nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16))
        m.load_state_dict({"0." + k: v for k, v in base.state_dict().items()})
        lnn.convert(m, **kw)
        layers[name] = m
    return layers


def torchao_layers(fin: int, fout: int, base: nn.Linear) -> tuple[dict, str]:
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        from torchao.prototype.quantized_training import int8_mixed_precision_training
        from torchao.quantization import quantize_
    except Exception as e:  # noqa: BLE001 - any import failure means: no peer rows
        return {}, f"torchao not importable: {type(e).__name__}: {e}"
    layers = {}
    for recipe in ("tensorwise", "rowwise"):
        m = nn.Sequential(nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16))
        m.load_state_dict({"0." + k: v for k, v in base.state_dict().items()})
        convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name(recipe))
        layers[f"torchao_float8_{recipe}_compiled"] = torch.compile(m)
    m = nn.Sequential(nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16))
    m.load_state_dict({"0." + k: v for k, v in base.state_dict().items()})
    quantize_(m, int8_mixed_precision_training())
    layers["torchao_int8_mixed_precision_compiled"] = torch.compile(m)
    return layers, f"torchao {torchao.__version__}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    rows, notes = [], []
    for fin, fout in SHAPES:
        base = nn.Linear(fin, fout, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(a.tokens, fin, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        grad = torch.randn(a.tokens, fout, device="cuda", dtype=torch.bfloat16)
        t_bf16, q_bf16 = time_fwd_bwd(base, x, grad, a.iters)
        flop = 6.0 * a.tokens * fin * fout
        rows.append({"shape": f"{a.tokens}x{fin}->{fout}", "layer": "bf16_nn_linear",
                     "ms": t_bf16, "vs_bf16": 1.0, "tflops": flop / t_bf16 / 1e9,
                     "queued_ms": q_bf16, "queued_vs_bf16": 1.0})
        layers = lowbit_layers(fin, fout, base)
        peers, note = torchao_layers(fin, fout, base)
        if note not in notes:
            notes.append(note)
        layers.update(peers)
        for name, m in layers.items():
            try:
                t, q = time_fwd_bwd(m, x, grad, a.iters)
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                rows.append({"shape": f"{a.tokens}x{fin}->{fout}", "layer": name,
                             "error": f"{type(e).__name__}: {e}"[:300]})
                continue
            rows.append({"shape": f"{a.tokens}x{fin}->{fout}", "layer": name, "ms": t,
                         "vs_bf16": t_bf16 / t, "tflops": flop / t / 1e9, "queued_ms": q,
                         "queued_vs_bf16": q_bf16 / q})
        # The quantize kernels' share: the row-wise quantization of X and G and the tensor-wise
        # quantization of W that one int8 SwitchBack step runs, timed alone.
        try:
            from lowbit import _torch_ops as ops

            w = base.weight.detach()
            t_q = time_call(lambda: (ops.quantize_rows(x.detach(), "int8_sym"),
                                     ops.quantize_rows(grad, "int8_sym"),
                                     ops.quantize_tensor(w, "int8_sym")), a.iters)
            sb = next(r for r in rows if r["layer"] == "switchback_int8"
                      and r["shape"] == f"{a.tokens}x{fin}->{fout}")
            sb["quantize_ms"] = t_q
            sb["quantize_share"] = t_q / sb["ms"] if "ms" in sb else None
        except Exception as e:  # noqa: BLE001
            notes.append(f"quantize share not measured: {type(e).__name__}: {e}")
        del x, grad, layers, peers
        torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "tokens": a.tokens, "iters": a.iters, "notes": notes}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    for n in notes:
        print("#", n)
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:22s} {r['layer']:40s} ERROR {r['error']}")
        else:
            share = r.get("quantize_share")
            extra = f"  quantize {100 * share:.1f}%" if share else ""
            print(f"{r['shape']:22s} {r['layer']:40s} {r['ms']:8.3f} ms  x{r['vs_bf16']:.3f} "
                  f"{r['tflops']:7.1f} TFLOP/s  queued {r['queued_ms']:8.3f} ms "
                  f"x{r['queued_vs_bf16']:.3f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
