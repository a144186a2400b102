"""Per-request state above the token level: text deltas, stop strings, timing and the final output."""

from __future__ import annotations

import time
from collections import deque

from engine.detokenizer import IncrementalDetokenizer
from engine.errors import InvalidParameterError, PromptTooLongError
from engine.outputs import (
    Event,
    FinishReason,
    PrefillProgress,
    RequestFinished,
    RequestOutput,
    RequestStats,
    SpecStats,
    TokenDelta,
)
from engine.sequence import Sequence, StepOutput


def check_prompt(token_ids: list[int], vocab_size: int, max_model_len: int, model_max: int) -> None:
    """A prompt's token ids that a request can take: some, each in the vocabulary, fewer than the context holds
    (InvalidParameterError, PromptTooLongError: one line that says what to do)."""
    if not token_ids:
        raise InvalidParameterError("the prompt is empty: type something")
    if min(token_ids) < 0 or max(token_ids) >= vocab_size:
        raise InvalidParameterError(f"prompt token ids must be in [0, {vocab_size}) for this model")
    if len(token_ids) >= max_model_len:
        more = f", or raise --max-model-len (up to {model_max})" if max_model_len < model_max else ""
        raise PromptTooLongError(
            f"the prompt has {len(token_ids)} tokens but the context limit is {max_model_len}: shorten it{more}"
        )


class RequestState:
    def __init__(
        self, seq: Sequence, detokenizer: IncrementalDetokenizer, *, mode: str, stop_ids: frozenset[int], k: int = 0
    ):
        self.seq = seq
        self.detokenizer = detokenizer
        self.mode = mode
        self.stop_ids = stop_ids  # EOS (unless ignore_eos) and stop_token_ids: kept as ids, not as text
        self.events: deque[Event] = deque()
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.output: RequestOutput | None = None
        self.spec = _SpecCounters(k) if mode != "ar" else None
        self.threads_heard: tuple[int, int] | None = None  # its last ThreadsChanged's (threads, most) (CoreShare.tell)

    @property
    def request_id(self) -> int:
        return self.seq.seq_id

    def on_step(self, out: StepOutput) -> int:
        """Record one engine step: its tokens (a TokenDelta) and, for a verify step, a StepStats event.
        Returns how many of the step's tokens to keep: fewer when a stop string ended the reply mid-step."""
        if out.draft_reused_tokens is not None and self.spec is not None:
            self.spec.draft_reused = out.draft_reused_tokens
        keep, text = self._detokenize(out.tokens)
        if out.stats is not None:
            self.events.append(out.stats)
            if self.spec is not None:
                self.spec.add(out, num_kept=keep)
        now = time.perf_counter()
        self.t_first = self.t_first or now
        self.t_last = now
        self.events.append(TokenDelta(self.request_id, tuple(out.tokens[:keep]), text, tuple(out.sources[:keep])))
        return keep

    def on_prefill_chunk(self) -> None:
        """A step ran a chunk of this prompt and more is to come: a PrefillProgress."""
        self.events.append(PrefillProgress(self.request_id, self.seq.num_computed_tokens, self.seq.num_prompt_tokens))

    def _detokenize(self, token_ids: list[int]) -> tuple[int, str]:
        """Text of a step's tokens and how many of them to keep. With stop strings, tokens go in one at a
        time so that a stop string cuts the step right where it completes; otherwise in one decode."""
        text_ids = token_ids
        if token_ids and self.seq.finish_reason is FinishReason.STOP and token_ids[-1] in self.stop_ids:
            text_ids = token_ids[:-1]  # EOS / a stop token id: kept as an id, never as text
        if not self.detokenizer.has_stop_strings:
            return len(token_ids), self.detokenizer.push(text_ids) if text_ids else ""
        text = ""
        for i, token in enumerate(text_ids):
            text += self.detokenizer.push([token])
            if self.detokenizer.stopped:
                return i + 1, text
        return len(token_ids), text

    def fell_back_to_ar(self) -> None:
        """Its draft process was lost: a request that ran no speculative round yet reports AR (it runs all in AR)."""
        if self.spec is not None and not self.spec.steps:
            self.mode = "ar"

    @property
    def hit_stop_string(self) -> bool:
        return self.detokenizer.stopped

    def finalize(self) -> None:
        """Queue the remaining text and the RequestFinished event (once the sequence has finished)."""
        assert self.seq.finish_reason is not None
        rest = self.detokenizer.flush()
        if rest:
            self.events.append(TokenDelta(self.request_id, (), rest))
        seq = self.seq
        t_first = self.t_first or time.perf_counter()
        t_last = self.t_last or t_first
        stats = RequestStats(
            mode=self.mode,
            prompt_tokens=seq.num_prompt_tokens,
            reused_prefix_tokens=seq.num_cached_tokens,
            prefill_tokens=seq.num_prompt_tokens - seq.num_cached_tokens if seq.num_generated else 0,
            generated_tokens=seq.num_generated,
            ttft_s=t_first - self.t_start,
            decode_time_s=t_last - t_first,
            total_time_s=t_last - self.t_start,
            spec=None if self.spec is None or not self.spec.steps else self.spec.summary(),  # (no round: no figures)
            seed=seq.seed,
        )
        self.output = RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            token_ids=seq.generated_ids,
            text=self.detokenizer.text,
            finish_reason=seq.finish_reason,
            stats=stats,
        )
        self.events.append(RequestFinished(self.request_id, self.output))

    def drain(self) -> list[Event]:
        out = list(self.events)
        self.events.clear()
        return out


class _SpecCounters:
    """Running totals behind SpecStats."""

    def __init__(self, k: int):
        self.steps = self.drafted = self.accepted = self.emitted = 0
        self.accepted_at = [0] * k
        self.drafted_at = [0] * k
        self.verify_s = self.draft_s = self.draft_on_hit_s = 0.0
        self.draft_reused = 0
        self.draft_idle: float | None = None
        self.hits: int | None = None
        self.emitted_on_hit = 0
        self.plain = 0
        self.draft_plain_s = 0.0

    def add(self, out: StepOutput, *, num_kept: int) -> None:
        stats = out.stats
        self.steps += 1
        self.drafted += stats.num_drafted
        self.accepted += stats.num_accepted
        self.emitted += num_kept  # what the step actually added to the reply (a stop may cut it short)
        for i in range(stats.num_drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < stats.num_accepted
        self.verify_s += stats.verify_time_s
        self.draft_s += stats.draft_time_s
        if stats.draft_idle_s is not None:
            self.draft_idle = (self.draft_idle or 0.0) + stats.draft_idle_s
        if stats.num_drafted == 0:
            self.plain += 1
            self.draft_plain_s += stats.draft_time_s
        if stats.cache_hit is not None:
            self.hits = (self.hits or 0) + stats.cache_hit
            self.emitted_on_hit += num_kept if stats.cache_hit else 0
            self.draft_on_hit_s += stats.draft_time_s if stats.cache_hit else 0.0

    def summary(self) -> SpecStats:
        return SpecStats(
            num_steps=self.steps, num_drafted=self.drafted, num_accepted=self.accepted, num_emitted=self.emitted,
            accepted_per_position=tuple(self.accepted_at), drafted_per_position=tuple(self.drafted_at),
            verify_time_s=self.verify_s, draft_time_s=self.draft_s, draft_time_on_hit_s=self.draft_on_hit_s,
            draft_reused_prefix_tokens=self.draft_reused,
            num_cache_hits=self.hits, emitted_on_hit=self.emitted_on_hit, draft_idle_s=self.draft_idle,
            num_plain_steps=self.plain, draft_time_plain_s=self.draft_plain_s,
        )
