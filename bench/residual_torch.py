"""Residual master weights (docs/techniques/residual.md) on a GPT-2-small-sized Transformer
(12 layers, width 768, 12 heads, vocabulary 50257 with a tied head: 124M parameters), one
training step (forward, backward, optimizer) per configuration, all measured in the same run:

- baseline: float32 parameters, bf16 autocast, torch's fused AdamW (float32 master, float32 states)
- lowbit AdamW / AdamW8bit with a float32 master (the same autocast forward)
- bfloat16 parameters + 16- or 8-bit residual, 32- or 8-bit states, ordinary step and with the
  step fused into the backward pass (lowbit.optim.fuse_into_backward)

Per configuration: bytes per parameter of weights + residual + optimizer state + gradient,
counted from the tensors (the gradient: all of them, or the largest single one when the step is
fused into the backward); on CUDA the memory held between steps (weights, residuals, states) and
the peak torch.cuda.max_memory_allocated over the timed training steps (states already
allocated; activations included, so --batch and --seq move it) and its ratio to the baseline; milliseconds per training step (CUDA events) and the optimizer
step alone where it is separate, with the ratio to the same lowbit optimizer with a float32
master. Then a small training run on a tiny MLP: bfloat16 + residual16 fused into the backward
against a float32 master whose forward sees the master rounded by the same rule (the losses must
be equal bit for bit), with residual8 and a plain bfloat16 model (no master) beside them.

    python bench/residual_torch.py --json residual.json          # H200: well under 90 s
    python bench/residual_torch.py --checkpoint                  # blocks recomputed in backward
    python bench/residual_torch.py --device cpu --quick          # a quick CPU check
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.utils.checkpoint
from torch import nn

import lowbit.optim as lo
from lowbit._report_residual import tiny_run  # the report's tiny training run


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        a = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                       v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    """checkpoint: each block under torch.utils.checkpoint (its activations recomputed in the
    backward pass; only the blocks' inputs are kept), the same for every configuration."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq: int,
                 checkpoint: bool = False) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.checkpoint = checkpoint

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) \
                if self.checkpoint else b(x)
        return self.ln(x) @ self.tok.weight.t()  # tied head


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


class Timer:
    def __init__(self, dev: str) -> None:
        self.dev = dev

    def __enter__(self) -> "Timer":
        if self.dev == "cuda":
            self.a, self.b = (torch.cuda.Event(enable_timing=True),
                              torch.cuda.Event(enable_timing=True))
            self.a.record()
        else:
            self.t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.dev == "cuda":
            self.b.record()
            self.b.synchronize()
            self.ms = self.a.elapsed_time(self.b)
        else:
            self.ms = (time.perf_counter() - self.t) * 1e3


CONFIGS = [
    # name, params dtype, optimizer factory, fused
    ("baseline: fp32 master, autocast, torch AdamW", "fp32",
     lambda ps, dev: torch.optim.AdamW(ps, lr=1e-4, **({"fused": True} if dev == "cuda" else {})),
     False),
    ("fp32 master, lowbit AdamW", "fp32", lambda ps, dev: lo.AdamW(ps, lr=1e-4), False),
    ("fp32 master, lowbit AdamW8bit", "fp32", lambda ps, dev: lo.AdamW8bit(ps, lr=1e-4), False),
    ("bf16 + residual16, AdamW", "bf16",
     lambda ps, dev: lo.AdamW(ps, lr=1e-4, master_weights="residual16"), False),
    ("bf16 + residual16, AdamW, fused", "bf16",
     lambda ps, dev: lo.AdamW(ps, lr=1e-4, master_weights="residual16"), True),
    ("bf16 + residual8, AdamW, fused", "bf16",
     lambda ps, dev: lo.AdamW(ps, lr=1e-4, master_weights="residual8"), True),
    ("bf16 + residual16, AdamW8bit", "bf16",
     lambda ps, dev: lo.AdamW8bit(ps, lr=1e-4, master_weights="residual16"), False),
    ("bf16 + residual16, AdamW8bit, fused", "bf16",
     lambda ps, dev: lo.AdamW8bit(ps, lr=1e-4, master_weights="residual16"), True),
    ("bf16 + residual8, AdamW8bit, fused", "bf16",
     lambda ps, dev: lo.AdamW8bit(ps, lr=1e-4, master_weights="residual8"), True),
]
# The same optimizer with a float32 master, for the step-time ratio.
SAME_WITH_MASTER = {"AdamW": "fp32 master, lowbit AdamW", "AdamW8bit": "fp32 master, lowbit AdamW8bit"}


def persistent_bytes(model: nn.Module, opt: torch.optim.Optimizer,
                     fused: bool) -> dict[str, int]:
    n = {"weights": 0, "residual": 0, "state": 0, "grad": 0}
    for p in model.parameters():
        n["weights"] += p.numel() * p.element_size()
        # the gradients a step holds, in the parameter's dtype: all of them, or with the step
        # fused into the backward one at a time (the largest counted)
        g = p.numel() * p.element_size()
        n["grad"] = max(n["grad"], g) if fused else n["grad"] + g
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                n["residual" if k == "residual" else "state"] += v.numel() * v.element_size()
    return n


