"""CUDA graphs for the steps that repeat every token: single-token decode (AR, SSD's branch steps) and the
k+1-row causal step of verification (SD/SSD's target, SSD's glue pass on the draft). One captured forward per
(sequences, rows per sequence) shape, replayed with static input buffers (token ids, positions, KV write slots,
and the attention backend's key lists).

A step of n sequences with q causal query rows each (at most) runs in the smallest captured shape (B, Q) with
B >= n and Q >= q. Padding: a sequence with fewer than Q rows gets rows after its own, whose K/V go to a pad slot
nobody reads and whose key list is the sequence's keys plus pad-slot keys, so causality (query i sees keys up to
num_keys - Q + i) keeps every real row's keys exactly its own; the sequences past n attend only to pad keys.
Graphs are captured at start-up, largest first, sharing one memory pool (the order lets the smaller graphs reuse
the largest one's memory). Only the model forward is captured; the LM head and sampling run after the replay,
as in eager mode.

Attention inside a graph reads static buffers: flashinfer's CUDA-graph decode / prefill wrappers (planned on
the host before each replay), or, for SDPA, a gather of each row's key slots from a padded [B, L] table with a
[B, Q, L] mask (`StaticSdpa`). SDPA's graphs come in key lengths L (`key_buckets`: 256, 512, ... up to
max_keys) and a step replays the shortest that holds its keys: with one L = max_keys, a 2048-key gather and
masked attention took 15% of an 8B-shaped decode step's GPU time (H200), most of it over padding. On the CPU
the same code runs with `eager_capture`, which "replays" by calling the forward again on the static buffers:
the CPU twin that tests the buffers, padding and shape logic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, Index, SeqSpan

DEFAULT_MAX_BATCH = 64  # SSD's branch steps batch up to ~16 rows per request; larger batches run eagerly
VERIFY_ROWS = (2, 3, 5, 9)  # query rows per sequence with graphs of their own (k + 1 for k <= 8, padded up)
VERIFY_MAX_BATCH = 16       # sequences per several-row graph; larger verification batches run eagerly
MIN_KEYS = 256              # SDPA graphs' shortest key length (then doubling up to max_keys)

Capture = Callable[[Callable[[], torch.Tensor], object], tuple[Callable[[], None], torch.Tensor, object]]


def graph_buckets(max_batch: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch] + list(range(16, max_batch + 1, 16))
    return tuple(sorted(set(sizes) | {max_batch}))


def graph_shapes(max_batch: int) -> tuple[tuple[int, int], ...]:
    """(sequences, rows per sequence) to capture: every batch bucket with one row (decode), and the buckets up
    to VERIFY_MAX_BATCH with each of VERIFY_ROWS rows (verification)."""
    decode = [(b, 1) for b in graph_buckets(max_batch)]
    verify = [(b, q) for q in VERIFY_ROWS for b in graph_buckets(min(max_batch, VERIFY_MAX_BATCH))]
    return tuple(decode + verify)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds n rows, or None when n is larger than every bucket (run eagerly)."""
    return next((b for b in buckets if b >= n), None)


def shape_for(num_seqs: int, rows: int, shapes: tuple[tuple[int, int], ...]) -> tuple[int, int] | None:
    """The smallest captured (B, Q) with B >= num_seqs and Q >= rows (fewest padded rows), or None."""
    fits = [(b * q, b, q) for b, q in shapes if b >= num_seqs and q >= rows]
    return min(fits)[1:] if fits else None


def key_buckets(max_keys: int, smallest: int = MIN_KEYS) -> tuple[int, ...]:
    """Key lengths with graphs of their own: smallest, 2 * smallest, ... below max_keys, then max_keys."""
    if max_keys < 1 or smallest < 1:
        raise ValueError(f"max_keys and smallest must be >= 1, got {max_keys} and {smallest}")
    sizes, size = [], smallest
    while size < max_keys:
        sizes.append(size)
        size *= 2
    return (*sizes, max_keys)


def use_cuda_graphs(device: torch.device | str, *, eager: bool, tp: int) -> bool:
    """Graphs only on CUDA, unless --eager; with TP > 1 the all-reduce is not captured yet (eager)."""
    return torch.device(device).type == "cuda" and not eager and tp == 1


