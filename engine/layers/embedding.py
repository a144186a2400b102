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


class ReducedLMHead(nn.Module):
    """A draft's head over a subset of the vocabulary: the checkpoint holds a full [V, D] head whose rows
    outside the subset are zero; only the non-zero rows are kept and scored, every other token gets -inf.
    A draft only proposes tokens (the target verifies them), so exactness never depends on this; a
    cheaper head is what lets a small draft build SSD's branch tree within one verify."""

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.zeros(0, dim), requires_grad=False)  # [Vr, D] once loaded
        self.weight.weight_loader = self._load
        self.register_buffer("vocab_ids", torch.zeros(0, dtype=torch.long), persistent=False)  # [Vr]

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        ids = torch.nonzero(full.abs().amax(dim=-1) > 0).flatten()  # [Vr]
        param.data = full[ids].to(param.dtype).contiguous()
        self.vocab_ids = ids.to(param.device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, D] -> [N, V]
        scores = F.linear(hidden, self.weight)  # [N, Vr]
        logits = scores.new_full((hidden.shape[0], self.vocab_size), float("-inf"))
        return logits.index_copy_(1, self.vocab_ids, scores)
