"""Tensor-parallel rank and collectives, as one small value handed to every TP-aware layer.

With ``size == 1`` every collective is the identity, so single-device models pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed ProcessGroup (its own methods are called) when size > 1

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.size, (self.rank, self.size)

    def shard(self, total: int, what: str) -> int:
        """The per-rank share of `total` (heads, rows, ...), which must divide evenly."""
        if total % self.size:
            raise ValueError(f"{what}={total} is not divisible by the tensor-parallel size {self.size}")
        return total // self.size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.group.allreduce([x]).wait()
        return x

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        self.group.allgather([parts], [x.contiguous()]).wait()
        return torch.cat(parts, dim=-1)


SINGLE = TensorParallel()
