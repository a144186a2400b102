"""Reference attention on torch's scaled_dot_product_attention (CPU, and usable on CUDA).

KV layout per layer: K and V each [KVH, num_slots, D], so the keys of a contiguous run of slots are a
view [KVH, T, D] that SDPA reads without a gather copy. Decode (one query token) takes a short path:
on a 2-core CPU this function runs 30 times per SmolLM2 token, so every view op counts. A decode step of
several sequences (a batch) gathers their keys into one padded batch and attends in one call: per sequence,
attention was 56% of a 128-sequence decode step of SmolLM2 (profiled), most of it per-call overhead.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata, Index, SeqSpan
from engine.layers import native, panel


def untouched_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape), on the CPU in pages the OS maps to zero until first written (a private anonymous
    mmap), so that a KV cache costs memory only where it is used: SmolLM2's 2 x 8192 slots are 755 MB that
    torch.zeros wrote out (0.23 s of a start), where a chat fills a few thousand. The same zeros when read."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    count = math.prod(shape)
    pages = mmap.mmap(-1, max(count * dtype.itemsize, 1), flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(pages, dtype=dtype, count=count).view(shape)  # the tensor keeps the mapping alive


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._row_kernel: bool | None = None  # whether the row kernel runs here (known from the first forward)
        self._forward: tuple[AttentionMetadata | None, dict] = (None, {})  # what `_once` made for this forward

    @property
    def batches_decode(self) -> bool:
        """The padded gather of a several-sequence decode step, where the row kernel does not run (where it does,
        each sequence takes it: building the gather was wasted, an index of every sequence's keys a forward)."""
        return not self._row_kernel

    def _once(self, meta: AttentionMetadata, name: str, make: Callable[[], Any]) -> Any:
        """`make()`, made at the forward's first layer that asks and kept for its other layers (a forward: its
        `meta`)."""
        if self._forward[0] is not meta:
            self._forward = (meta, {})
        made = self._forward[1]
        if name not in made:
            made[name] = make()
        return made[name]

    def _span_table(self, meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`span_table(meta.spans)`, its slots checked against the cache once (index_select's check); None where a
        span has a mask of its own."""
        if any(span.mask is not None for span in meta.spans):
            return None
        table = span_table(meta.spans)
        if int(table[1].max()) >= self.k[0].shape[1]:
            raise IndexError(f"a key slot past the cache's {self.k[0].shape[1]}")
        return table

    def _masks(self, meta: AttentionMetadata, device: torch.device) -> tuple[torch.Tensor | None, ...]:
        """Each span's [q, T] bool mask for `attend` (None: none needed); where the row kernel takes the causal
        spans, never made."""
        return tuple(None if (m := s.bool_mask()) is None else m.to(device) for s in meta.spans)

    def allocate(
        self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        shape = (num_kv_heads, num_slots, head_dim)
        self.k = [untouched_zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [untouched_zeros(shape, dtype, device) for _ in range(num_layers)]

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = self.k[layer], self.v[layer]  # [KVH, S, D]
        _write(k_cache, meta.slot_mapping, k)
        _write(v_cache, meta.slot_mapping, v)
        n, h, d = q.shape
        kernel = self._row_kernel = row_kernel(q, k_cache)  # few-row causal spans: each row the same bits at any row
        # count
        if len(meta.spans) == 1 and n == 1 and not kernel:  # decode of one sequence: q [1, H, D] -> [1, H, 1, D]
            span = meta.spans[0]
            o = attend(q.view(1, h, 1, d), read_cache(k_cache, span.key_slots, q.dtype),
                       read_cache(v_cache, span.key_slots, q.dtype), mask=None, causal=False, scale=scale)
            return o.view(1, h * d)
        # several sequences, one query each: q [B, H, D]. Where the row kernel runs, each goes through it below,
        # the bits it gets alone (the padded batch's last bits differ: under q8 they flipped tokens; 3-10% of a
        # batch's decode speed on the 2-vCPU VM, 4-64 sequences)
        if meta.batched_decode is not None and not kernel:
            gather = meta.batched_decode
            b, t = gather.key_mask.shape[0], gather.key_mask.shape[-1]
            kvh = k_cache.shape[0]
            keys = k_cache.index_select(1, gather.key_index).view(kvh, b, t, d).transpose(0, 1).to(q.dtype)
            values = v_cache.index_select(1, gather.key_index).view(kvh, b, t, d).transpose(0, 1).to(q.dtype)
            o = attend(q.view(b, h, 1, d), keys, values, mask=gather.key_mask, causal=False, scale=scale)
            return o.reshape(b, h * d)
        if kernel and len(meta.spans) > 1 and not torch.compiler.is_compiling():
            table = self._once(meta, "table", lambda: self._span_table(meta))
            if table is not None:  # several causal spans: one kernel call for all
                return causal_spans(q, k_cache, v_cache, *table, scale)
        outs = []
        for i, span in enumerate(meta.spans):
            if kernel and span.mask is None:
                outs.append(causal_rows(q.narrow(0, span.q_start, span.q_len), k_cache, v_cache, span.key_slots,
                                        span.num_keys, scale))  # [q, H*D]
                continue
            q_s = q.narrow(0, span.q_start, span.q_len).transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
            keys, values = (read_cache(c, span.key_slots, q.dtype) for c in (k_cache, v_cache))
            o = attend(q_s, keys, values, mask=self._once(meta, "masks", lambda: self._masks(meta, q.device))[i],
                       causal=span.is_square_causal and span.q_len > 1, scale=scale)  # [1, H, q, D]
            outs.append(o[0].transpose(0, 1).reshape(span.q_len, h * d))  # [q, H*D]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)


ROW_KERNEL_ROWS = 32  # query rows per call of engine/kernels/attention.cpp (a verify: one call; a prefill: several)


def row_kernel(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether causal spans here take the row-invariant kernel: float32 queries over a float32 or half cache, on a
    CPU where the panel library builds."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and k_cache.dtype in KERNEL_CACHE_DTYPES
            and panel.ready())


KERNEL_CACHE_DTYPES = (torch.float32, torch.float16)  # the row kernel's cache: float32, or half (EngineConfig.kv_dtype)


def causal_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: Index, num_keys: int,
                scale: float) -> torch.Tensor:
    """q [n, H, D] -> [n, H * D]: causal attention of one sequence's n newest rows over its num_keys keys at
    `slots` (a slice: read in place; a tensor: gathered first), by engine/kernels/attention.cpp, each row the same
    bits at any n, so a verify reproduces plain decoding, and attention gives a prompt the same bits however its
    prefill was split (chunks, a prefix-cache hit; on Intel the matmuls past 32 rows still do not: README); a
    prefill ROW_KERNEL_ROWS rows a call. Eager and compiled (one opaque op: no guard on n) alike."""
    if isinstance(slots, slice):
        first, keys, values = slots.start, k_cache, v_cache
    else:  # scattered blocks: gather the run first (the same values in the same order)
        first, keys, values = 0, k_cache.index_select(1, slots), v_cache.index_select(1, slots)
    op = causal_rows_op if torch.compiler.is_compiling() else _causal_rows
    return op(q, keys, values, first, num_keys, scale)


def _causal_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int, num_keys: int,
                 scale: float) -> torch.Tensor:
    n, h, d = q.shape
    q = q.contiguous()
    out = torch.empty(n, h * d)
    lib, threads = native.library(), torch.get_num_threads()
    kernel = lib.causal_attention_half if keys.dtype == torch.float16 else lib.causal_attention
    for a in range(0, n, ROW_KERNEL_ROWS):  # a prefill's rows ROW_KERNEL_ROWS at a time: row r sees keys ..t - n + r
        b = min(a + ROW_KERNEL_ROWS, n)
        kernel(q[a].data_ptr(), b - a, h, d, keys.data_ptr(), values.data_ptr(), keys.shape[0], keys.shape[1], first,
               num_keys - (n - b), scale, out[a].data_ptr(), threads)
    return out


def span_table(spans: Sequence[SeqSpan]) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal spans as engine/kernels/attention.cpp's causal_attention_spans reads them: a table [spans, 5] of
    (q_start, q_len, num_keys, first, offset), where a span whose keys lie in one run of slots from `first` has
    offset -1, and any other's slots lie at `offset` in the second tensor, every such span's slots end to end."""
    rows, gathered, offset = [], [], 0
    for span in spans:
        if isinstance(span.key_slots, slice):
            rows.append((span.q_start, span.q_len, span.num_keys, span.key_slots.start, -1))
        else:
            rows.append((span.q_start, span.q_len, span.num_keys, 0, offset))
            gathered.append(part := span.key_slots[: span.num_keys])
            if len(part) != span.num_keys:  # (a short one would shift every later span's slots)
                raise ValueError(f"a span of {span.num_keys} keys has {len(part)} key slots")
            offset += span.num_keys
    slots = torch.cat(gathered) if gathered else torch.zeros(1, dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long), slots.to(torch.long).contiguous()


def causal_spans(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                 slots: torch.Tensor, scale: float) -> torch.Tensor:
    """q [N, H, D] -> [N, H * D]: `causal_rows` of every span of `span_table` in one kernel call, each row the same
    bits (a call a span cost a small model's batched step most of its time: 20-35 us of Python and ctypes a span and
    layer)."""
    n, h, d = q.shape
    q = q.contiguous()
    out = torch.empty(n, h * d)
    lib = native.library()
    kernel = lib.causal_attention_spans_half if k_cache.dtype == torch.float16 else lib.causal_attention_spans
    kernel(q.data_ptr(), h, d, k_cache.data_ptr(), v_cache.data_ptr(), k_cache.shape[0], k_cache.shape[1], len(table),
           table.data_ptr(), slots.data_ptr(), scale, out.data_ptr(), torch.get_num_threads())
    return out


@torch.library.custom_op("ssd_chat::causal_rows", mutates_args=())
def causal_rows_op(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int, num_keys: int,
                   scale: float) -> torch.Tensor:
    """`_causal_rows` as one opaque op, for compiled steps: the same bits as eager."""
    return _causal_rows(q, keys, values, first, num_keys, scale)


@causal_rows_op.register_fake
def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int, num_keys: int,
      scale: float) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, causal: bool, scale: float
) -> torch.Tensor:
    """Attention with grouped KV heads. q: [B, H, q, D], k/v: [B, KVH, T, D], mask: [q, T] or [B, 1, q, T] bool
    -> [B, H, q, D].

    torch's fused CPU kernel costs about 8 ms per call below head_dim 64 (measured, torch 2.13), which
    only tiny test models have: those take the plain matmul-softmax route instead.
    """
    if q.shape[-1] >= 64 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    b, h, n, d = q.shape
    kvh, t = k.shape[1], k.shape[2]
    scores = torch.matmul(q.reshape(b, kvh, h // kvh * n, d), k.transpose(2, 3)).mul_(scale)  # [B, KVH, G*q, T]
    scores = scores.view(b, kvh, h // kvh, n, t)
    if causal:
        mask = torch.ones(n, t, dtype=torch.bool, device=q.device).tril(t - n)
    if mask is not None:
        scores = scores.masked_fill(~(mask if mask.dim() == 2 else mask.unsqueeze(1)), float("-inf"))  # [B,1,1,q,T]
    probs = torch.softmax(scores, dim=-1).view(b, kvh, h // kvh * n, t)
    return torch.matmul(probs, v).view(b, h, n, d)


def _write(cache: torch.Tensor, slots: Index, new: torch.Tensor) -> None:
    """cache [KVH, S, D] <- new [N, KVH, D] at `slots`."""
    if isinstance(slots, slice):
        cache.narrow(1, slots.start, slots.stop - slots.start).copy_(new.transpose(0, 1))
    else:  # (a half cache: rounded to nearest, as copy_ rounds)
        cache.index_copy_(1, slots, new.transpose(0, 1).to(cache.dtype))


def read_cache(cache: torch.Tensor, slots: Index, dtype: torch.dtype) -> torch.Tensor:
    """A cache's keys or values at `slots`, [1, KVH, T, D] in `dtype` (the queries'; a half cache's values convert
    exactly): a view for a slice of slots of a cache in that dtype, a gather or a copy otherwise."""
    if isinstance(slots, slice):
        return cache.narrow(1, slots.start, slots.stop - slots.start).unsqueeze(0).to(dtype)
    return cache.index_select(1, slots).unsqueeze(0).to(dtype)
