"""Typed results and stream events handed to callers of the engine."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    STOP = "stop"            # EOS, a stop token id or a stop string
    LENGTH = "length"        # max_tokens reached
    CONTEXT = "context"      # the context limit reached
    CANCELLED = "cancelled"  # the caller closed the stream


class TokenSource(StrEnum):
    """Where a generated token came from."""

    TARGET = "target"                # plain decoding (AR, or the prefill's first token)
    ACCEPTED = "accepted"            # a draft token the target accepted (sync SD)
    ACCEPTED_HIT = "accepted_hit"    # ... drafted ahead of time, answered from the speculation cache (SSD)
    ACCEPTED_MISS = "accepted_miss"  # ... drafted just in time after a speculation-cache miss (SSD)
    RECOVERY = "recovery"            # the target's token after a rejected draft token
    BONUS = "bonus"                  # the target's extra token after all drafts were accepted


@dataclass(frozen=True)
class SpecStats:
    """Speculation figures of one request (absent in AR mode)."""

    num_steps: int                   # target verify steps
    num_drafted: int                 # draft tokens proposed
    num_accepted: int                # draft tokens accepted
    num_emitted: int                 # tokens those steps produced (accepted + recovery/bonus, before stops)
    accepted_per_position: tuple[int, ...]  # [K]: rounds whose i-th draft token was accepted
    drafted_per_position: tuple[int, ...]   # [K]: rounds that proposed an i-th draft token
    num_cache_hits: int | None = None       # SSD only
    num_plain_steps: int = 0                # steps that drafted nothing (k = 0): neither hit nor miss
    draft_time_plain_s: float = 0.0  # the part of draft_time_s spent in those steps (SSD: sending the outcome)
    emitted_on_hit: int = 0                 # SSD: tokens from rounds answered by the cache
    verify_time_s: float = 0.0       # time the target spent verifying
    draft_time_s: float = 0.0        # time the target waited for drafts
    draft_time_on_hit_s: float = 0.0  # SSD: the part of draft_time_s spent in rounds the cache answered
    draft_idle_s: float | None = None  # SSD with a draft process: time the draft waited for the target
    draft_reused_prefix_tokens: int = 0  # prompt tokens whose draft KV came from the draft's prefix cache

    @property
    def tau(self) -> float:
        """Mean tokens per target step (accepted + the recovery/bonus token)."""
        return self.num_emitted / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def per_position_acceptance(self) -> tuple[float | None, ...]:
        """The share of drafted tokens accepted at each draft position; None at a position never drafted (the
        adaptive length stayed below it), which is no rejection."""
        return tuple(a / d if d else None for a, d in zip(self.accepted_per_position, self.drafted_per_position,
                                                           strict=True))

    @property
    def cache_hit_rate(self) -> float | None:
        """SSD: the share of the rounds that drafted whose proposal came from the cache."""
        drafting = self.num_steps - self.num_plain_steps
        return None if self.num_cache_hits is None or not drafting else self.num_cache_hits / drafting

    @property
    def num_misses(self) -> int | None:
        """SSD: verify rounds drafted just in time (the first round counts as a miss); None outside SSD."""
        return None if self.num_cache_hits is None else self.num_steps - self.num_plain_steps - self.num_cache_hits

    @property
    def tau_on_hit(self) -> float | None:
        """SSD: tokens per round answered from the speculation cache."""
        return self.emitted_on_hit / self.num_cache_hits if self.num_cache_hits else None

    @property
    def tau_on_miss(self) -> float | None:
        """SSD: tokens per round drafted just in time (the first round counts as a miss)."""
        misses = self.num_misses
        return (self.num_emitted - self.num_plain_steps - self.emitted_on_hit) / misses if misses else None

    @property
    def wait_s_on_hit(self) -> float | None:
        """SSD: the target's mean wait for its proposal in a round the cache answered (the messages, mostly)."""
        return self.draft_time_on_hit_s / self.num_cache_hits if self.num_cache_hits else None

    @property
    def wait_s_on_miss(self) -> float | None:
        """SSD: the mean wait in a round drafted just in time (the first round counts as a miss)."""
        misses = self.num_misses
        return (self.draft_time_s - self.draft_time_on_hit_s - self.draft_time_plain_s) / misses if misses else None

    @property
    def ideal_tok_s(self) -> float | None:
        """SSD's ceiling: every round a hit, the target never waiting: tau on hit per verify time."""
        if self.tau_on_hit is None or not self.verify_time_s:
            return None
        return self.tau_on_hit / (self.verify_time_s / self.num_steps)

    def to_dict(self) -> dict:
        return {
            **asdict(self), "tau": self.tau, "acceptance_rate": self.acceptance_rate,
            "per_position_acceptance": list(self.per_position_acceptance), "cache_hit_rate": self.cache_hit_rate,
            "tau_on_hit": self.tau_on_hit, "tau_on_miss": self.tau_on_miss, "ideal_tok_s": self.ideal_tok_s,
            "wait_s_on_hit": self.wait_s_on_hit, "wait_s_on_miss": self.wait_s_on_miss,
        }


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
    spec: SpecStats | None = None
    seed: int | None = None    # a sampled request's seed (its own, or the one the engine drew); None when greedy

    @property
    def decode_tok_s(self) -> float:
        """Tokens per second after the first one (the first is counted in TTFT)."""
        if self.generated_tokens < 2 or self.decode_time_s <= 0:
            return 0.0
        return (self.generated_tokens - 1) / self.decode_time_s

    def to_dict(self) -> dict:
        out = {**asdict(self), "decode_tok_s": self.decode_tok_s}
        out["spec"] = None if self.spec is None else self.spec.to_dict()
        return out


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
    sources: tuple[TokenSource, ...] = ()  # one per token id


