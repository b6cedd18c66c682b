"""lowbit.optim: torch.optim.Optimizer subclasses over lowbit's fused optimizer steps, with
32-bit or 8-bit block-wise states (Dettmers et al., ICLR 2022), StableAdamW (Wortsman et al.,
NeurIPS 2023), LAMB (You et al., ICLR 2020) and LARS (You, Gitman, Ginsburg 2017), residual master
weights and the step fused into the backward pass (Lewandowski and Kosson 2023). Importing it
imports torch. docs/techniques/optimizers.md has the equations, the state layout, the bounds and
what is not done yet; docs/techniques/residual.md the residuals."""

from lowbit.optim._base import LowbitOptimizer, override, residual_join, residual_split
from lowbit.optim._fused import FusedBackward, fuse_into_backward
from lowbit.optim._optimizers import (
    LAMB,
    LARS,
    SGD,
    Adagrad,
    Adagrad8bit,
    Adam,
    Adam8bit,
    AdamW,
    AdamW8bit,
    LAMB8bit,
    LARS8bit,
    Lion,
    Lion8bit,
    RMSprop,
    RMSprop8bit,
    SGD8bit,
    StableAdamW,
    StableAdamW8bit,
)

__all__ = [
    "LowbitOptimizer", "override", "residual_split", "residual_join", "fuse_into_backward",
    "FusedBackward",
    "Adam", "AdamW", "StableAdamW", "SGD", "Lion", "RMSprop", "Adagrad", "LAMB", "LARS",
    "Adam8bit", "AdamW8bit", "StableAdamW8bit", "SGD8bit", "Lion8bit", "RMSprop8bit",
    "Adagrad8bit", "LAMB8bit", "LARS8bit",
]
