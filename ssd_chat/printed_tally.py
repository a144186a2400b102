"""The figures of the part of a reply the plain mode printed: its stats line after a Ctrl-C counts only that part.

After the first Ctrl-C the engine's step under way runs on and its tokens are never printed (plain.print_stream),
but the engine's own figures (RequestStats, SpecStats) count them: the token count, the decode speed and tau were
those of a reply longer than the one the user saw. PrintedTally counts what was printed instead: its tokens (a
textless delta's once the text they complete is printed), the verify steps whose tokens those are (tau, the
acceptance rate, the cache hits), and the time from the first printed text to the last (tok/s, after the first
token, as the engine's decode speed is).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine.outputs import Event, RequestOutput, StepStats, ThreadsChanged, TokenDelta
from ssd_chat.turn_stats import TurnStats


@dataclass
class PrintedTally:
    """Fed every event that arrives before the Ctrl-C; `stats` gives the reply's figures over the printed part."""

    clock: Callable[[], float] = time.perf_counter
    tokens: int = 0  # the tokens of the text printed
    steps: int = 0  # the verify steps whose tokens were printed
    step_tokens: int = 0  # their tokens (accepted + recovery or bonus: tau's numerator)
    drafted: int = 0
    accepted: int = 0
    hits: int = 0  # SSD: of those steps, the ones the speculation cache answered
    drafting: int = 0  # of those steps, the ones that drafted (a plain step, k = 0, is neither a hit nor a miss)
    first_tokens: int = 0  # the tokens of the first text printed: the decode time starts once they are
    first_s: float | None = None
    last_s: float | None = None
    _pending_tokens: int = 0  # textless deltas' tokens, counted once the text they complete is printed
    _pending_steps: list[tuple[StepStats, int]] = field(default_factory=list)  # ... their steps, and tokens each
    _step: StepStats | None = None  # the verify step whose TokenDelta comes next
    fewer_threads: bool = False  # the engine stepped with fewer threads for a while: other programs used the CPU

    def add(self, event: Event) -> None:
        if isinstance(event, ThreadsChanged):
            self.fewer_threads |= event.fewer
        elif isinstance(event, StepStats):
            self._step = event
        elif isinstance(event, TokenDelta):
            self._pending_tokens += len(event.token_ids)
            if self._step is not None:
                self._pending_steps.append((self._step, len(event.token_ids)))
                self._step = None
            if event.text:
                self._printed()

    def _printed(self) -> None:
        now = self.clock()
        if self.first_s is None:
            self.first_s, self.first_tokens = now, self._pending_tokens
        self.last_s = now
        self.tokens += self._pending_tokens
        for step, num_tokens in self._pending_steps:
            self.steps += 1
            self.step_tokens += num_tokens
            self.drafted += step.num_drafted
            self.accepted += step.num_accepted
            self.hits += bool(step.cache_hit)
            self.drafting += step.num_drafted > 0
        self._pending_tokens, self._pending_steps = 0, []

    def stats(self, output: RequestOutput) -> TurnStats:
        """The reply's figures over what was printed: the engine's own where it printed every token. tau on a hit
        and on a miss are left out (None): the stats line does not show them."""
        stats = TurnStats.from_output(output)
        if self.tokens == stats.generated_tokens:
            return stats
        decode_s = 0.0 if self.first_s is None or self.last_s is None else self.last_s - self.first_s
        after_first = self.tokens - self.first_tokens
        stats = replace(stats, generated_tokens=self.tokens,
                        decode_tok_s=after_first / decode_s if after_first > 0 and decode_s > 0 else 0.0)
        spec = output.stats.spec
        if spec is None:  # (AR: no steps to count)
            return stats
        return replace(
            stats, tau=self.step_tokens / self.steps if self.steps else 0.0,
            acceptance_rate=self.accepted / self.drafted if self.drafted else 0.0,
            cache_hit_rate=None if spec.num_cache_hits is None or not self.drafting else self.hits / self.drafting,
            tau_on_hit=None, tau_on_miss=None,
        )
