"""The attention interface: what a forward pass tells the backend, and what a backend must do.

A forward pass flattens the new tokens of every sequence in the batch into N query rows. For each
sequence, a ``SeqSpan`` says which rows are its queries, which KV-cache slots hold its keys (in
order, including the new tokens' own slots), and how queries see keys:
- causal (mask None): query i is the key at index num_keys - q_len + i and sees keys 0..that index.
  This covers prefill (with or without a cached prefix), single-token decode and K+1 verification.
- a custom boolean mask [q_len, num_keys] (True = may attend), e.g. for tree/branch drafting.
The backend first writes the new K/V rows to ``slot_mapping``, then attends.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch

Index = torch.Tensor | slice  # a contiguous run of slots becomes a slice (a view, no gather copy)


def as_index(slots: Sequence[int], device: torch.device | str = "cpu") -> Index:
    """A slice when `slots` is one increasing contiguous run, else a long tensor."""
    if len(slots) > 0 and slots[-1] - slots[0] == len(slots) - 1 and list(slots) == list(
        range(slots[0], slots[-1] + 1)
    ):
        return slice(slots[0], slots[-1] + 1)
    return torch.tensor(list(slots), dtype=torch.long, device=device)


@dataclass(frozen=True)
class SeqSpan:
    q_start: int
    q_len: int
    key_slots: Index
    num_keys: int
    mask: torch.Tensor | None = None  # [q_len, num_keys] bool, None = causal

    @property
    def is_square_causal(self) -> bool:
        return self.mask is None and self.q_len == self.num_keys

    def bool_mask(self) -> torch.Tensor | None:
        """[q, T] bool (True = attend) for SDPA, or None when no mask (decode) or is_causal suffices."""
        if self.mask is None:
            if self.q_len == 1 or self.is_square_causal:
                return None
            offset = self.num_keys - self.q_len
            q_pos = torch.arange(self.q_len).unsqueeze(1) + offset
            allowed = torch.arange(self.num_keys).unsqueeze(0) <= q_pos  # [q, T]
        else:
            allowed = self.mask
        return allowed


@dataclass(frozen=True)
class BatchedDecode:
    """A decode step of several sequences (one query each) as one padded batch: every sequence's keys gathered
    into T = the longest sequence's key count, padding masked out. Built once per forward, read by every layer."""

    key_index: torch.Tensor  # [B * T] cache slots, sequence-major; padding points at slot 0
    key_mask: torch.Tensor   # [B, 1, 1, T] bool, True = a real key


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: Index           # [N] where each new token's K/V is written
    spans: tuple[SeqSpan, ...]
    batched_decode: BatchedDecode | None = None  # set where every span is one causal query and there are several


def build_metadata(
    write_slots: Sequence[int] | Index, spans: Sequence[SeqSpan], *, device: torch.device | str = "cpu",
    batch_decode: bool = False,
) -> AttentionMetadata:
    """The forward's metadata; `batch_decode`: also the padded gather of a several-sequence decode step, for a
    backend that reads it (``AttentionBackend.batches_decode``)."""
    # from the spans as given (CPU slots: no device sync per span)
    batched = batched_decode(spans, device) if batch_decode else None
    spans = tuple(
        s if isinstance(s.key_slots, slice) else SeqSpan(s.q_start, s.q_len, s.key_slots.to(device), s.num_keys, s.mask)
        for s in spans
    )
    if isinstance(write_slots, torch.Tensor):
        write = write_slots.to(device)
    else:
        write = write_slots if isinstance(write_slots, slice) else as_index(write_slots, device)
    return AttentionMetadata(write, spans, batched)


def batched_decode(spans: Sequence[SeqSpan], device: torch.device | str = "cpu") -> BatchedDecode | None:
    """The padded gather of a decode step of several sequences (`BatchedDecode`), or None for any other step,
    and where padding would more than double the keys read (one long sequence among short ones)."""
    if len(spans) < 2 or any(s.q_len != 1 or s.mask is not None or s.q_start != i for i, s in enumerate(spans)):
        return None
    longest = max(s.num_keys for s in spans)
    if len(spans) * longest > 2 * sum(s.num_keys for s in spans):
        return None
    index = torch.zeros(len(spans), longest, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(spans), longest, dtype=torch.bool)  # [B, T]
    for row, span in enumerate(spans):
        slots = span.key_slots
        index[row, : span.num_keys] = torch.arange(slots.start, slots.stop) if isinstance(slots, slice) \
            else slots.cpu()
        mask[row, : span.num_keys] = True
    return BatchedDecode(index.view(-1).to(device), mask.view(len(spans), 1, 1, longest).to(device))


class AttentionBackend(ABC):
    """Owns the KV cache tensors (their layout is the backend's business) and computes attention."""

    name: str
    batches_decode = False  # reads AttentionMetadata.batched_decode (build_metadata makes it only for those)

    @abstractmethod
    def allocate(
        self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None: ...

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        """q: [N, H, D], k/v: [N, KVH, D] (new tokens). Writes k/v, returns [N, H * D]."""
