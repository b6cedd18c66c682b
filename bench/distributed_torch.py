"""A training step of a decoder-only transformer under torch.distributed with a lowbit optimizer:
tokens per second per GPU and the peak memory per GPU, for FSDP2 (fully_shard per layer) or DDP.
Run it with torchrun on 1 GPU and on 2+ GPUs of one host to read the scaling:

    torchrun --nproc-per-node 1 bench/distributed_torch.py --mode fsdp2 --json fsdp_1.json
    torchrun --nproc-per-node 8 bench/distributed_torch.py --mode fsdp2 --json fsdp_8.json
    torchrun --nproc-per-node 2 bench/distributed_torch.py --mode ddp --layers 4   # smaller
    torchrun --nproc-per-node 2 bench/distributed_torch.py --device cpu --layers 1 --width 256 \\
        --steps 2 --warmup 1 --seq 64      # a quick check of the script on the CPU (gloo)

The default model: 22 layers of width 2048 (MLP 8192, 16 heads), vocabulary 32000, sequence 2048:
about 1.2e9 parameters, bfloat16 autocast, float32 parameters. Each rank runs --batch sequences
(its own tokens). Rank 0 prints one line per setting and writes --json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import lowbit.nn as lnn
import lowbit.optim as lo


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.norm2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width, bias=False)
        self.fc2 = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


OPTIMIZERS = {
    "AdamW8bit": lambda ps: lo.AdamW8bit(ps, lr=1e-4),
    "AdamW": lambda ps: lo.AdamW(ps, lr=1e-4),
    "Lion8bit": lambda ps: lo.Lion8bit(ps, lr=1e-5),
    "torch-AdamW": lambda ps: torch.optim.AdamW(ps, lr=1e-4, foreach=True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["fsdp2", "ddp"], default="fsdp2")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank per step")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optimizers", default="AdamW8bit,AdamW,torch-AdamW")
    ap.add_argument("--switchback", action="store_true",
                    help="the blocks' linear layers as SwitchBackLinear (int8)")
    ap.add_argument("--json")
    args = ap.parse_args()

    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    rows = []
    for name in args.optimizers.split(","):
        torch.manual_seed(0)
        model = Decoder(args.layers, args.width, args.heads, args.vocab).to(device)
        if args.switchback:
            lnn.convert(model.blocks, variant="switchback", fmt="int8")
        params = sum(p.numel() for p in model.parameters())
        if args.mode == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (world,))
            for blk in model.blocks:
                fully_shard(blk, mesh=mesh)
            fully_shard(model, mesh=mesh)
            net = model
        else:
            net = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[local] if cuda else None)
        opt = OPTIMIZERS[name](model.parameters())
        g = torch.Generator(device=device).manual_seed(rank)
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g,
                               device=device)

        def step() -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = net(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for _ in range(args.warmup):
            step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        seconds = (time.perf_counter() - t0) / args.steps
        peak = torch.cuda.max_memory_allocated(device) if cuda else 0
        peaks = [torch.tensor(float(peak), device=device)]
        dist.all_reduce(peaks[0], op=dist.ReduceOp.MAX)
        row = dict(optimizer=name, mode=args.mode, world=world, params=params,
                   tokens_per_s_per_gpu=args.batch * args.seq / seconds,
                   step_ms=seconds * 1e3, peak_gib_max_over_ranks=float(peaks[0]) / 2 ** 30,
                   switchback=args.switchback, layers=args.layers, width=args.width,
                   seq=args.seq, batch=args.batch, device=torch.cuda.get_device_name(device)
                   if cuda else "cpu", torch=torch.__version__)
        rows.append(row)
        if rank == 0:
            print(f"{name:12s} {args.mode} x{world}: {row['tokens_per_s_per_gpu']:.0f} tokens/s "
                  f"per GPU, {row['step_ms']:.1f} ms/step, peak "
                  f"{row['peak_gib_max_over_ranks']:.2f} GiB/GPU ({params / 1e9:.3f} G params)",
                  flush=True)
        del net, model, opt
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
