"""Column- and row-parallel linear layers with per-rank weight loading.

Each parameter carries a ``weight_loader(param, full_tensor, shard_id)`` that copies this rank's slice of
a full (unsharded) checkpoint tensor, so a checkpoint is sliced per TP rank at load time. Fused layers
(QKV, gate+up) take several checkpoint tensors, told apart by ``shard_id``. Every loader first checks the full
tensor's shape against the one the config gives (engine.errors.check_shape): a slice of a larger tensor copies
without complaint.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from engine.errors import check_shape
from engine.layers.packed import linear
from engine.layers.parallel import SINGLE, TensorParallel


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W split by output rows: each rank computes a slice of y."""

    packed: torch.Tensor | None = None  # the weight's packed copy for few-row steps (engine.layers.packed)

    packed_min_rows: int = 2  # steps of fewer rows skip the packed copy (engine.layers.packed_kernels.min_rows)

    low_bits: Callable | None = None  # a CPU draft's fewer-bit product (engine.layers.low_bits)

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False, tp: TensorParallel = SINGLE):
        super().__init__()
        self.tp = tp
        self.out_local = tp.shard(out_features, "output features")
        self.weight = _param(self.out_local, in_features)
        self.weight.weight_loader = self._load
        self.bias = _param(self.out_local) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self._load

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        rows = param.shape[0]
        check_shape(full.shape, (rows * self.tp.size, *param.shape[1:]))
        param.data.copy_(full.narrow(0, self.tp.rank * rows, rows))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self, self.bias)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs fused into one matmul (gate and up projections)."""

    def __init__(self, in_features: int, out_sizes: list[int], *, bias: bool = False, tp: TensorParallel = SINGLE):
        super().__init__(in_features, sum(out_sizes), bias=bias, tp=tp)
        self.local_sizes = [tp.shard(s, "output features") for s in out_sizes]

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        assert isinstance(shard_id, int), shard_id
        size = self.local_sizes[shard_id]
        offset = sum(self.local_sizes[:shard_id])
        check_shape(full.shape, (size * self.tp.size, *param.shape[1:]))
        param.data.narrow(0, offset, size).copy_(full.narrow(0, self.tp.rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one matmul; heads are split over ranks (KV heads replicated if fewer)."""

    def __init__(
        self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, *, bias: bool = False,
        tp: TensorParallel = SINGLE,
    ):
        self.num_heads = tp.shard(num_heads, "num_attention_heads")
        if num_kv_heads >= tp.size:
            self.num_kv_heads = tp.shard(num_kv_heads, "num_key_value_heads")
        else:  # fewer KV heads than ranks: each rank holds one, shared by several ranks
            if tp.size % num_kv_heads:
                raise ValueError(f"TP size {tp.size} must be a multiple of num_key_value_heads={num_kv_heads}")
            self.num_kv_heads = 1
        self.head_dim = head_dim
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp.size
        super().__init__(hidden, out, bias=bias, tp=tp)
        self.kv_replicas = max(1, tp.size // num_kv_heads)

    def _load(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if shard_id == "q":
            offset, rows, rank = 0, q_rows, self.tp.rank
        elif shard_id == "k":
            offset, rows, rank = q_rows, kv_rows, self.tp.rank // self.kv_replicas
        else:
            assert shard_id == "v", shard_id
            offset, rows, rank = q_rows + kv_rows, kv_rows, self.tp.rank // self.kv_replicas
        ranks = self.tp.size if shard_id == "q" else self.tp.size // self.kv_replicas  # ranks of distinct rows
        check_shape(full.shape, (rows * ranks, *param.shape[1:]))
        param.data.narrow(0, offset, rows).copy_(full.narrow(0, rank * rows, rows))


class RowParallelLinear(nn.Module):
    """y = x W^T with W split by input columns: partial sums are all-reduced over ranks."""

    packed: torch.Tensor | None = None  # as in ColumnParallelLinear

    packed_min_rows: int = 2  # as in ColumnParallelLinear

    low_bits: Callable | None = None  # a CPU draft's fewer-bit product (engine.layers.low_bits)

    def __init__(self, in_features: int, out_features: int, *, bias: bool = False, tp: TensorParallel = SINGLE):
        super().__init__()
        self.tp = tp
        self.in_local = tp.shard(in_features, "input features")
        self.weight = _param(out_features, self.in_local)
        self.weight.weight_loader = self._load_weight
        self.bias = _param(out_features) if bias else None
        if self.bias is not None:
            self.bias.weight_loader = self._load_bias

    def _load_bias(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        check_shape(full.shape, param.shape)
        param.data.copy_(full)

    def _load_weight(self, param: nn.Parameter, full: torch.Tensor, shard_id: object = None) -> None:
        check_shape(full.shape, (param.shape[0], self.in_local * self.tp.size))
        param.data.copy_(full.narrow(1, self.tp.rank * self.in_local, self.in_local))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(linear(x, self))
        return y if self.bias is None else y + self.bias



def to_k_major(model: nn.Module) -> int:
    """Store every matmul weight K-major: the [N, K] parameter becomes a view of its contiguous [K, N]
    transpose, so ``F.linear`` runs MKL's NN GEMM instead of NT. Same products; measured on the 2-core
    AVX-512 box over SmolLM2's shapes: one row 2-6% faster, five rows (a k=4 verify) 20-25% faster.
    A tied embedding shares the head's weight and gathers strided rows (about 1 ms for 500 tokens).
    Returns the number of weights converted."""
    from engine.layers.embedding import ParallelLMHead, ReducedLMHead  # they import this module's neighbours

    converted: set[int] = set()
    for module in model.modules():
        if isinstance(module, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead, ReducedLMHead)):
            weight = module.weight
            if id(weight) not in converted:
                weight.data = weight.data.t().contiguous().t()  # [N, K] view of [K, N] storage
                converted.add(id(weight))
    return len(converted)
