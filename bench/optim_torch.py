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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=51)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", default=None)
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "tensors": len(params), "params": n,
                       "copy_bytes_per_s": copy_bps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
