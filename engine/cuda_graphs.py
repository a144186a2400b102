"""CUDA graphs for the single-token decode step: one captured forward per batch-size bucket, replayed with
static input buffers (token ids, positions, KV write slots, and the attention backend's key lists).

A decode batch of n rows runs in the smallest captured bucket >= n; the rows past n are padding that writes
its K/V to a pad slot nobody reads and attends only to it. Graphs are captured at start-up, largest bucket
first, sharing one memory pool (the order lets the smaller graphs reuse the largest one's memory).
Only the model forward is captured; the LM head and sampling run after the replay, as in eager mode.

Attention inside a graph reads static buffers: flashinfer's CUDA-graph decode wrapper (planned on the host
before each replay), or, for SDPA, a gather of each row's key slots from a padded [B, max_keys] table with
a mask (`StaticSdpa`). On the CPU the same code runs with `eager_capture`, which "replays" by calling the
forward again on the static buffers: the CPU twin that tests the buffers, padding and bucket logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, Index, SeqSpan

DEFAULT_MAX_BATCH = 64  # SSD's branch steps batch up to ~16 rows per request; larger batches run eagerly

Capture = Callable[[Callable[[], torch.Tensor], object], tuple[Callable[[], None], torch.Tensor, object]]


def graph_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))
    return tuple(sorted(set(sizes) | {max_batch}))


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds n rows, or None when n is larger than every bucket (run eagerly)."""
    return next((b for b in buckets if b >= n), None)


def use_cuda_graphs(device: torch.device | str, *, eager: bool, tp: int) -> bool:
    """Graphs only on CUDA, unless --eager; with TP > 1 the all-reduce is not captured yet (eager)."""
    return torch.device(device).type == "cuda" and not eager and tp == 1


@dataclass(frozen=True)
class StaticDecodeMetadata:
    """What a captured decode forward reads: device buffers of `batch` rows (padding rows included)."""

    batch: int
    slot_mapping: torch.Tensor  # [B] long: where each row's new K/V is written
    key_slots: torch.Tensor     # [B, L] long: each row's key slots, padded with the pad slot (SDPA only)
    key_mask: torch.Tensor      # [B, L] bool: True for a row's real keys (SDPA only)


def cuda_capture(fn: Callable[[], torch.Tensor], pool) -> tuple[Callable[[], None], torch.Tensor, object]:
    """Warm up `fn` once, capture it into a CUDA graph on `pool`; returns (replay, output buffer, pool)."""
    fn()  # first run outside the capture: lazy allocations, kernel selection, flashinfer's JIT
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    torch.cuda.synchronize()
    return graph.replay, out, graph.pool()


def eager_capture(fn: Callable[[], torch.Tensor], pool) -> tuple[Callable[[], None], torch.Tensor, object]:
    """The CPU twin of cuda_capture: replay runs `fn` again on the static buffers into the same output."""
    out = fn()

    def replay() -> None:
        out.copy_(fn())

    return replay, out, pool


class StaticSdpa(AttentionBackend):
    """SDPA's decode on static buffers (a graph-capturable twin of SdpaBackend's decode, same KV tensors)."""

    name = "sdpa-static"

    def __init__(self, inner: AttentionBackend):
        self.inner = inner

    def allocate(self, **kwargs) -> None:
        raise AssertionError("StaticSdpa uses its inner backend's KV cache")

    def forward(self, layer, q, k, v, meta: StaticDecodeMetadata, scale: float) -> torch.Tensor:
        k_cache, v_cache = self.inner.k[layer], self.inner.v[layer]  # [KVH, S, D]
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        b, h, d = q.shape
        keys = k_cache[:, meta.key_slots].transpose(0, 1)    # [B, KVH, L, D]
        values = v_cache[:, meta.key_slots].transpose(0, 1)  # [B, KVH, L, D]
        o = F.scaled_dot_product_attention(q.view(b, h, 1, d), keys, values, attn_mask=meta.key_mask[:, None, None],
                                           scale=scale, enable_gqa=True)  # [B, H, 1, D]
        return o.reshape(b, h * d)


