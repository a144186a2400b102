"""Rotary position embeddings (the half-split layout of Hugging Face Llama/Qwen), with Llama-3 scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # "default" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


def inverse_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:  # [head_dim / 2]
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope.rope_type == "default":
        return inv_freq
    assert rope.rope_type == "llama3", rope.rope_type
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend smoothly in between.
    low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
    high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Holds cos/sin tables for every position; `lookup` once per forward, `apply` once per layer."""

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig):
        super().__init__()
        inv_freq = inverse_frequencies(head_dim, rope).float()
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)               # [P, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)        # [P, D]
        sin = emb.sin()
        sin[:, : head_dim // 2] *= -1  # rotate_half(x) * sin == roll(x, D/2) * (sin with its first half negated)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """[N] -> 2 x [N, 1, D] in the activations' dtype (the tables stay float32, as transformers keeps them)."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [N, H, D]; cos/signed_sin: [N, 1, D] from `lookup`. Returns x * cos + rotate_half(x) * sin,
    in three kernels (rotate_half(x) * sin == roll(x, D/2) * signed_sin)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
