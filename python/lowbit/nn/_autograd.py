"""What lowbit.nn's autograd Functions share: their backward passes run kernels on saved
tensors (codes, scales, dequantized copies), so the gradients they return carry no autograd
history. A gradient of those gradients (``create_graph=True``: a gradient penalty, a Hessian-vector
product) through them would silently miss terms; :func:`differentiable_once` makes it an error
that says so, as torch's ``once_differentiable`` does for gradients that require grad, and also
where only the layer's saved tensors do (the weight a penalty on dX depends on)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

_MESSAGE = (b"lowbit.nn: the layer's backward ran on saved low-precision tensors, so its "
            b"gradients cannot be differentiated again (create_graph=True: gradient penalties, "
            b"double backward); use the torch module there")


def differentiable_once(backward: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates an autograd Function's backward: run without autograd, and under
    create_graph=True its gradients come out as aliases whose own backward raises."""

    @functools.wraps(backward)
    def wrapper(ctx: Any, *grads: Any) -> Any:
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return outputs
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if all(not isinstance(o, torch.Tensor) for o in outs):
            return outputs

        def alias(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            v = v.detach()
            v.requires_grad_(True)
            return v

        err = torch._C._functions.DelayedError(_MESSAGE, len(outs))
        res = err(*[alias(o) for o in outs])
        res = res if isinstance(res, tuple) else (res,)
        return res[0] if single else tuple(res)

    return wrapper
