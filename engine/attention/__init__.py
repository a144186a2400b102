"""Attention backends behind one small interface (see base.py); SDPA is the reference."""

from engine.attention.base import AttentionBackend, AttentionMetadata, SeqSpan, build_metadata
from engine.attention.sdpa import SdpaBackend

__all__ = ["AttentionBackend", "AttentionMetadata", "SdpaBackend", "SeqSpan", "build_metadata", "make_backend"]


def make_backend(name: str = "sdpa") -> AttentionBackend:
    if name == "sdpa":
        return SdpaBackend()
    raise ValueError(f"unknown attention backend {name!r}: use 'sdpa'")
