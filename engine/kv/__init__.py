"""Paged KV-cache bookkeeping (pure Python; the tensors live in the attention backend)."""

from engine.kv.block_manager import BlockManager

__all__ = ["BlockManager"]
