"""Model hyper-parameters, parsed once from a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import UnsupportedArchitectureError
from engine.layers.rotary import RopeConfig

FAMILIES = {"LlamaForCausalLM": "llama", "Qwen3ForCausalLM": "qwen3"}


@dataclass(frozen=True)
class ModelArgs:
    family: str                 # "llama" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    reduced_head: bool = False  # ssd-chat drafts: the head scores only a subset of the vocabulary
    embedding_from_target: bool = False  # ssd-chat drafts: the input embedding is the target's (not in the files)

    @property
    def qk_norm(self) -> bool:
        return self.family == "qwen3"

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in FAMILIES:
            raise UnsupportedArchitectureError(
                f"architecture {arch!r} is not supported: use a model of {', '.join(FAMILIES)}"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedArchitectureError(f"hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            family=FAMILIES[arch],
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope=_rope_config(cfg),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            eos_token_ids=eos_ids,
            reduced_head=bool(cfg.get("reduced_head", False)),
            embedding_from_target=bool(cfg.get("embedding_from_target", False)),
        )


def _rope_config(cfg: dict[str, Any]) -> RopeConfig:
    """transformers 5 writes `rope_parameters`; hub checkpoints still carry rope_theta + rope_scaling."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return RopeConfig(theta=float(theta))
    if rope_type != "llama3":
        raise UnsupportedArchitectureError(f"rope scaling {rope_type!r} is not supported (default or llama3)")
    return RopeConfig(
        theta=float(theta),
        rope_type="llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )
