"""Paged attention on flashinfer (CUDA; the optional `gpu` extra): prefill with a cached prefix, decode, and
multi-query with a custom mask (K+1 verification, SSD branch drafting), plus the captured steps of CUDA graphs
(decode on the decode wrapper, several causal rows per sequence on the prefill wrapper, both in graph mode).

KV layout per layer: K and V each [num_slots, 1, KVH, D], flashinfer's NHD paged layout with a page size of one
slot. A page is then a slot, so every key list a SeqSpan can name (block-table runs, SSD scratch slots after a
shared path) is a page list as it is, with no copy. flashinfer plans once per forward (the first layer's call),
not per layer. This module imports flashinfer at construction: choose it through engine.attention.make_backend.
"""

from __future__ import annotations

import torch

from engine.attention.base import AttentionBackend, AttentionMetadata, Index
from engine.cuda_graphs import StaticStepMetadata

WORKSPACE_BYTES = 256 << 20  # flashinfer's float workspace (split-KV partial results)


class FlashInferBackend(AttentionBackend):
    name = "flashinfer"

    def __init__(self) -> None:
        import flashinfer  # the optional dependency: only a CUDA box with the gpu extra reaches this line

        self._fi = flashinfer
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self._planned: AttentionMetadata | None = None  # the forward the eager wrappers are planned for
        self._planned_wrapper = None
        self._graph_wrappers: dict[tuple[int, int], object] = {}  # captured (sequences, rows) -> its graph-mode wrapper

    def allocate(
        self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        shape = (num_slots, 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_kv_heads, self.head_dim, self.num_slots = num_kv_heads, head_dim, num_slots
        self.device = device
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(self.workspace, "NHD")
        self.decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(self.workspace, "NHD")

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = self.k[layer], self.v[layer]  # [S, 1, KVH, D]
        _write(k_cache, meta.slot_mapping, k)
        _write(v_cache, meta.slot_mapping, v)
        if isinstance(meta, StaticStepMetadata):
            wrapper = self._graph_wrappers[(meta.batch, meta.rows)]  # planned by prepare_static before the replay
        else:
            wrapper = self._plan(meta, q.shape[1], q.dtype, scale)
        out = wrapper.run(q, (k_cache, v_cache))  # [N, H, D]
        return out.reshape(q.shape[0], -1)

    # -- eager planning ----------------------------------------------------------------------------
    def _plan(self, meta: AttentionMetadata, num_heads: int, dtype: torch.dtype, scale: float):
        if meta is self._planned:  # layers 1.. of the same forward
            return self._planned_wrapper
        spans = meta.spans
        key_indptr, key_slots = _key_lists([s.key_slots for s in spans], [s.num_keys for s in spans], self.device)
        last_page_len = torch.ones(len(spans), dtype=torch.int32)
        common = dict(q_data_type=dtype, kv_data_type=self.k[0].dtype, sm_scale=scale)
        if all(s.q_len == 1 for s in spans):  # decode, SSD branch steps: one query per span, no mask needed
            self.decode.plan(key_indptr, key_slots, last_page_len, num_heads, self.num_kv_heads, self.head_dim, 1,
                             **common)
            wrapper = self.decode
        else:
            q_indptr = torch.zeros(len(spans) + 1, dtype=torch.int32)
            for i, s in enumerate(spans):
                assert s.q_start == int(q_indptr[i]), "spans must cover the query rows in order"
                q_indptr[i + 1] = q_indptr[i] + s.q_len
            custom = None
            if any(s.mask is not None for s in spans):  # one mask for the whole batch: causal spans spelled out
                custom = torch.cat([_span_mask(s.bool_mask(), s.q_len, s.num_keys).flatten() for s in spans])
                custom = custom.to(self.device)
            self.prefill.plan(q_indptr, key_indptr, key_slots, last_page_len, num_heads, self.num_kv_heads,
                              self.head_dim, 1, custom_mask=custom, causal=custom is None, **common)
            wrapper = self.prefill  # causal is bottom-right aligned: query i is key num_keys - q_len + i
        self._planned, self._planned_wrapper = meta, wrapper
        return wrapper

    # -- CUDA graphs (engine.cuda_graphs.StepGraphs) ------------------------------------------------
    def prepare_static(
        self, batch: int, rows: int, keys: list[torch.Tensor], *, num_heads: int, dtype: torch.dtype, scale: float,
        max_keys: int,
    ) -> None:
        """Plan the captured step of `batch` sequences x `rows` causal query rows (outside the graph: planning runs
        on the host). keys: each sequence's key slots, its padding rows' pad keys included."""
        wrapper = self._graph_wrappers.get((batch, rows))
        if wrapper is None:
            indptr = torch.zeros(batch + 1, dtype=torch.int32, device=self.device)
            indices = torch.zeros(batch * (max_keys + rows), dtype=torch.int32, device=self.device)
            last_page_len = torch.ones(batch, dtype=torch.int32, device=self.device)
            if rows == 1:
                wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
                    paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last_page_len)
            else:
                wrapper = self._fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD", use_cuda_graph=True,
                    qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32, device=self.device),
                    paged_kv_indptr_buf=indptr, paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last_page_len)
            self._graph_wrappers[(batch, rows)] = wrapper
        key_indptr, indices = _key_lists(keys, [k.numel() for k in keys], self.device)
        common = dict(q_data_type=dtype, kv_data_type=self.k[0].dtype, sm_scale=scale)
        last_page_len = torch.ones(batch, dtype=torch.int32)
        if rows == 1:
            wrapper.plan(key_indptr, indices, last_page_len, num_heads, self.num_kv_heads, self.head_dim, 1, **common)
        else:
            q_indptr = torch.arange(batch + 1, dtype=torch.int32) * rows
            wrapper.plan(q_indptr, key_indptr, indices, last_page_len, num_heads, self.num_kv_heads, self.head_dim,
                         1, causal=True, **common)


def _key_lists(key_slots: list[Index], num_keys: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """(indptr [B+1] int32 on the host, slots [sum] int32 on `device`): the spans' key slots as page lists."""
    indptr = torch.zeros(len(num_keys) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(num_keys, dtype=torch.int32), 0)
    parts = [torch.arange(s.start, s.stop, device=device) if isinstance(s, slice) else s.to(device) for s in key_slots]
    return indptr, torch.cat(parts).to(torch.int32)


def _span_mask(mask: torch.Tensor | None, q_len: int, num_keys: int) -> torch.Tensor:
    if mask is not None:
        return mask.cpu()
    if q_len == 1:
        return torch.ones(1, num_keys, dtype=torch.bool)
    return torch.ones(q_len, num_keys, dtype=torch.bool).tril(num_keys - q_len)  # square causal


def _write(cache: torch.Tensor, slots: Index, new: torch.Tensor) -> None:
    """cache [S, 1, KVH, D] <- new [N, KVH, D] at `slots`."""
    flat = cache.view(cache.shape[0], *cache.shape[2:])  # [S, KVH, D]
    if isinstance(slots, slice):
        flat.narrow(0, slots.start, slots.stop - slots.start).copy_(new)
    else:
        flat.index_copy_(0, slots, new)
