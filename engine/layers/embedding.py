"""Vocabulary-parallel token embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.parallel import SINGLE, TensorParallel


class VocabParallelEmbedding(nn.Module):
    """Each rank holds a contiguous slice of the vocabulary; ids outside it contribute zeros."""

    def __init__(self, vocab_size: int, dim: int, *, tp: TensorParallel = SINGLE):
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.vocab_local = -(-vocab_size // tp.size)  # ceil: the last rank's slice is padded
        self.vocab_start = tp.rank * self.vocab_local
        self.weight = nn.Parameter(torch.zeros(self.vocab_local, dim), requires_grad=False)
        self.weight.weight_loader = self._load

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        part = full[self.vocab_start : self.vocab_start + self.vocab_local]
        param.data[: part.shape[0]].copy_(part)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [N] -> [N, D]
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the vocabulary: each rank scores its slice, then slices are gathered."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, D] -> [N, V]
        logits = self.tp.all_gather_last_dim(F.linear(hidden, self.weight))
        return logits[..., : self.vocab_size] if self.tp.size > 1 else logits
