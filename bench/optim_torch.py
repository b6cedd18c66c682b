"""One optimizer step over a model of real tensor shapes, lowbit.optim against the optimizers
users would pick instead, all measured in the same run: torch's AdamW (fused on CUDA, foreach on
the CPU), bitsandbytes' AdamW8bit and Lion8bit and torch-optimi's StableAdamW where importable.
The model: `--layers` ViT-H-sized transformer layers (width 1280, MLP 5120; 12 tensors each, 51
layers: 612 tensors, 1.004e9 float32 parameters), random gradients. Per optimizer: milliseconds
per step (CUDA events on the GPU), the ratio to torch's AdamW, optimizer-state bytes per
parameter, and on CUDA the peak memory of the step (torch.cuda.max_memory_allocated, after the
states exist). A device-to-device copy of the parameters gives the copy bandwidth of the run,
and lowbit's rows report their bandwidth for the bytes they must move as a fraction of it.

    python bench/optim_torch.py --device cuda --layers 51 --steps 20 [--json out.json]
        [--train-tokens 4096]   # also a training step's peak memory and time
    python bench/optim_torch.py --device cpu --layers 1 --steps 3     # a quick check
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import lowbit.optim as lo

# Bytes one step moves per parameter (float32 parameters, 8-bit states in blocks of 256; tensors
# below 4096 elements keep 32-bit states and are counted as such): docs/techniques/optimizers.md.
MOVED = {"lowbit AdamW (32-bit)": (28.0, 28.0),
         "lowbit AdamW8bit": (16.0 + 16 / 256, 28.0),
         "lowbit StableAdamW8bit": (21.0 + 20 / 256, 33.0),
         "lowbit Lion8bit": (14.0 + 8 / 256, 20.0)}


def shapes(layers: int) -> list[tuple[int, ...]]:
    w, mlp = 1280, 5120
    one = [(3 * w, w), (3 * w,), (w, w), (w,), (mlp, w), (mlp,), (w, mlp), (w,), (w,), (w,), (w,),
           (w,)]
    return one * layers


def make_params(layers: int, device: str) -> list[torch.nn.Parameter]:
    g = torch.Generator(device=device).manual_seed(0)
    ps = []
    for s in shapes(layers):
        p = torch.nn.Parameter(torch.randn(s, generator=g, device=device) * 0.02)
        p.grad = torch.randn(s, generator=g, device=device) * 1e-3
        ps.append(p)
    return ps


def contenders(device: str):
    yield "torch AdamW", lambda ps: torch.optim.AdamW(
        ps, lr=1e-3, **({"fused": True} if device == "cuda" else {"foreach": True}))
    yield "lowbit AdamW (32-bit)", lambda ps: lo.AdamW(ps, lr=1e-3)
    yield "lowbit AdamW8bit", lambda ps: lo.AdamW8bit(ps, lr=1e-3)
    yield "lowbit StableAdamW8bit", lambda ps: lo.StableAdamW8bit(ps, lr=1e-3)
    yield "lowbit Lion8bit", lambda ps: lo.Lion8bit(ps, lr=1e-4)
    if device == "cuda":
        try:
            import bitsandbytes as bnb

            yield "bitsandbytes AdamW8bit", lambda ps: bnb.optim.AdamW8bit(ps, lr=1e-3)
            yield "bitsandbytes Lion8bit", lambda ps: bnb.optim.Lion8bit(ps, lr=1e-4)
        except Exception as e:  # not installed, or no wheel for this CUDA
            print(f"# bitsandbytes not used: {type(e).__name__}: {e}")
    try:
        import optimi

        yield "torch-optimi StableAdamW", lambda ps: optimi.StableAdamW(ps, lr=1e-3)
    except Exception as e:
        print(f"# torch-optimi not used: {type(e).__name__}: {e}")


def state_bytes(opt: torch.optim.Optimizer) -> int:
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                total += v.numel() * v.element_size()
    return total


def timed(fn, steps: int, device: str) -> float:
    """Milliseconds per call."""
    if device == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(steps):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / steps
    t = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t) * 1e3 / steps


class Layer(torch.nn.Module):
    """A ViT-H-shaped layer's parameters (the 12 tensors of shapes()) in a forward pass that uses
    every one of them (attention's softmax left out: it holds no parameters)."""

    def __init__(self, w: int = 1280, mlp: int = 5120) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(w), torch.nn.LayerNorm(w)
        self.qkv, self.proj = torch.nn.Linear(w, 3 * w), torch.nn.Linear(w, w)
        self.fc1, self.fc2 = torch.nn.Linear(w, mlp), torch.nn.Linear(mlp, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        x = x + self.proj(q * torch.sigmoid(k) + v)
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def train_step_memory(layers: int, tokens: int, steps: int) -> list[dict]:
    """Peak memory (torch.cuda.max_memory_allocated) and time of a training step (forward and
    backward under bfloat16 autocast, then the optimizer's step) of `layers` Layers with float32
    parameters, per optimizer, after one step has made the states."""
    rows = []
    for name, make in contenders("cuda"):
        if "bitsandbytes" in name or "optimi" in name:
            continue
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(Layer() for _ in range(layers))).cuda()
        opt = make(list(model.parameters()))
        x = torch.randn(tokens, 1280, device="cuda")

        def step() -> None:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = timed(step, steps, "cuda")
        n = sum(p.numel() for p in model.parameters())
        rows.append({"optimizer": name, "params": n, "tokens": tokens,
                     "peak_bytes": torch.cuda.max_memory_allocated(),
                     "peak_bytes_per_param": torch.cuda.max_memory_allocated() / n,
                     "ms_per_train_step": ms})
        print(json.dumps(rows[-1]))
        del model, opt, x
        torch.cuda.empty_cache()
    base = rows[0]["peak_bytes"] if rows else None
    for r in rows:
        r["peak_vs_torch_adamw"] = r["peak_bytes"] / base if base else None
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=51)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--train-tokens", type=int, default=0,
                    help="CUDA: also a training step of the same layers on this many tokens "
                         "(peak memory and time per optimizer)")
    args = ap.parse_args()
    dev = args.device
    params = make_params(args.layers, dev)
    n = sum(p.numel() for p in params)
    n_small = sum(p.numel() for p in params if p.numel() < 4096)
    print(f"# {len(params)} tensors, {n} parameters on {dev}")
    flat = torch.cat([p.detach().flatten() for p in params])
    dst = torch.empty_like(flat)
    copy_ms = timed(lambda: dst.copy_(flat), max(3, args.steps), dev)
    copy_bps = 2 * flat.numel() * 4 / (copy_ms / 1e3)
    del flat, dst
    print(f"# copy: {copy_ms:.3f} ms for {n * 4 / 1e9:.2f} GB, {copy_bps / 1e9:.1f} GB/s")
    rows = []
    base = None
    for name, make in contenders(dev):
        ps = make_params(args.layers, dev)
        opt = make(ps)
        opt.step()  # the states exist from here on
        if dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        ms = timed(opt.step, args.steps, dev)
        row = {"optimizer": name, "ms_per_step": ms, "state_bytes_per_param": state_bytes(opt) / n}
        if dev == "cuda":
            row["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - before
            row["allocated_bytes"] = before
        if name in MOVED:
            big, small = MOVED[name]
            moved = big * (n - n_small) + small * n_small
            row["bytes_moved_per_param"] = moved / n
            row["of_copy"] = moved / (ms / 1e3) / copy_bps
        if name == "torch AdamW":
            base = ms
        row["vs_torch_adamw"] = base / ms if base else None
        rows.append(row)
        print(json.dumps(row))
        del opt, ps
        if dev == "cuda":
            torch.cuda.empty_cache()
    train = []
    if dev == "cuda" and args.train_tokens > 0:
        del params
        torch.cuda.empty_cache()
        train = train_step_memory(args.layers, args.train_tokens, max(3, args.steps // 4))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "tensors": len(shapes(args.layers)), "params": n,
                       "copy_bytes_per_s": copy_bps, "rows": rows, "train_step": train}, f,
                      indent=1)


if __name__ == "__main__":
    main()
