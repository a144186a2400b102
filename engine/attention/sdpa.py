"""Reference attention on torch's scaled_dot_product_attention (CPU, and usable on CUDA).

KV layout per layer: [2, KVH, num_slots, D], so the keys of a contiguous run of slots are a view
[KVH, T, D] that SDPA reads without a gather copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.base import AttentionBackend, AttentionMetadata


class SdpaBackend(AttentionBackend):
    name = "sdpa"

    def __init__(self) -> None:
        self.kv: list[torch.Tensor] = []

    def allocate(
        self, *, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device,
    ) -> None:
        self.kv = [
            torch.zeros(2, num_kv_heads, num_slots, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache, v_cache = self.kv[layer].unbind(0)            # 2 x [KVH, S, D]
        slots = meta.slot_mapping
        if isinstance(slots, slice):  # narrow() instead of tuple indexing: this runs 30x per token
            k_cache.narrow(1, slots.start, slots.stop - slots.start).copy_(k.transpose(0, 1))
            v_cache.narrow(1, slots.start, slots.stop - slots.start).copy_(v.transpose(0, 1))
        else:
            k_cache.index_copy_(1, slots, k.transpose(0, 1))
            v_cache.index_copy_(1, slots, v.transpose(0, 1))
        outs = []
        for span, mask in zip(meta.spans, meta.masks, strict=True):
            q_s = q.narrow(0, span.q_start, span.q_len).transpose(0, 1)  # [H, q, D]
            key_slots = span.key_slots
            if isinstance(key_slots, slice):
                keys = k_cache.narrow(1, key_slots.start, key_slots.stop - key_slots.start)  # [KVH, T, D]
                values = v_cache.narrow(1, key_slots.start, key_slots.stop - key_slots.start)
            else:
                keys, values = k_cache.index_select(1, key_slots), v_cache.index_select(1, key_slots)
            o = F.scaled_dot_product_attention(
                q_s.unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), attn_mask=mask,
                is_causal=span.is_square_causal and span.q_len > 1, scale=scale, enable_gqa=True,
            )                                                   # [1, H, q, D]
            outs.append(o[0].transpose(0, 1).reshape(span.q_len, -1))  # [q, H*D]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
