"""Parameters as lowbit.optim sees them under torch.distributed (docs/distributed.md).

A parameter sharded by FSDP2 (``torch.distributed.fsdp.fully_shard``) is a DTensor: its shape is
the global one, its local tensor the rank's shard of whole rows (FSDP2 shards dim 0, in
``torch.chunk`` pieces: ceil(rows / world) rows per rank, the last ranks' pieces shorter or
empty). The optimizer's kernels run on the local tensors and do no communication; what depends
on the parameter as a whole is decided here from its global shape, so that the updates are the
same on any mesh:

- 8-bit states only for parameters whose rows (numel / shape[0] elements) are a whole number of
  blocks: every row, hence every dim-0 shard, then starts on a block boundary, and the blocks of
  a shard are exactly the global blocks of its rows (:func:`blocks_align`). Other parameters (1-D
  ones, rows of any other length) keep 32-bit states, with and without FSDP2 alike.
- The absmax of an 8-bit state is shaped [rows, blocks per row], so that it shards on dim 0 with
  the parameter and the codes (:func:`absmax_shape`).
- States of a DTensor parameter are DTensors with its mesh and placements (torch's own
  optimizers do the same), which torch.distributed.checkpoint saves and reshards.

This module imports torch; torch.distributed may be absent (then nothing is a DTensor).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # a torch without torch.distributed
    DTensor = None  # type: ignore[assignment,misc]
    Replicate = Shard = None  # type: ignore[assignment,misc]

__all__ = ["absmax_shape", "blocks_align", "is_dtensor", "is_sharded", "like", "local"]

# Kernels whose step reduces over the whole tensor (StableAdamW's RMS; LAMB's and LARS's trust
# ratios): on a shard they would reduce over the shard alone.
PER_TENSOR_KERNELS = frozenset({"stable_adamw", "lamb", "lars"})


def is_dtensor(t: Any) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank's part of a DTensor (sharing its storage), a plain tensor as it is."""
    return t.to_local() if is_dtensor(t) else t


def is_sharded(t: torch.Tensor) -> bool:
    """Whether the rank holds only part of t (a DTensor with a Shard placement)."""
    return is_dtensor(t) and any(not isinstance(pl, Replicate) for pl in t.placements)


def blocks_align(shape: Sequence[int], block: int) -> bool:
    """Whether a parameter of this global shape may keep 8-bit block-wise states: two or more
    dimensions, and rows (numel / shape[0]) a whole number of blocks."""
    if len(shape) < 2 or shape[0] == 0:
        return False
    numel = 1
    for d in shape:
        numel *= int(d)
    row = numel // int(shape[0])
    return row > 0 and row % block == 0


def absmax_shape(shape: Sequence[int], block: int) -> tuple[int, int]:
    """The absmax of an 8-bit state of a parameter of this (global) shape: [rows, blocks per
    row]."""
    row = 1
    for d in shape[1:]:
        row *= int(d)
    return int(shape[0]), row // block


def check_placements(p: torch.Tensor, who: str) -> None:
    """8-bit states need the blocks of each shard to be whole rows' blocks: the parameter may be
    sharded on dim 0 only (FSDP2's default), replicated on any other mesh dimension."""
    if not is_dtensor(p):
        return
    for pl in p.placements:
        if isinstance(pl, Replicate) or (isinstance(pl, Shard) and pl.dim == 0):
            continue
        raise RuntimeError(f"{who}: 8-bit states of a parameter placed {tuple(p.placements)} "
                           "are not supported; shard parameters on dim 0 only (FSDP2's "
                           "default) or keep their states in 32 bits (override(p, bits=32))")


def like(p: torch.Tensor, value: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """``value`` (the rank's part, a plain tensor) as a state of ``p``: for a DTensor p, the
    DTensor of global ``shape`` with p's mesh and placements; for a plain p, value itself."""
    if not is_dtensor(p):
        return value
    shape = tuple(int(d) for d in shape)
    stride = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        stride[k] = stride[k + 1] * shape[k + 1]
    return DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                              shape=torch.Size(shape), stride=tuple(stride))


def check_step(p: torch.Tensor, kernel: str, group: dict[str, Any], stochastic: bool,
               who: str) -> None:
    """Refuses what the kernels cannot do on a shard (docs/distributed.md)."""
    if not is_sharded(p):
        return
    if kernel in PER_TENSOR_KERNELS:
        raise RuntimeError(f"{who}: the step reduces over the whole parameter (a per-tensor "
                           "RMS or trust ratio), which a sharded (FSDP2) parameter's rank does "
                           "not hold; use an element-wise optimizer (AdamW, Lion, SGD, ...) "
                           "under FSDP2, or DDP")
    if group.get("percentile_clipping", 100) != 100:
        raise RuntimeError(f"{who}: percentile_clipping takes the norm of the whole gradient, "
                           "which a sharded (FSDP2) parameter's rank does not hold; it is not "
                           "supported under FSDP2")
    if group.get("master_weights") is not None:
        raise RuntimeError(f"{who}: residual master weights are not sharded yet; under FSDP2 keep "
                           "float32 parameters (master_weights=None)")
    if stochastic:
        raise RuntimeError(f"{who}: stochastic_rounding draws its random bits by the element's "
                           "index within the tensor, which on a shard is not the global index; "
                           "it is not supported for sharded (FSDP2) parameters")
