"""Mesa (lowbit.nn.mesa) on a ViT block stack: the activation memory a training step needs and
its throughput, against the same model under bfloat16 autocast, in the same run; then a small
ViT (lowbit._tiny) trained with and without Mesa.

    python bench/mesa_torch.py out.json [--model vit-b|deit-s] [--batch 256] [--depth 12]
                                        [--steps 10] [--rounds 3] [--train-steps 300]
                                        [--plot losses.png]
                                        [--device cuda|cpu]

Part 1, the block stack (timm's ViT structure: pre-norm blocks of LayerNorm, Attention with a
fused qkv projection, LayerNorm, MLP with GELU; ViT-B/16: width 768, 12 heads, MLP 3072, 197
tokens; DeiT-S: width 384, 6 heads), AdamW, bfloat16 autocast, one forward + backward + step per
training step. Variants: `bf16` (the model as it is, attention by scaled_dot_product_attention,
as timm runs it), `bf16_explicit` (softmax(q k^T) v written out, timm's fused_attn=False),
`mesa_explicit` (lowbit.nn.mesa.convert, the paper's attention core: q, k, the softmax output
and v saved in 8 bits), `mesa_sdpa` (Mesa with the fused attention core recomputed in backward
from 8-bit q, k, v), both with `_lagged` (each batch encoded by the estimates of the batches
before it, updated from the same read: one pass over each saved tensor instead of two), and any
of those with `_mlp` (the MLP as one MesaMlp: its input and hidden saved, fc2's input recomputed
from the hidden in backward, where module by module fc2 saves its own), and any Mesa variant
with `_unfused` (LayerNorm's and the activations' backward passes from dequantized tensors by
torch's kernels instead of lowbit's fused kernels, which read the codes). For each:
- activation_MiB: torch.cuda.max_memory_allocated during one training step minus the memory
  allocated when it starts (the parameters and the optimizer's states; the gradients are freed
  between steps, so they count in the step's peak, equally in every variant);
- saved_MiB: the bytes autograd keeps for backward after the forward (saved-tensor hooks,
  storages counted once, the parameters' own storages left out): the activations alone (with
  the bfloat16 copies of the weights that autocast makes and its backward keeps);
- ms_per_step, images_per_s: the median over all timed steps after warm-up (CUDA events): every
  variant is built first, then timed for `--steps` steps in each of `--rounds` rounds, the
  variants in turn (reversed every other round), so that the machine's drift over the run
  weighs on all alike; round_ms holds each round's median;
- saved_vs_bf16 = 1 - activation / bf16's; overhead_vs_bf16 = time / bf16's time - 1.
Goals (docs/techniques/mesa.md): activation memory saved >= 45%, overhead <= 15%, against bf16.

Part 2 (CUDA only, unless --no-kernels): the actquant kernels alone on bfloat16 tensors (heads
of [512, 12, 197, 64], blocks of channels and one group of [65536, 768], and the SDPA core's
packed q, k, v of ViT-B at batch 256, [50432, 2304] in 36 groups of 64 channels): bytes moved
per element (update + quantize 5: x read twice, codes written; lagged and frozen 3; dequantize
to bf16 3), median ms (CUDA events) and GB/s, beside a bf16 clone (4 bytes per element) in the
same run.

Part 3 (unless --train-steps 0): lowbit._tiny.train with and without Mesa (same seed, data and
schedule; bfloat16 autocast on CUDA, float32 on the CPU), final losses (mean of the last 20 steps)
and their ratio (goal: within 1%); --plot writes the loss curves.

Runs on the CPU too (small and slow: use --model deit-s --depth 2 --batch 4 --steps 2 --rounds 1
--train-steps 30); memory is then measured by saved_MiB only.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

MODELS = {"vit-b": dict(width=768, heads=12, depth=12), "deit-s": dict(width=384, heads=6,
                                                                         depth=12)}
TOKENS = 197


class Attention(nn.Module):  # timm.models.vision_transformer.Attention's structure
    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.num_heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.fused_attn = fused
        self.qkv = nn.Linear(dim, 3 * dim)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v)
        else:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(b, n, c)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, fused: bool) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads, fused)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    def __init__(self, width: int, heads: int, depth: int, fused: bool) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width, heads, fused) for _ in range(depth)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(x)).mean(1))


def build(variant: str, cfg: dict, device: str) -> nn.Module:
    variant = variant.removesuffix("_unfused")
    torch.manual_seed(0)
    model = Stack(cfg["width"], cfg["heads"], cfg["depth"], fused=variant != "bf16_explicit")
    model = model.to(device)
    if variant.startswith("mesa"):
        import lowbit.nn.mesa as mesa

        kinds = mesa.DEFAULT_LAYERS + (("mlp",) if variant.endswith("_mlp") else ())
        mesa.convert(model, core=variant.split("_")[1], lagged="_lagged" in variant, layers=kinds,
                     filter=lambda name, m: name.startswith("blocks."))
    return model


class Variant:
    """One variant's model, optimizer and batch: built, warmed up and its memory measured at
    construction; `timed(steps)` then times that many training steps."""

    def __init__(self, variant: str, cfg: dict, batch: int, device: str) -> None:
        self.model = model = build(variant, cfg, device)
        self.opt = opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.device, self.cuda = device, device.startswith("cuda")
        g = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(batch, TOKENS, cfg["width"], device=device, generator=g)
        y = torch.randint(0, 1000, (batch,), device=device, generator=g)

        def forward() -> torch.Tensor:
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)

        unfused = variant.endswith("_unfused")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            if unfused:  # the backward passes from dequantized tensors and torch's kernels
                import lowbit.nn.mesa as mesa

                mesa._FUSED_LAYER_NORM_BACKWARD = mesa._FUSED_ACTIVATION_BACKWARD = False
            try:
                forward().backward()
            finally:
                if unfused:
                    mesa._FUSED_LAYER_NORM_BACKWARD = mesa._FUSED_ACTIVATION_BACKWARD = True
            opt.step()

        self.step = step
        for _ in range(3):  # warm-up; AdamW allocates its states in the first step
            step()
        from lowbit.nn.mesa import saved_bytes

        opt.zero_grad(set_to_none=True)
        self.row = {"variant": variant, "saved_MiB": saved_bytes(forward, exclude=model) / 2**20}
        if self.cuda:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            self.row["activation_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            self.row["base_MiB"] = base / 2**20
        opt.zero_grad(set_to_none=True)  # idle variants hold no gradients
        self.times: list[float] = []
        self.round_medians: list[float] = []

    def timed(self, steps: int) -> None:
        times = []
        for _ in range(steps):
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                self.step()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                self.step()
                times.append(1e3 * (time.perf_counter() - t0))
        self.opt.zero_grad(set_to_none=True)
        self.times += times
        self.round_medians.append(statistics.median(times))


def measure_all(variants: list[str], cfg: dict, batch: int, steps: int, rounds: int,
                device: str) -> list[dict]:
    """Every variant built first, then `rounds` rounds of `steps` timed steps each, the variants
    in turn (in reverse order every other round), so that a drift of the machine over the run
    weighs on all of them alike; ms_per_step is the median over all of a variant's timed steps,
    round_ms the median of each round."""
    runs = [Variant(v, cfg, batch, device) for v in variants]
    for r in range(rounds):
        for run in (runs if r % 2 == 0 else runs[::-1]):
            run.timed(steps)
    rows = []
    for run in runs:
        row = run.row
        row["ms_per_step"] = statistics.median(run.times)
        row["round_ms"] = run.round_medians
        row["images_per_s"] = batch / row["ms_per_step"] * 1e3
        rows.append(row)
    del runs
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return rows


def _event_ms(fn, reps: int = 10) -> float:
    from torch_baselines import median_ms  # bench/ is the script's directory

    return median_ms(fn, reps=reps, warmup=2)


def kernel_rows(device: str) -> list[dict]:
    """The actquant kernels alone on bfloat16 tensors: bytes moved per element and GB/s, beside a
    bfloat16 copy (clone: 4 bytes per element) in the same run."""
    from lowbit import _torch_ops as ops

    rows = []
    for label, shape, dim, groups in (("heads [512, 12, 197, 64]", (512, 12, 197, 64), 1, 12),
                                      ("channel blocks [65536, 768] / 12", (65536, 768), -1, 12),
                                      # the SDPA core's qkv of ViT-B at batch 256: a group per
                                      # head of q, k and v, 64 channels each
                                      ("qkv [50432, 2304] / 36", (50432, 2304), -1, 36),
                                      ("tensor [65536, 768]", (65536, 768), -1, 1)):
        x = torch.randn(shape, device=device, dtype=torch.bfloat16)
        n = x.numel()
        gs = shape[dim] // groups
        a = torch.full((groups,), -1.0, device=device)
        b = torch.zeros(groups, device=device)
        codes = ops._actquant_quantize(x, a, b, dim, gs, True, False, 0.9, False, 0, 0, 0)
        cases = {
            "copy (clone)": (lambda: x.clone(), 4),
            "update + quantize": (lambda: ops._actquant_quantize(
                x, a, b, dim, gs, True, False, 0.9, False, 0, 0, 0), 5),
            "lagged (one pass)": (lambda: ops._actquant_quantize(
                x, a, b, dim, gs, True, True, 0.9, False, 0, 0, 0), 3),
            "frozen quantize": (lambda: ops._actquant_quantize(
                x, a, b, dim, gs, False, False, 0.9, False, 0, 0, 0), 3),
            "stochastic, update": (lambda: ops._actquant_quantize(
                x, a, b, dim, gs, True, False, 0.9, True, 16, 1, 2), 5),
            "dequantize -> bf16": (lambda: ops._actquant_dequantize(
                codes, a, b, dim, gs, torch.bfloat16), 3),
        }
        for op, (fn, per) in cases.items():
            ms = _event_ms(fn)
            rows.append({"tensor": label, "op": op, "elements": n, "bytes_per_element": per,
                         "ms": ms, "GBps": per * n / ms / 1e6})
        copy = rows[-len(cases)]["GBps"]
        for r in rows[-len(cases):]:
            r["vs_copy"] = r["GBps"] / copy
        del x, codes
    rows += backward_rows(device)
    torch.cuda.empty_cache()
    return rows


def backward_rows(device: str) -> list[dict]:
    """The fused backward passes from codes against the unfused ones (dequantize, then torch's
    kernels) at ViT-B's batch-256 sizes: LayerNorm over [50432, 768] (float32, as under
    autocast) and GELU over the MLP's hidden [50432, 3072] (bfloat16; `+ value`: also GELU's
    value, as MesaMlp's backward takes it). Bytes per element as each moves them."""
    from lowbit import _torch_ops as ops

    rows = []
    tokens = 256 * TOKENS
    x = torch.randn(tokens, 768, device=device) * 2
    a, b = torch.full((12,), -1.0, device=device), torch.zeros(12, device=device)
    codes = ops._actquant_quantize(x, a, b, -1, 64, True, False, 0.9, False, 0, 0, 0)
    gy, w, bias = torch.randn_like(x), torch.rand(768, device=device), torch.zeros(768,
                                                                               device=device)

    def ln_unfused():
        xd = ops._actquant_dequantize(codes, a, b, -1, 64, torch.float32)
        var, mean = torch.var_mean(xd, (1,), correction=0, keepdim=True)
        return torch.ops.aten.native_layer_norm_backward(gy, xd, [768], mean,
                                                         torch.rsqrt(var + 1e-6), w, bias,
                                                         [True, True, True])

    cases = {"copy float32 (clone)": (lambda: x.clone(), 8),
             "layer_norm backward, fused": (lambda: ops._actquant_layer_norm_backward(
                 codes, a, b, 64, gy, w, 1e-6), 9),
             "layer_norm backward, unfused": (ln_unfused, 21)}
    h = torch.randn(tokens, 3072, device=device, dtype=torch.bfloat16)
    ah, bh = torch.full((1,), -1.0, device=device), torch.zeros(1, device=device)
    hc = ops._actquant_quantize(h, ah, bh, -1, 3072, True, False, 0.9, False, 0, 0, 0)
    dy = torch.randn_like(h)

    def gelu_unfused(value: bool):
        hd = ops._actquant_dequantize(hc, ah, bh, -1, 3072, torch.bfloat16)
        v = F.gelu(hd) if value else None
        return torch.ops.aten.gelu_backward(dy, hd), v

    cases.update({
        "copy bfloat16 (clone)": (lambda: h.clone(), 4),
        "gelu backward, fused": (lambda: ops._actquant_activation_backward(
            hc, ah, bh, -1, 3072, "gelu", dy, False), 5),
        "gelu backward, unfused": (lambda: gelu_unfused(False), 9),
        "gelu backward + value, fused": (lambda: ops._actquant_activation_backward(
            hc, ah, bh, -1, 3072, "gelu", dy, True), 7),
        "gelu backward + value, unfused": (lambda: gelu_unfused(True), 13)})
    copy = 0.0
    for op, (fn, per) in cases.items():
        wide = op.startswith("gelu") or "bfloat16" in op
        n = (h if wide else x).numel()
        ms = _event_ms(fn)
        gbps = per * n / ms / 1e6
        copy = gbps if op.startswith("copy") else copy
        rows.append({"tensor": f"ViT-B batch 256 [{tokens}, {3072 if wide else 768}]", "op": op,
                     "elements": n, "bytes_per_element": per, "ms": ms, "GBps": gbps,
                     "vs_copy": gbps / copy})
    return rows


