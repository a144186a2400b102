"""ssd-chat's inference engine: own Llama-3 / Qwen3 models on a paged, prefix-cached KV cache.

    from engine import LLM, SamplingParams
    llm = LLM(target="smollm2-135m")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))

`LLM` (torch, the models) is imported on first use: the chat app's process uses the engine's types and starts the
engine in a process of its own before it would need torch.
"""

from engine.config import DEFAULT_TARGET, EngineConfig
from engine.errors import EngineError
from engine.outputs import (
    EngineWarning,
    Event,
    FinishReason,
    PrefillProgress,
    RequestFinished,
    RequestOutput,
    RequestStats,
    ThreadsChanged,
    TokenDelta,
)
from engine.sampling_params import SamplingParams

__all__ = [
    "DEFAULT_TARGET", "LLM", "EngineConfig", "EngineError", "EngineWarning", "Event", "FinishReason", "PrefillProgress",
    "RequestFinished", "RequestOutput", "RequestStats", "SamplingParams", "ThreadsChanged", "TokenDelta",
]


def __getattr__(name: str):
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