@dataclass(frozen=True)
class StepStats:
    """One target verify step of one request (SD / SSD)."""

    request_id: int
    num_drafted: int
    num_accepted: int
    verify_time_s: float          # the target's verify forward (shared by the batch)
    draft_time_s: float           # the target's wait for the draft tokens (0 on an SSD cache hit)
    cache_hit: bool | None = None  # SSD only
    draft_idle_s: float | None = None  # SSD with a draft process: how long it waited for this round's request


@dataclass(frozen=True)
class RequestFinished:
    """The last event of a request's stream."""

    request_id: int
    output: RequestOutput


@dataclass(frozen=True)
class EngineWarning:
    """Something the user should know that did not end the request (e.g. the draft process died and
    the request continues in AR mode). The engine also logs it, as a record with ALSO_AN_EVENT set."""

    request_id: int
    message: str
    draft_lost: bool = False  # the request's draft process is gone: it (and later requests) run in AR mode


ALSO_AN_EVENT = "ssd_chat_also_an_event"  # set on a log record whose message a request's stream also carries


def not_also_an_event(record: logging.LogRecord) -> bool:
    """A log filter (``handler.addFilter``) for handlers that show the user what the reply's stream does not: it
    drops records marked ALSO_AN_EVENT (one notice, not two)."""
    return not getattr(record, ALSO_AN_EVENT, False)


@dataclass(frozen=True)
class PrefillProgress:
    """A long prompt's prefill advanced by one chunk (engine.core): its KV now covers `done` of its `total`
    tokens (those from the prefix cache included). Only prompts longer than one chunk report it."""

    request_id: int
    done: int
    total: int


@dataclass(frozen=True)
class ThreadsChanged:
    """The engine's steps run on `threads` of its `most` CPU threads from here: fewer while other programs use its
    cores, all again once they stop (engine.cpu_contention). A request that starts on fewer gets one first."""

    request_id: int
    threads: int
    most: int

    @property
    def fewer(self) -> bool:
        """Whether steps run on fewer threads than the engine has."""
        return self.threads < self.most


FEWER_THREADS = "fewer threads for a while: other programs used the CPU"  # what a reply's figures say after it


Event = TokenDelta | StepStats | EngineWarning | PrefillProgress | ThreadsChanged | RequestFinished
