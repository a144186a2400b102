"""One request's mutable decoding state: its tokens, KV blocks and progress counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, auto

import torch

from engine.outputs import FinishReason, StepStats, TokenSource
from engine.sampling_params import SamplingParams


class SeqStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)
class Sequence:
    seq_id: int
    token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None  # the rejection rule's draws, when sampling (temperature > 0)
    seed: int | None = None  # a sampled request's seed (SamplingParams.seed, or drawn): the same reply again from it
    status: SeqStatus = SeqStatus.WAITING
    num_prompt_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0     # prompt tokens whose KV came from the prefix cache
    num_computed_tokens: int = 0   # tokens (from the start) whose KV is in the cache
    num_committed_blocks: int = 0  # leading blocks already hashed for prefix sharing
    finish_reason: FinishReason | None = None

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def noise_key(self) -> int | None:
        """The coupled race's key (engine.coupling): the seed of a request sampled by the race; else None (greedy,
        or the rejection rule's draws from `generator`)."""
        return self.seed if not self.params.is_greedy and self.params.sampler == "coupled" else None

    @property
    def needs_q(self) -> bool:
        """Whether its draft tokens carry the q rows they were drawn from: sampled by the rejection rule (not greedy,
        no noise key)."""
        return not self.params.is_greedy and self.noise_key is None

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED


@dataclass
class StepOutput:
    """What one engine step produced for one request, before stop conditions are applied."""

    tokens: list[int]
    sources: list[TokenSource]
    num_computed: int               # target KV now covers positions < num_computed
    num_drafted: int = 0
    num_accepted: int = 0
    stats: StepStats | None = field(default=None)
    draft_reused_tokens: int | None = None  # at prefill: prompt tokens whose draft KV came from its prefix cache