def run_config(name, kind, make, fused, args, dev, data):
    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.layers, args.heads, args.seq,
                args.checkpoint).to(dev)
    opt = make(list(model.parameters()), dev)
    if kind == "bf16":
        opt.to_residual(torch.bfloat16)
    handle = lo.fuse_into_backward(model, opt) if fused else None
    autocast = kind == "fp32"

    def loss_of(idx, tgt):
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
            logits = model(idx)
        return nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))

    step_ms, opt_ms, losses = [], [], []

    def train_step(i):
        idx, tgt = data[i % len(data)]
        with Timer(dev) as whole:
            loss = loss_of(idx, tgt)
            loss.backward()
            if not fused:
                with Timer(dev) as o:
                    opt.step()
                opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        return whole.ms, (None if fused else o.ms)

    for i in range(args.warmup):
        train_step(i)
    sync(dev)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    for i in range(args.steps):
        w, o = train_step(args.warmup + i)
        step_ms.append(w)
        if o is not None:
            opt_ms.append(o)
    n_params = sum(p.numel() for p in model.parameters())
    b = persistent_bytes(model, opt, fused)
    row = {"config": name, "params": n_params,
           "bytes_per_param": {k: v / n_params for k, v in b.items()},
           "bytes_per_param_total": sum(b.values()) / n_params,
           "ms_per_train_step": sorted(step_ms)[len(step_ms) // 2],
           "ms_per_optimizer_step": sorted(opt_ms)[len(opt_ms) // 2] if opt_ms else None,
           "last_loss": losses[-1]}
    if dev == "cuda":
        row["peak_bytes"] = torch.cuda.max_memory_allocated()
        row["allocated_between_steps"] = before
    if handle is not None:
        handle.remove()
    del model, opt
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a 2-layer, width-128 model (CPU check)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tiny-steps", type=int, default=500, help="0 leaves the tiny MLP out")
    ap.add_argument("--checkpoint", action="store_true",
                    help="activation checkpointing of every block, in every configuration")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.vocab, args.width, args.layers, args.heads = 50257, 768, 12, 12
    if args.quick:
        args.vocab, args.width, args.layers, args.heads = 1000, 128, 2, 4
        args.seq, args.batch, args.steps, args.warmup = min(args.seq, 64), 2, 2, 1
        args.tiny_steps = min(args.tiny_steps, 100)
    dev = args.device
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev),
             torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev))
            for _ in range(4)]
    rows = [run_config(*c, args, dev, data) for c in CONFIGS]
    by = {r["config"]: r for r in rows}
    base = rows[0]
    for r in rows:
        if "peak_bytes" in r:
            r["peak_vs_baseline"] = r["peak_bytes"] / base["peak_bytes"]
            r["peak_reduction"] = 1.0 - r["peak_vs_baseline"]
        opt_name = "AdamW8bit" if "AdamW8bit" in r["config"] else "AdamW"
        ref = by[SAME_WITH_MASTER[opt_name]]
        if r["config"].startswith("bf16"):
            r["train_step_vs_fp32_master"] = r["ms_per_train_step"] / ref["ms_per_train_step"]
            if r["ms_per_optimizer_step"] is not None:
                r["optimizer_step_vs_fp32_master"] = (r["ms_per_optimizer_step"] /
                                                      ref["ms_per_optimizer_step"])
    tiny = tiny_run(dev, args.tiny_steps) if args.tiny_steps > 0 else None
    print(f"# {rows[0]['params']} parameters, batch {args.batch} x seq {args.seq}, {dev}"
          f"{', blocks checkpointed' if args.checkpoint else ''}")
    head = (f"{'config':44s} {'B/param':>7s} {'(w+r+state+grad)':>18s} {'held GB':>8s} "
            f"{'peak GB':>8s} {'vs base':>7s} {'train ms':>9s} {'opt ms':>8s} "
            f"{'vs fp32 master':>14s}")
    print(head)
    for r in rows:
        bp = r["bytes_per_param"]
        split = f"{bp['weights']:.1f}+{bp['residual']:.1f}+{bp['state']:.2f}+{bp['grad']:.1f}"
        peak = f"{r['peak_bytes'] / 1e9:8.3f}" if "peak_bytes" in r else f"{'-':>8s}"
        held = (f"{r['allocated_between_steps'] / 1e9:8.3f}" if "peak_bytes" in r
                else f"{'-':>8s}")
        vs = f"{r['peak_vs_baseline']:7.3f}" if "peak_vs_baseline" in r else f"{'-':>7s}"
        om = f"{r['ms_per_optimizer_step']:8.2f}" if r["ms_per_optimizer_step"] else f"{'-':>8s}"
        ratio = r.get("optimizer_step_vs_fp32_master", r.get("train_step_vs_fp32_master"))
        rs = f"{ratio:14.3f}" if ratio is not None else f"{'-':>14s}"
        print(f"{r['config']:44s} {r['bytes_per_param_total']:7.2f} {split:>18s} {held} {peak} {vs} "
              f"{r['ms_per_train_step']:9.2f} {om} {rs}")
    if tiny is not None:
        print(f"# tiny MLP, {tiny['steps']} steps of AdamW lr {tiny['lr']}:")
        for k, s in tiny["summary"].items():
            print(f"#   {k:28s} final loss {s['final_loss']:.6f}  equal to fp32 master: "
                  f"{s['equal_to_fp32_master']}  max |loss diff| {s['max_abs_loss_diff']:.3g}")
    elapsed = time.perf_counter() - t0
    print(f"# {elapsed:.1f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__,
                       "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
                       "batch": args.batch, "seq": args.seq,
                       "checkpoint": args.checkpoint, "model": {
                           "vocab": args.vocab, "width": args.width, "layers": args.layers,
                           "heads": args.heads}, "rows": rows, "tiny": tiny,
                       "seconds": elapsed}, f, indent=1)


if __name__ == "__main__":
    main()
