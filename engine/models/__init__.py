"""Our own Llama-3.x and Qwen3 implementations (transformers is only the reference in tests)."""

from engine.models.args import ModelArgs
from engine.models.llama import CausalLM, ForwardContext

__all__ = ["CausalLM", "ForwardContext", "ModelArgs"]
