"""The stable embedding layer of the 8-bit optimizers paper (Dettmers et al., ICLR 2022): an
embedding initialized Xavier-uniform, followed by a LayerNorm, whose weight keeps 32-bit optimizer
states under lowbit.optim whatever the optimizer's bits (docs/techniques/optimizers.md)."""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from lowbit.optim import override

__all__ = ["StableEmbedding"]


class StableEmbedding(torch.nn.Embedding):
    """A drop-in for torch.nn.Embedding (the same constructor arguments and state_dict keys, plus
    ``norm.weight`` and ``norm.bias``): ``LayerNorm(embedding(x))``, the weight initialized with
    ``xavier_uniform_`` (the padding row zeroed) and marked for 32-bit optimizer states
    (:func:`lowbit.optim.override`)."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: Optional[torch.Tensor] = None, _freeze: bool = False,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, _freeze, device, dtype)
        self.norm = torch.nn.LayerNorm(embedding_dim, device=device, dtype=dtype)
        override(self.weight, bits=32)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # copy.deepcopy rebuilds the module from its state, and torch's Parameter.__deepcopy__
        # drops the parameter's attributes: the copy's weight is marked again.
        super().__setstate__(state)
        weight = self.__dict__.get("_parameters", {}).get("weight")
        if weight is not None and not hasattr(weight, "_lowbit_optim"):
            override(weight, bits=32)

    def reset_parameters(self) -> None:
        torch.nn.init.xavier_uniform_(self.weight)
        self._fill_padding_idx_with_zero()

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        emb = F.embedding(input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                          self.scale_grad_by_freq, self.sparse)
        return self.norm(emb)
