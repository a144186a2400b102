"""Vocabulary-parallel token embedding and LM head."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import ModelFilesError, check_shape
from engine.layers import panel8
from engine.layers.packed import linear
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
        check_shape(full.shape, (self.vocab_size, param.shape[1]))
        part = full[self.vocab_start : self.vocab_start + self.vocab_local]
        param.data[: part.shape[0]].copy_(part)

    rows8: panel8.Panel8 | None = None  # its 8-bit copy, for lookups once the weight is released (layers.unread)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # [N] -> [N, D]
        if self.rows8 is not None:
            return panel8.rows(self.rows8, ids)
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the vocabulary: each rank scores its slice, then slices are gathered."""

    packed: torch.Tensor | None = None  # the weight's packed copy for few-row steps (engine.layers.packed)

    packed_min_rows: int = 2  # steps of fewer rows skip the packed copy (engine.layers.packed_kernels.min_rows)

    low_bits: Callable | None = None  # a CPU draft's fewer-bit product (engine.layers.low_bits)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, D] -> [N, V]
        logits = self.tp.all_gather_last_dim(linear(hidden, self))
        return logits[..., : self.vocab_size] if self.tp.size > 1 else logits


class ReducedLMHead(nn.Module):
    """A draft's head over a subset of the vocabulary; every other token gets -inf. The checkpoint holds either
    a full [V, D] head whose rows outside the subset are zero (only the non-zero rows are kept), or just the
    [Vr, D] kept rows plus ``lm_head.vocab_ids`` [Vr], the token of each row. A draft only proposes tokens
    (the target verifies them), so exactness never depends on this; a cheaper head is what lets a small
    draft build SSD's branch tree within one verify."""

    packed: torch.Tensor | None = None  # as in ParallelLMHead

    packed_min_rows: int = 2  # as in ParallelLMHead

    low_bits: Callable | None = None  # a CPU draft's fewer-bit product (engine.layers.low_bits)

    def __init__(self, vocab_size: int, dim: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.zeros(0, dim), requires_grad=False)  # [Vr, D] once loaded
        self.weight.weight_loader = self._load
        self.register_buffer("vocab_ids", torch.zeros(0, dtype=torch.long), persistent=False)  # [Vr]

    def _load(self, param: nn.Parameter, rows: torch.Tensor, shard_id: object = None) -> None:
        kept = rows.shape[0] if rows.dim() == 2 and 0 < rows.shape[0] <= self.vocab_size else self.vocab_size
        check_shape(rows.shape, (kept, param.shape[1]))  # [Vr, D] kept rows (Vr <= V), or the full [V, D]
        param.data = rows.to(param.dtype).contiguous()

    def set_vocab_ids(self, ids: torch.Tensor) -> None:
        self.vocab_ids = ids.to(device=self.weight.device, dtype=torch.long)

    def finish_loading(self) -> None:
        """Keep the non-zero rows of a full head, or check a compact head's rows against its token ids."""
        if self.vocab_ids.numel() == 0:
            if self.weight.shape[0] != self.vocab_size:
                raise ModelFilesError(f"the draft's head has {self.weight.shape[0]} rows and no lm_head.vocab_ids:"
                                      f" give {self.vocab_size} rows, or the ids of the kept ones")
            ids = torch.nonzero(self.weight.abs().amax(dim=-1) > 0).flatten()  # [Vr]
            self.weight.data = self.weight.data[ids].contiguous()
            self.vocab_ids = ids
            return
        ids = self.vocab_ids
        if ids.shape != (self.weight.shape[0],) or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size \
                or torch.unique(ids).numel() != ids.numel():
            raise ModelFilesError(f"the draft's lm_head.vocab_ids does not match its {self.weight.shape[0]} head "
                                  f"rows (distinct ids below {self.vocab_size}): the draft's files are corrupt")
        order = torch.argsort(ids)  # ascending ids: a compact row's argmax breaks ties as the full row's does
        self.weight.data, self.vocab_ids = self.weight.data[order].contiguous(), ids[order]

    def forward(self, hidden: torch.Tensor, compact: bool = False) -> torch.Tensor:  # [N, D] -> [N, V]
        """compact: the kept tokens' scores [N, Vr], in `vocab_ids`' (ascending) order, not spread over [N, V]
        (which cost the draft about 0.3 ms a forward, and every use of a row a pass over 49152 tokens)."""
        scores = linear(hidden, self)  # [N, Vr]
        if compact:
            return scores
        logits = scores.new_full((hidden.shape[0], self.vocab_size), float("-inf"))
        return logits.index_copy_(1, self.vocab_ids, scores)
