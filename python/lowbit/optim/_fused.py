"""The optimizer step inside the backward pass (Lewandowski and Kosson 2023): each parameter is
stepped by a lowbit optimizer as soon as its gradient is accumulated (torch's
``register_post_accumulate_grad_hook``) and its gradient is freed at once, so the gradients of
the whole model never exist together. docs/techniques/residual.md, "The step in the backward
pass", lists what this rules out and the way around each:

- gradient accumulation over micro-batches: run all but the last micro-batch's backward inside
  ``with handle.paused():`` (gradients accumulate in ``p.grad`` as usual, nothing is stepped);
  the last backward steps each parameter on the accumulated gradient;
- global gradient-norm clipping (needs every gradient before any step): ``clip_grad_norm=c``
  with ``clip="per_parameter"`` clips each gradient by its own norm, ``clip="previous_global"``
  scales every gradient by min(1, c / N) with N the global norm of the previous backward (float32,
  the squares summed in the optimizer's parameter order; the first backward is not clipped);
- closures: ``optimizer.step(closure)`` runs the closure once, whose backward steps the
  parameters; ``step`` itself then finds no gradients and does nothing, so optimizers that
  evaluate the closure more than once (line searches, LBFGS) cannot be fused;
- parameters added later (``optimizer.add_param_group``) have no hook: call
  ``fuse_into_backward`` again for them (or remove the handle and fuse the model anew);
- torch.amp.GradScaler: ``scaler.step(optimizer)`` finds no gradients to unscale or check (torch
  raises "No inf checks were recorded for this optimizer"); use bfloat16 (no loss scaling
  needed), or a fixed ``loss_scale`` (the hook divides each gradient by it before the step; the
  kernel's rule for non-finite gradients leaves the blocks of an overflowed gradient untouched,
  per block, where GradScaler would skip the whole step).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Optional, Union

import torch

from lowbit.optim._base import LowbitOptimizer

__all__ = ["fuse_into_backward", "FusedBackward"]


class FusedBackward:
    """The handle of :func:`fuse_into_backward`: ``remove()`` takes the hooks off, ``paused()``
    is a context in which backward passes only accumulate gradients."""

    def __init__(self, optimizer: LowbitOptimizer, clip_grad_norm: Optional[float], clip: str,
                 loss_scale: Optional[float]) -> None:
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_norm
        self.clip = clip
        self.loss_scale = loss_scale
        self._handles: list[Any] = []
        self._paused = 0
        # this backward's squared gradient norms, by parameter, summed at its end in the
        # optimizer's parameter order (so the global norm does not depend on the hooks' order)
        self._sq: dict[int, torch.Tensor] = {}
        self._order: list[int] = [id(p) for g in optimizer.param_groups for p in g["params"]]
        self._queued = False
        self.previous_norm: Optional[torch.Tensor] = None  # the last backward's global norm

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _end_of_backward(self) -> None:
        self._queued = False
        total = None
        for k in self._order:
            sq = self._sq.get(k)
            if sq is not None:
                total = sq if total is None else total + sq
        if total is not None:
            norm = total.sqrt()
            # A backward with an Inf or NaN gradient (whose blocks the kernel skipped) keeps the
            # norm before it: clipping the next one to c / Inf = 0 would freeze the model.
            self.previous_norm = norm if self.previous_norm is None else \
                torch.where(torch.isfinite(norm), norm, self.previous_norm)
        self._sq = {}

    def _scale(self, norm: torch.Tensor) -> torch.Tensor:
        """min(1, c / (norm + 1e-6)), or 1 where the norm is not finite (no norm yet, or only
        Inf / NaN ones: the kernel skips the blocks that hold such gradients)."""
        scale = torch.clamp(self.clip_grad_norm / (norm + 1e-6), max=1.0)
        return torch.where(torch.isfinite(norm), scale, torch.ones_like(scale))

    def _hook(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        if self._paused or p.grad is None:
            return
        with torch.no_grad():
            g = p.grad
            if self.loss_scale is not None:
                g.mul_(1.0 / self.loss_scale)
            if self.clip_grad_norm is not None:
                norm = torch.linalg.vector_norm(g, dtype=torch.float32)
                if self.clip == "per_parameter":
                    g.mul_(self._scale(norm).to(g.dtype))
                else:
                    if not self._queued:
                        torch.autograd.Variable._execution_engine.queue_callback(
                            self._end_of_backward)
                        self._queued = True
                    self._sq[id(p)] = norm * norm
                    if self.previous_norm is not None:
                        g.mul_(self._scale(self.previous_norm).to(g.dtype))
            self.optimizer._step_group(group, [p])
        p.grad = None


def fuse_into_backward(model: Union[torch.nn.Module, Any], optimizer: LowbitOptimizer, *,
                       clip_grad_norm: Optional[float] = None, clip: str = "per_parameter",
                       loss_scale: Optional[float] = None) -> FusedBackward:
    """Steps each parameter of ``model`` (a Module or an iterable of parameters) that
    ``optimizer`` holds as soon as its gradient is accumulated, and frees the gradient. Returns
    a :class:`FusedBackward` handle (``remove()``, ``paused()``). The weights equal, bit for bit,
    those of ``loss.backward(); optimizer.step()`` on the same gradients (with nearest rounding
    of 8-bit states; stochastic rounding draws other random bits, each parameter being its own
    call). See the module docstring for what this rules out and the ways around."""
    if not isinstance(optimizer, LowbitOptimizer):
        raise TypeError("fuse_into_backward: optimizer must be a lowbit.optim optimizer")
    if clip not in ("per_parameter", "previous_global"):
        raise ValueError(f"fuse_into_backward: clip={clip!r}; expected 'per_parameter' or "
                         "'previous_global'")
    if clip_grad_norm is not None and not 0 < clip_grad_norm < math.inf:
        raise ValueError(f"fuse_into_backward: clip_grad_norm={clip_grad_norm!r}; expected a "
                         "finite value > 0")
    if loss_scale is not None and not 0 < loss_scale < math.inf:
        raise ValueError(f"fuse_into_backward: loss_scale={loss_scale!r}; expected a finite "
                         "value > 0")
    params = model.parameters() if isinstance(model, torch.nn.Module) else model
    owner = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    handle = FusedBackward(optimizer, clip_grad_norm, clip, loss_scale)
    seen: set[int] = set()
    for p in params:
        if id(p) in seen or not p.requires_grad or id(p) not in owner:
            continue
        seen.add(id(p))
        group = owner[id(p)]
        handle._handles.append(p.register_post_accumulate_grad_hook(
            lambda t, g=group: handle._hook(t, g)))
    return handle
