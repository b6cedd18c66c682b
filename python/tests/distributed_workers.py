"""Helpers of the distributed tests (test_distributed_*.py): start W processes with the gloo
backend on the CPU (torch.multiprocessing, a file store in a temporary folder: no ports), run a
worker function in each with a deadline, and collect what rank 0 (or every rank) returns.

The workers and the models live here, importable by the spawned processes; the tests compare
what the workers return with single-process runs of the same functions in the test process."""

from __future__ import annotations

import functools
import os
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lowbit.nn as lnn
import lowbit.optim as lo

# Every spawned group must finish within this (seconds); then its processes are killed and the
# test fails instead of hanging.
DEADLINE = 150
# torch threads of each spawned rank, and of the single-process references (like_a_worker).
WORKER_THREADS = 1


def _entry(rank: int, fn: Callable[..., Any], world: int, folder: str, args: tuple) -> None:
    torch.set_num_threads(WORKER_THREADS)
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world)
    try:
        out = fn(rank, world, *args)
        torch.save(out, os.path.join(folder, f"out{rank}.pt"))
    except BaseException:
        with open(os.path.join(folder, f"error{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def like_a_worker(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn run in this process with the ranks' torch threads (WORKER_THREADS): the sums of a
    CPU matmul (a gradient) may be split by the thread count, so the single-process references
    that the ranks' results are compared with bit for bit run with the ranks' thread count."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        threads = torch.get_num_threads()
        torch.set_num_threads(WORKER_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(threads)

    return run


def spawn(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Runs fn(rank, world, *args) in ``world`` processes of one gloo group; returns each
    rank's result (whatever torch.save takes)."""
    with tempfile.TemporaryDirectory() as folder:
        ctx = mp.start_processes(_entry, args=(fn, world, folder, args), nprocs=world,
                                 join=False, start_method="spawn")
        end = time.monotonic() + DEADLINE
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > end:
                    raise TimeoutError(f"{fn.__name__} on {world} processes: not done within "
                                       f"{DEADLINE} s")
        except BaseException:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            errors = [open(os.path.join(folder, n)).read() for n in sorted(os.listdir(folder))
                      if n.startswith("error")]
            if errors:
                raise RuntimeError("\n".join(errors)) from None
            raise
        return [torch.load(os.path.join(folder, f"out{r}.pt"), weights_only=False)
                for r in range(world)]


# ---- models and data -----------------------------------------------------------------------------

IN, OUT = 256, 8


def mlp(seed: int, switchback: bool = True) -> torch.nn.Module:
    """Parameters of every kind that the 8-bit rule tells apart: [24, 256] and [6, 512] weights
    (rows of whole 256-element blocks: 8-bit states), a [512, 24] weight (rows of 24: 32-bit),
    1-D biases (32-bit). Under FSDP2 on 4 ranks the [6, 512] weight's shards are 2, 2, 2 and 0
    rows: one rank holds an empty shard."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(IN, 24), torch.nn.GELU(), torch.nn.Linear(24, 512),
                              torch.nn.GELU(), torch.nn.Linear(512, 6), torch.nn.GELU(),
                              torch.nn.Linear(6, OUT))
    return lnn.convert(net, variant="switchback", fmt="int8") if switchback else net


def batch(step: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(rows, IN, generator=g), torch.randn(rows, OUT, generator=g)


def loss_of(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(net(x), y)


def grads_for(step: int, shapes: list[torch.Size]) -> list[torch.Tensor]:
    """Deterministic full gradients of a step (the same on every rank)."""
    g = torch.Generator().manual_seed(7000 + step)
    return [torch.randn(s, generator=g) * 0.1 for s in shapes]


OPTIMIZERS = {
    "AdamW8bit": (lo.AdamW8bit, dict(lr=1e-2, weight_decay=0.1)),
    "Adam8bit": (lo.Adam8bit, dict(lr=1e-2)),
    "Lion8bit": (lo.Lion8bit, dict(lr=1e-3, weight_decay=0.1)),
    "SGD8bit": (lo.SGD8bit, dict(lr=0.05, momentum=0.9)),
    "RMSprop8bit": (lo.RMSprop8bit, dict(lr=1e-3)),
    "Adagrad8bit": (lo.Adagrad8bit, dict(lr=0.05, initial_accumulator_value=0.1)),
}


# Under DDP only (FSDP2 refuses its per-tensor RMS on shards).
DDP_ONLY = {"StableAdamW8bit": (lo.StableAdamW8bit, dict(lr=1e-2))}


def make_opt(name: str, params: Any) -> lo.LowbitOptimizer:
    cls, kw = OPTIMIZERS[name] if name in OPTIMIZERS else DDP_ONLY[name]
    return cls(params, min_8bit_size=0, **kw)


def full(t: Any) -> Any:
    """A DTensor gathered whole; anything else as it is."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.full_tensor()
    return t.detach().clone() if isinstance(t, torch.Tensor) else t


def snapshot(net: torch.nn.Module, opt: lo.LowbitOptimizer) -> dict[str, Any]:
    """Parameters and optimizer states by parameter name, gathered whole (every rank takes part
    in the gathers)."""
    params = {n: full(p) for n, p in net.named_parameters()}
    states = {}
    for n, p in net.named_parameters():
        states[n] = {k: full(v) for k, v in opt.state[p].items()}
    return {"params": params, "states": states}


# ---- DDP -----------------------------------------------------------------------------------------

def ordered_mean_hook(state, bucket):  # no annotations: DDP checks them as objects
    """A DDP communication hook: the mean of the ranks' gradients summed in rank order
    (all_gather, then g0 + g1 + ...), so that a single process can sum in the same order."""
    buf = bucket.buffer()
    world = dist.get_world_size()
    parts = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(parts, buf)
    total = parts[0].clone()
    for t in parts[1:]:
        total += t
    total /= world
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(total)
    return fut


def ddp_worker(rank: int, world: int, opt_name: str, steps: int, ordered: bool) -> dict:
    net = mlp(0)
    model = torch.nn.parallel.DistributedDataParallel(net)
    if ordered:
        model.register_comm_hook(None, ordered_mean_hook)
    opt = make_opt(opt_name, model.parameters())
    first_grads = None
    for s in range(steps):
        x, y = batch(s)
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        opt.zero_grad()
        loss_of(model, xs, ys).backward()
        if s == 0:
            first_grads = {n: p.grad.clone() for n, p in net.named_parameters()}
        opt.step()
    out = snapshot(net, opt)
    out["first_grads"] = first_grads
    out["kinds"] = [type(m).__name__ for m in net]
    return out


def local_grads(net: torch.nn.Module, step: int, world: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's gradient of step ``step`` (its slice of the global batch), in one process."""
    x, y = batch(step)
    out = []
    for xs, ys in zip(x.chunk(world), y.chunk(world)):
        net.zero_grad()
        loss_of(net, xs, ys).backward()
        out.append({n: p.grad.clone() for n, p in net.named_parameters()})
    net.zero_grad()
    return out


@like_a_worker
def ddp_reference(world: int, opt_name: str, steps: int) -> dict:
    """The single-process run on the same global batches, the gradients of the ranks' slices
    averaged in rank order (ordered_mean_hook's order)."""
    net = mlp(0)
    opt = make_opt(opt_name, net.parameters())
    params = dict(net.named_parameters())
    first = None
    for s in range(steps):
        per_rank = local_grads(net, s, world)
        for n, p in params.items():
            total = per_rank[0][n].clone()
            for g in per_rank[1:]:
                total += g[n]
            total /= world
            p.grad = total
        if s == 0:
            first = (per_rank, {n: p.grad.clone() for n, p in params.items()})
        opt.step()
    out = snapshot(net, opt)
    out["per_rank"], out["mean"] = first
    return out


# ---- FSDP2 ---------------------------------------------------------------------------------------

def shard(net: torch.nn.Module, world: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for m in net:
        if any(True for _ in m.parameters()):
            fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return mesh


def set_grads(net: torch.nn.Module, grads: list[torch.Tensor]) -> None:
    """Gives each parameter its (full) gradient: a DTensor's rank gets its own rows."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for p, g in zip(net.parameters(), grads):
        if isinstance(p, DTensor):
            p.grad = distribute_tensor(g, p.device_mesh, p.placements, src_data_rank=None)
        else:
            p.grad = g.clone()


def given_grads_run(net: torch.nn.Module, opt: lo.LowbitOptimizer, steps: int,
                    first: int = 0) -> None:
    shapes = [p.shape for p in net.parameters()]
    for s in range(first, first + steps):
        set_grads(net, grads_for(s, shapes))
        opt.step()
        opt.zero_grad()


def fsdp_worker(rank: int, world: int, names: list[str], steps: int) -> dict:
    """Per optimizer: the same full gradients on any mesh, `steps` steps; and one training run
    with backward through FSDP2 (each rank a slice of the global batch); and the refusals."""
    out: dict[str, Any] = {}
    for name in names:
        net = mlp(0)
        shard(net, world)
        opt = make_opt(name, net.parameters())
        given_grads_run(net, opt, steps)
        snap = snapshot(net, opt)
        snap["local_absmax"] = {n: tuple(opt.state[p]["exp_avg_absmax"].to_local().shape)
                                for n, p in net.named_parameters()
                                if "exp_avg_absmax" in opt.state[p]}
        out[name] = snap
    # Training: FSDP2 reduce-scatters the gradients of the ranks' batch slices.
    net = mlp(0)
    shard(net, world)
    opt = make_opt("AdamW8bit", net.parameters())
    x, y = batch(0)
    loss_of(net, x.chunk(world)[rank], y.chunk(world)[rank]).backward()
    out["train_grads"] = {n: full(p.grad) for n, p in net.named_parameters()}
    opt.step()
    out["train"] = snapshot(net, opt)
    # What the kernels cannot do on a shard is refused.
    refusals = {}
    for key, cls, kw in [("stable", lo.StableAdamW8bit, {}),
                         ("clip", lo.AdamW8bit, dict(percentile_clipping=50)),
                         ("sr", lo.AdamW8bit, dict(stochastic_rounding=True))]:
        net = mlp(0)
        shard(net, world)
        o = cls(net.parameters(), min_8bit_size=0, **kw)
        set_grads(net, grads_for(0, [p.shape for p in net.parameters()]))
        try:
            o.step()
            refusals[key] = None
        except RuntimeError as e:
            refusals[key] = str(e)
    # 8-bit states of a parameter sharded on dim 1 would cut its rows' blocks.
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    from torch.distributed.device_mesh import init_device_mesh

    net = mlp(0)
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(net, mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 and
                p.shape[1] % world == 0 else Shard(0))  # FSDP2 shards dim 1 evenly only
    o = make_opt("AdamW8bit", net.parameters())
    set_grads(net, grads_for(0, [p.shape for p in net.parameters()]))
    try:
        o.step()
        refusals["dim1"] = None
    except RuntimeError as e:
        refusals["dim1"] = str(e)
    out["refusals"] = refusals
    return out


@like_a_worker
def plain_given_grads(name: str, steps: int) -> dict:
    net = mlp(0)
    opt = make_opt(name, net.parameters())
    given_grads_run(net, opt, steps)
    return snapshot(net, opt)


# ---- torch.distributed.checkpoint ----------------------------------------------------------------

def _dcp_state(net: torch.nn.Module, opt: lo.LowbitOptimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(net, opt)
    return {"model": model_sd, "optim": optim_sd}


def _dcp_load(net: torch.nn.Module, opt: lo.LowbitOptimizer, path: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    sd = _dcp_state(net, opt)
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(net, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def ckpt_save_worker(rank: int, world: int, name: str, path: str, steps: int,
                     more: int) -> dict:
    """`steps` steps, a checkpoint, `more` steps: what the run reaches without stopping."""
    import torch.distributed.checkpoint as dcp

    net = mlp(0)
    shard(net, world)
    opt = make_opt(name, net.parameters())
    given_grads_run(net, opt, steps)
    saved = snapshot(net, opt)
    dcp.save(_dcp_state(net, opt), checkpoint_id=path)
    given_grads_run(net, opt, more, first=steps)
    return {"saved": saved, "final": snapshot(net, opt), "rng_offset": opt.rng_offset}


def ckpt_load_worker(rank: int, world: int, name: str, path: str, steps: int,
                     more: int) -> dict:
    """A fresh model and optimizer on this mesh, loaded from the checkpoint; `more` steps."""
    net = mlp(1)  # other initial values: everything must come from the checkpoint
    shard(net, world)
    opt = make_opt(name, net.parameters())
    _dcp_load(net, opt, path)
    loaded = snapshot(net, opt)
    given_grads_run(net, opt, more, first=steps)
    return {"loaded": loaded, "final": snapshot(net, opt), "rng_offset": opt.rng_offset}


@like_a_worker
def ckpt_load_single(name: str, path: str, steps: int, more: int) -> dict:
    """The same into a plain (unsharded) model and optimizer in this process."""
    net = mlp(1)
    opt = make_opt(name, net.parameters())
    _dcp_load(net, opt, path)
    loaded = snapshot(net, opt)
    given_grads_run(net, opt, more, first=steps)
    return {"loaded": loaded, "final": snapshot(net, opt), "rng_offset": opt.rng_offset}
