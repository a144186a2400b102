"""Per-reply figures for the side panel, updated event by event while a reply streams.

Pure Python (no Textual, no torch): the engine worker feeds it, the panel renders `PanelData`
snapshots of it. When the reply finishes, the engine's own RequestStats replace the live estimates.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from engine.outputs import RequestOutput, StepStats, ThreadsChanged
from ssd_chat.history import TurnStats

RATE_WINDOW = 6      # deltas per tok/s sample (smooths the sparkline)
RATE_SAMPLES = 60    # samples the sparkline keeps


@dataclass(frozen=True)
class PanelData:
    """What the panel shows for one reply."""

    mode: str
    k: int
    tok_s: float
    ttft_s: float | None
    generated_tokens: int
    rates: tuple[float, ...]
    tau: float | None = None
    acceptance_rate: float | None = None
    histogram: tuple[int, ...] = ()            # [k+1]: verify steps with drafts that accepted 0..k of them
    plain_steps: int = 0                       # SD steps without drafts (adaptive k = 0: drafting did not pay)
    per_position: tuple[float | None, ...] = ()  # [k]: acceptance rate of the i-th draft token (None: never drafted)
    position_drafts: tuple[int, ...] = ()  # [k]: the i-th draft tokens proposed (what each rate rests on)
    cache_hit_rate: float | None = None
    tau_on_hit: float | None = None
    tau_on_miss: float | None = None
    verify_ms: float | None = None       # mean target verify time per step
    wait_ms: float | None = None         # mean time the target waited for drafts per step (0 on SSD cache hits)
    draft_idle_ms: float | None = None   # SSD with a draft process: its mean idle time per step
    reused_prefix_tokens: int | None = None
    prompt_tokens: int | None = None
    is_final: bool = False
    threads: tuple[int, int] | None = None  # (now, most) where the engine stepped with fewer: others used the CPU
    fewer_threads: bool = False  # it did at some time in this reply


@dataclass
class LiveStats:
    mode: str
    k: int  # the most a round drafts (EngineConfig.drafted_k): the histogram's and per-position rows
    started: float
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_tokens: int = 0
    num_steps: int = 0
    plain_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    hit_steps: int = 0
    hit_emitted: int = 0
    miss_emitted: int = 0
    saw_cache: bool = False
    verify_s: float = 0.0
    wait_s: float = 0.0
    idle_s: float | None = None
    histogram: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    threads: tuple[int, int] | None = None
    fewer_threads: bool = False
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=RATE_SAMPLES))
    _recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=RATE_WINDOW + 1))

    def __post_init__(self) -> None:
        self.histogram = [0] * (self.k + 1)
        self.drafted_per_position = [0] * self.k
        self.accepted_per_position = [0] * self.k

    def on_tokens(self, num_tokens: int, now: float) -> None:
        if num_tokens <= 0:
            return
        if self.first_token_at is None:
            self.first_token_at = now
        self.num_tokens += num_tokens
        self.last_token_at = now
        self._recent.append((now, num_tokens))
        if len(self._recent) > 1:
            span = self._recent[-1][0] - self._recent[0][0]
            tokens = sum(n for _, n in list(self._recent)[1:])
            if span > 0:
                self.rates.append(tokens / span)

    def on_step(self, step: StepStats) -> None:
        self.num_steps += 1
        self.num_drafted += step.num_drafted
        self.num_accepted += step.num_accepted
        self.verify_s += step.verify_time_s
        self.wait_s += step.draft_time_s
        if step.num_drafted == 0:  # a plain step: tau counts it (one token), the histogram does not
            self.plain_steps += 1
        else:
            if max(step.num_drafted, step.num_accepted) > self.k:  # k changed under us: grow, never drop a count
                self._grow(max(step.num_drafted, step.num_accepted))
            self.histogram[step.num_accepted] += 1
        if step.draft_idle_s is not None:
            self.idle_s = (self.idle_s or 0.0) + step.draft_idle_s
        for i in range(min(step.num_drafted, len(self.drafted_per_position))):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < step.num_accepted
        if step.cache_hit is not None:
            self.saw_cache = True
        if step.num_drafted:  # (a drafted round with nothing cached, hit None, is a miss, as the engine counts it)
            emitted = step.num_accepted + 1  # the accepted drafts plus the target's recovery / bonus token
            if step.cache_hit:
                self.hit_steps += 1
                self.hit_emitted += emitted
            else:
                self.miss_emitted += emitted

    def on_threads(self, change: ThreadsChanged) -> None:
        self.threads = (change.threads, change.most)
        self.fewer_threads |= change.fewer

    def _grow(self, k: int) -> None:
        extra = k - self.k
        self.k = k
        self.histogram += [0] * extra
        self.drafted_per_position += [0] * extra
        self.accepted_per_position += [0] * extra

    def snapshot(self) -> PanelData:
        decode_span = (self.last_token_at or 0.0) - (self.first_token_at or 0.0)
        tok_s = (self.num_tokens - 1) / decode_span if self.num_tokens > 1 and decode_span > 0 else 0.0
        spec = self.mode != "ar" and self.num_steps > 0
        drafting = self.num_steps - self.plain_steps  # (a plain step, k = 0, is neither a hit nor a miss)
        misses = drafting - self.hit_steps
        return PanelData(
            mode=self.mode, k=self.k, tok_s=tok_s, generated_tokens=self.num_tokens, rates=tuple(self.rates),
            ttft_s=None if self.first_token_at is None else self.first_token_at - self.started,
            tau=(self.num_accepted + self.num_steps) / self.num_steps if spec else None,
            acceptance_rate=self.num_accepted / self.num_drafted if spec and self.num_drafted else None,
            histogram=tuple(self.histogram) if spec else (),
            plain_steps=self.plain_steps if spec else 0,
            per_position=tuple(a / d if d else None for a, d in zip(
                self.accepted_per_position, self.drafted_per_position, strict=True)) if spec else (),
            position_drafts=tuple(self.drafted_per_position) if spec else (),
            cache_hit_rate=self.hit_steps / drafting if spec and self.saw_cache and drafting else None,
            tau_on_hit=self.hit_emitted / self.hit_steps if self.saw_cache and self.hit_steps else None,
            tau_on_miss=self.miss_emitted / misses if self.saw_cache and misses else None,
            threads=self.threads, fewer_threads=self.fewer_threads,
            **_step_times(self.num_steps if spec else 0, self.verify_s, self.wait_s, self.idle_s),
        )

    def final(self, output: RequestOutput) -> PanelData:
        """The engine's exact figures for the finished reply (those the history keeps: `saved_panel`, and the
        per-position and step figures), with the live histogram and sparkline."""
        spec = output.stats.spec
        saved = replace(saved_panel(TurnStats.from_output(output)), k=self.k, rates=tuple(self.rates),
                        threads=self.threads, fewer_threads=self.fewer_threads)
        if spec is None:
            return saved
        return replace(
            saved, histogram=tuple(self.histogram), per_position=spec.per_position_acceptance,
            position_drafts=spec.drafted_per_position,
            plain_steps=self.plain_steps,  # (the engine's stats do not count them)
            tau_on_hit=spec.tau_on_hit, tau_on_miss=spec.tau_on_miss,
            **_step_times(spec.num_steps, spec.verify_time_s, spec.draft_time_s, spec.draft_idle_s),
        )


def saved_panel(stats: TurnStats) -> PanelData:
    """A reply's figures as the history keeps them (a chat opened, resumed, or shown again after a restart): no
    sparkline, histogram or per-position rates, which only a live reply has."""
    return PanelData(
        mode=stats.mode, k=0, tok_s=stats.decode_tok_s, generated_tokens=stats.generated_tokens,
        ttft_s=stats.first_token_s,
        rates=(), tau=stats.tau, acceptance_rate=stats.acceptance_rate, cache_hit_rate=stats.cache_hit_rate,
        tau_on_hit=stats.tau_on_hit, tau_on_miss=stats.tau_on_miss,
        reused_prefix_tokens=stats.reused_prefix_tokens, prompt_tokens=stats.prompt_tokens, is_final=True,
    )


def _step_times(steps: int, verify_s: float, wait_s: float, idle_s: float | None) -> dict:
    """Per-step means in ms: the target's verify, its wait for drafts, and the draft process's idle time."""
    if not steps:
        return {}
    return {"verify_ms": 1e3 * verify_s / steps, "wait_ms": 1e3 * wait_s / steps,
            "draft_idle_ms": None if idle_s is None else 1e3 * idle_s / steps}
