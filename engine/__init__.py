"""ssd-chat's inference engine: own Llama-3 / Qwen3 models on a paged, prefix-cached KV cache.

    from engine import LLM, SamplingParams
    llm = LLM(target="smollm2-135m")
    outs = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=32))
"""

from engine.config import DEFAULT_TARGET, EngineConfig
from engine.errors import EngineError
from engine.llm import LLM
from engine.outputs import (
    EngineWarning,
    Event,
    FinishReason,
    PrefillProgress,
    RequestFinished,
    RequestOutput,
    RequestStats,
    TokenDelta,
)
from engine.sampling_params import SamplingParams

__all__ = [
    "DEFAULT_TARGET", "LLM", "EngineConfig", "EngineError", "EngineWarning", "Event", "FinishReason", "PrefillProgress",
    "RequestFinished", "RequestOutput", "RequestStats", "SamplingParams", "TokenDelta",
]