@dataclass(frozen=True)
class StaticStepMetadata:
    """What a captured forward reads: device buffers of `batch` sequences x `rows` query rows (padding included)."""

    batch: int
    rows: int
    slot_mapping: torch.Tensor  # [B * Q] long: where each row's new K/V is written
    key_slots: torch.Tensor     # [B, L] long: each sequence's key slots, padded with the pad slot (SDPA only)
    key_mask: torch.Tensor      # [B, Q, L] bool: True for the keys a row sees (SDPA only; L: the key length)


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
    """SDPA on static buffers (a graph-capturable twin of SdpaBackend for causal steps, same KV tensors)."""

    name = "sdpa-static"

    def __init__(self, inner: AttentionBackend):
        self.inner = inner

    def allocate(self, **kwargs) -> None:
        raise AssertionError("StaticSdpa uses its inner backend's KV cache")

    def forward(self, layer, q, k, v, meta: StaticStepMetadata, scale: float) -> torch.Tensor:
        k_cache, v_cache = self.inner.k[layer], self.inner.v[layer]  # [KVH, S, D]
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
        n, h, d = q.shape
        b, rows = meta.batch, meta.rows
        keys = k_cache[:, meta.key_slots].transpose(0, 1)    # [B, KVH, L, D]
        values = v_cache[:, meta.key_slots].transpose(0, 1)  # [B, KVH, L, D]
        queries = q.view(b, rows, h, d).transpose(1, 2)      # [B, H, Q, D]
        o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.key_mask[:, None], scale=scale,
                                           enable_gqa=True)  # [B, H, Q, D]
        return o.transpose(1, 2).reshape(n, h * d)