def train_comparison(steps: int, device: str, plot: str | None) -> dict:
    from lowbit import _tiny

    small = not device.startswith("cuda")
    kw = dict(width=64, depth=2, heads=2, lr=3e-3) if small else {}
    batch = 32 if small else 256
    res = {"bf16" if not small else "float32": _tiny.train("nn_linear", steps, batch, device, 0,
                                                           **kw)}
    res["mesa"] = _tiny.train("nn_linear", steps, batch, device, 0, mesa={}, **kw)
    res["mesa, fused MLP"] = _tiny.train("nn_linear", steps, batch, device, 0,
                                         mesa={"layers": ("attention", "mlp")}, **kw)
    base, m, mm = list(res.values())
    out = {"steps": steps, "batch": batch, "model": "small" if small else "default",
           "final": {k: v["final"] for k, v in res.items()},
           "final_ratio": m["final"] / base["final"],
           "final_ratio_fused_mlp": mm["final"] / base["final"],
           "ms_per_step": {k: 1e3 * v["s_per_step"] for k, v in res.items()},
           "losses": {k: v["losses"] for k, v in res.items()}}
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(7, 4))
            _tiny.draw_losses(ax, res, f"lowbit._tiny ViT with and without Mesa ({steps} steps)")
            fig.tight_layout()
            fig.savefig(plot, dpi=110)
        except ImportError:
            print("matplotlib is not installed: no plot", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--model", choices=sorted(MODELS), default="vit-b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per variant and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-kernels", action="store_true", help="leave out the kernels' GB/s")
    ap.add_argument("--variants", default="bf16,bf16_explicit,mesa_explicit,mesa_sdpa,"
                    "mesa_explicit_lagged,mesa_sdpa_lagged,mesa_sdpa_lagged_mlp,"
                    "mesa_sdpa_lagged_mlp_unfused")
    a = ap.parse_args(argv)
    cfg = dict(MODELS[a.model])
    if a.depth is not None:
        cfg["depth"] = a.depth
    t0 = time.perf_counter()
    rows = measure_all(a.variants.split(","), cfg, a.batch, a.steps, a.rounds, a.device)
    base = next((r for r in rows if r["variant"] == "bf16"), rows[0])
    for r in rows:
        key = "activation_MiB" if "activation_MiB" in r else "saved_MiB"
        r["saved_vs_bf16"] = 1 - r[key] / base[key]
        r["saved_tensors_vs_bf16"] = 1 - r["saved_MiB"] / base["saved_MiB"]
        r["overhead_vs_bf16"] = r["ms_per_step"] / base["ms_per_step"] - 1
    print(f"{a.model} x {cfg['depth']} blocks, batch {a.batch}, {TOKENS} tokens, bf16 autocast, "
          f"{a.device}")
    print(f"{'variant':21s} {'act MiB':>9s} {'saved MiB':>10s} {'saved vs bf16':>14s} "
          f"{'ms/step':>9s} {'img/s':>8s} {'overhead':>9s} {'rounds min-max':>16s}")
    for r in rows:
        act = r.get("activation_MiB", math.nan)
        print(f"{r['variant']:21s} {act:9.1f} {r['saved_MiB']:10.1f} "
              f"{100 * r['saved_vs_bf16']:13.1f}% {r['ms_per_step']:9.2f} "
              f"{r['images_per_s']:8.1f} {100 * r['overhead_vs_bf16']:8.1f}% "
              f"{min(r['round_ms']):8.2f}-{max(r['round_ms']):<7.2f}")
    kernels = []
    if a.device.startswith("cuda") and not a.no_kernels:
        kernels = kernel_rows(a.device)
        print(f"{'tensor (bf16)':34s} {'op':30s} {'B/elem':>6s} {'ms':>8s} {'GB/s':>8s} "
              f"{'vs copy':>8s}")
        for r in kernels:
            print(f"{r['tensor']:34s} {r['op']:30s} {r['bytes_per_element']:6d} {r['ms']:8.3f} "
                  f"{r['GBps']:8.0f} {r['vs_copy']:8.2f}")
    train = None
    if a.train_steps > 0:
        train = train_comparison(a.train_steps, a.device, a.plot)
        print(f"training ({train['steps']} steps, batch {train['batch']}): final losses "
              + ", ".join(f"{k} {v:.4f}" for k, v in train["final"].items())
              + f"; mesa / baseline = {train['final_ratio']:.4f}, fused MLP "
              f"{train['final_ratio_fused_mlp']:.4f} (goal within 1%)")
    meta = {"model": a.model, **cfg, "tokens": TOKENS, "batch": a.batch, "device": a.device,
            "torch": torch.__version__, "seconds": time.perf_counter() - t0}
    if a.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name()
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "rows": rows, "kernels": kernels, "train": train}, f, indent=1)
    print(f"wrote {a.out} ({meta['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