class DecodeGraphs:
    """Captured decode forwards of one model, one per bucket; `run` replays the one a batch fits."""

    def __init__(
        self, forward: Callable, backend: AttentionBackend, *, num_heads: int, dtype: torch.dtype, scale: float,
        pad_slot: int, max_keys: int, device: torch.device, max_batch: int = DEFAULT_MAX_BATCH,
        capture: Capture | None = None,
    ):
        """forward(ids [B], positions [B], meta, backend) -> hidden [B, hidden]: the model's forward."""
        self.forward = forward
        self.backend = backend
        self.static_backend = backend if hasattr(backend, "prepare_static_decode") else StaticSdpa(backend)
        self.num_heads, self.dtype, self.scale = num_heads, dtype, scale
        self.pad_slot, self.max_keys, self.device = pad_slot, max_keys, device
        self.buckets = graph_buckets(max_batch)
        self.capture = capture or (cuda_capture if torch.device(device).type == "cuda" else eager_capture)
        top = self.buckets[-1]
        self.input_ids = torch.zeros(top, dtype=torch.long, device=device)
        self.positions = torch.zeros(top, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top,), pad_slot, dtype=torch.long, device=device)
        self.key_slots = torch.full((top, max_keys), pad_slot, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(top, max_keys, dtype=torch.bool, device=device)
        self.key_mask[:, 0] = True
        self.replays: dict[int, Callable[[], None]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0  # tests check that the graph path really ran

    def capture_all(self) -> None:
        pool = None
        for batch in reversed(self.buckets):
            meta = self._meta(batch)
            self._prepare(batch, [slice(self.pad_slot, self.pad_slot + 1)] * batch, [1] * batch)

            def step(batch=batch, meta=meta) -> torch.Tensor:
                return self.forward(self.input_ids[:batch], self.positions[:batch], meta, self.static_backend)

            self.replays[batch], self.outputs[batch], pool = self.capture(step, pool)

    def handles(self, spans: list[SeqSpan]) -> bool:
        """Whether a forward over `spans` is a decode step a captured graph can run."""
        return (bucket_for(len(spans), self.buckets) is not None
                and all(s.q_len == 1 and s.mask is None and s.num_keys <= self.max_keys for s in spans))

    def run(self, ids: list[int], positions: torch.Tensor, write_slots: list[int] | Index,
            spans: list[SeqSpan]) -> torch.Tensor:
        """hidden [n, hidden] of n single-token rows, from the replay of the smallest bucket that holds them."""
        n = len(spans)
        batch = bucket_for(n, self.buckets)
        pad = batch - n
        self.input_ids[:batch].copy_(torch.tensor(ids + [0] * pad))
        self.positions[:batch].copy_(torch.cat([positions.cpu(), torch.zeros(pad, dtype=torch.long)]))
        writes = _as_list(write_slots) + [self.pad_slot] * pad
        self.slot_mapping[:batch].copy_(torch.tensor(writes))
        pad_keys = slice(self.pad_slot, self.pad_slot + 1)
        self._prepare(batch, [s.key_slots for s in spans] + [pad_keys] * pad, [s.num_keys for s in spans] + [1] * pad)
        self.replays[batch]()
        self.num_replays += 1
        return self.outputs[batch][:n]

    def _meta(self, batch: int) -> StaticDecodeMetadata:
        return StaticDecodeMetadata(batch, self.slot_mapping[:batch], self.key_slots[:batch], self.key_mask[:batch])

    def _prepare(self, batch: int, key_slots: list[Index], num_keys: list[int]) -> None:
        """Fill the attention's static key lists for the next replay (flashinfer: plan on the host)."""
        if self.static_backend is self.backend:
            self.backend.prepare_static_decode(batch, key_slots, num_keys, num_heads=self.num_heads,
                                               dtype=self.dtype, scale=self.scale)
            return
        table = torch.full((batch, self.max_keys), self.pad_slot, dtype=torch.long)
        for row, (slots, count) in enumerate(zip(key_slots, num_keys, strict=True)):
            table[row, :count] = torch.arange(slots.start, slots.stop) if isinstance(slots, slice) else slots.cpu()
        self.key_slots[:batch].copy_(table)
        self.key_mask[:batch].copy_(torch.arange(self.max_keys)[None, :] < torch.tensor(num_keys)[:, None])


def _as_list(slots: list[int] | Index) -> list[int]:
    if isinstance(slots, slice):
        return list(range(slots.start, slots.stop))
    return slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