class StepGraphs:
    """Captured forwards of one model, one per (sequences, rows) shape; `run` replays the one a step fits."""

    def __init__(
        self, forward: Callable, backend: AttentionBackend, *, num_heads: int, dtype: torch.dtype, scale: float,
        pad_slot: int, max_keys: int, device: torch.device, max_batch: int = DEFAULT_MAX_BATCH,
        capture: Capture | None = None, min_keys: int = MIN_KEYS,
    ):
        """forward(ids [N], positions [N], meta, backend) -> hidden [N, hidden]: the model's forward. SDPA's
        graphs are captured for each of key_buckets(max_keys, min_keys); flashinfer's take any key count."""
        self.forward = forward
        self.backend = backend
        self.static_backend = backend if hasattr(backend, "prepare_static") else StaticSdpa(backend)
        self.num_heads, self.dtype, self.scale = num_heads, dtype, scale
        self.pad_slot, self.max_keys, self.device = pad_slot, max_keys, device
        self.shapes = graph_shapes(max_batch)
        static_sdpa = self.static_backend is not backend
        self.key_lengths = key_buckets(max_keys, min_keys) if static_sdpa else (max_keys,)
        self.capture = capture or (cuda_capture if torch.device(device).type == "cuda" else eager_capture)
        top_rows = max(b * q for b, q in self.shapes)
        top_batch, top_q = max(b for b, _ in self.shapes), max(q for _, q in self.shapes)
        self.input_ids = torch.zeros(top_rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(top_rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((top_rows,), pad_slot, dtype=torch.long, device=device)
        self.key_slots = torch.full((top_batch, max_keys), pad_slot, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(top_batch, top_q, max_keys, dtype=torch.bool, device=device)
        self.key_mask[:, :, 0] = True
        self.replays: dict[tuple[int, int, int], Callable[[], None]] = {}  # (sequences, rows, keys) -> replay
        self.outputs: dict[tuple[int, int, int], torch.Tensor] = {}
        self.num_replays: dict[int, int] = {}  # rows per sequence -> replays (tests check each path really ran)
        self.num_key_replays: dict[int, int] = {}  # key length -> replays

    def capture_all(self) -> None:
        pool = None
        shapes = [(b, q, keys) for b, q in self.shapes for keys in self.key_lengths]
        for shape in sorted(shapes, key=lambda s: (-s[0] * s[1] * s[2], -s[1], -s[2])):
            batch, rows, keys = shape
            meta = self._meta(batch, rows, keys)
            self._prepare(batch, rows, keys, [self._pad_keys(rows)] * batch)

            def step(n=batch * rows, meta=meta) -> torch.Tensor:
                return self.forward(self.input_ids[:n], self.positions[:n], meta, self.static_backend)

            self.replays[shape], self.outputs[shape], pool = self.capture(step, pool)

    def handles(self, spans: list[SeqSpan]) -> bool:
        """Whether a forward over `spans` is a causal step (in row order) that a captured shape holds."""
        if not spans or any(s.mask is not None for s in spans):
            return False
        shape = shape_for(len(spans), max(s.q_len for s in spans), self.shapes)
        if shape is None or self._keys_for(spans, shape[1]) is None:
            return False
        row = 0
        for s in spans:
            if s.q_start != row:
                return False
            row += s.q_len
        return True

    def _keys_for(self, spans: list[SeqSpan], rows: int) -> int | None:
        """The shortest captured key length that holds every span's keys and its padding rows' pad keys."""
        return bucket_for(max(s.num_keys + rows - s.q_len for s in spans), self.key_lengths)

    def run(self, ids: list[int], positions: torch.Tensor, write_slots: list[int] | Index,
            spans: list[SeqSpan]) -> torch.Tensor:
        """hidden [N, hidden] of the spans' N rows, from the replay of the smallest captured shape that holds them."""
        batch, rows = shape_for(len(spans), max(s.q_len for s in spans), self.shapes)
        num_keys = self._keys_for(spans, rows)
        real = torch.cat([torch.arange(b * rows, b * rows + s.q_len) for b, s in enumerate(spans)])  # [N]
        padded = batch * rows
        for buffer, values, fill in ((self.input_ids, torch.tensor(ids), 0), (self.positions, positions.cpu(), 0),
                                     (self.slot_mapping, torch.tensor(_as_list(write_slots)), self.pad_slot)):
            host = torch.full((padded,), fill, dtype=torch.long)
            host[real] = values
            buffer[:padded].copy_(host)
        keys = [_slots(s.key_slots, s.num_keys, rows - s.q_len, self.pad_slot) for s in spans]
        self._prepare(batch, rows, num_keys, keys + [self._pad_keys(rows)] * (batch - len(spans)))
        self.replays[(batch, rows, num_keys)]()
        self.num_replays[rows] = self.num_replays.get(rows, 0) + 1
        self.num_key_replays[num_keys] = self.num_key_replays.get(num_keys, 0) + 1
        out = self.outputs[(batch, rows, num_keys)]
        return out[: len(spans)] if rows == 1 else out.index_select(0, real.to(out.device))

    def _pad_keys(self, count: int) -> torch.Tensor:
        return torch.full((count,), self.pad_slot, dtype=torch.long)

    def _meta(self, batch: int, rows: int, keys: int) -> StaticStepMetadata:
        return StaticStepMetadata(batch, rows, self.slot_mapping[: batch * rows], self.key_slots[:batch, :keys],
                                  self.key_mask[:batch, :rows, :keys])

    def _prepare(self, batch: int, rows: int, length: int, keys: list[torch.Tensor]) -> None:
        """Fill the attention's static key lists for the next replay of the (batch, rows, length) graph
        (flashinfer: plan on the host). keys: each sequence's key slots [num_keys + padding rows], causal from
        the end."""
        if self.static_backend is self.backend:
            self.backend.prepare_static(batch, rows, keys, num_heads=self.num_heads, dtype=self.dtype,
                                        scale=self.scale, max_keys=self.max_keys)
            return
        counts = torch.tensor([k.numel() for k in keys])  # [B]
        table = torch.full((batch, length), self.pad_slot, dtype=torch.long)  # [B, L]
        for row, slots in enumerate(keys):
            table[row, : slots.numel()] = slots
        self.key_slots[:batch, :length].copy_(table)
        last_key = counts[:, None] - rows + torch.arange(rows)[None, :]  # [B, Q]: the last key each row sees
        self.key_mask[:batch, :rows, :length].copy_(torch.arange(length)[None, None, :] <= last_key[:, :, None])


def _slots(slots: Index, num_keys: int, pad: int, pad_slot: int) -> torch.Tensor:
    """[num_keys + pad] long on the host: a span's key slots, then `pad` pad-slot keys for its padding rows."""
    own = torch.arange(slots.start, slots.stop) if isinstance(slots, slice) else slots.cpu()
    assert own.numel() == num_keys, (own.numel(), num_keys)
    return torch.cat([own, torch.full((pad,), pad_slot, dtype=torch.long)]) if pad else own


def _as_list(slots: list[int] | Index) -> list[int]:
    if isinstance(slots, slice):
        return list(range(slots.start, slots.stop))
    return slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
