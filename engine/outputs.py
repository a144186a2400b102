"""Typed results and stream events handed to callers of the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"            # EOS, a stop token id or a stop string
    LENGTH = "length"        # max_tokens reached
    CONTEXT = "context"      # the context limit reached
    CANCELLED = "cancelled"  # the caller closed the stream


@dataclass(frozen=True)
class RequestStats:
    """Timing and cache figures of one request (seconds, tokens)."""

    mode: str
    prompt_tokens: int
    reused_prefix_tokens: int  # prompt tokens whose KV came from the prefix cache
    prefill_tokens: int        # prompt tokens that actually went through the model
    generated_tokens: int
    ttft_s: float              # request start -> first generated token
    decode_time_s: float       # first generated token -> last one
    total_time_s: float

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first one (the first is counted in TTFT)."""
        if self.generated_tokens < 2 or self.decode_time_s <= 0:
            return 0.0
        return (self.generated_tokens - 1) / self.decode_time_s

    def to_dict(self) -> dict:
        return {**asdict(self), "decode_tok_s": self.decode_tok_s}


@dataclass(frozen=True)
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: FinishReason
    stats: RequestStats

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": str(self.finish_reason),
            "stats": self.stats.to_dict(),
        }


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one request and the text they completed (may be "" while a UTF-8
    character or a possible stop string is still incomplete). Deltas concatenate to the full text."""

    request_id: int
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class RequestFinished:
    """The last event of a request's stream."""

    request_id: int
    output: RequestOutput


Event = TokenDelta | RequestFinished
