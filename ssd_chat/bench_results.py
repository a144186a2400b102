"""`ssd-chat bench`'s records: one prompt's run, one mode's runs and the figures derived from them, the report."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.outputs import SpecStats

# ar-all / sd-all: AR / SD in one process with a thread per core of the machine (SD's draft in that process)
EVERY_CORE = {"ar-all": "ar", "sd-all": "sd"}
ENGINE_MODES = ("ar", "sd", "ssd", *EVERY_CORE)  # what --modes takes (the command line reads them: no torch here)


@dataclass(frozen=True)
class PromptRun:
    """One prompt decoded in one mode."""

    token_ids: list[int]
    ttft_s: float
    decode_time_s: float
    spec: SpecStats | None = None


@dataclass(frozen=True)
class ModeResult:
    mode: str
    runs: list[PromptRun]
    identical_to_ar: bool | None = None  # None for "ar" itself, or when "ar" was not run
    row_cost: float | None = None  # SD / SSD: the extra verify time per query row the engine fitted (spec_length)
    compiled_share: float | None = None  # --compile: the share of the target's forwards that ran compiled
    fewer_threads_share: float = 0.0  # its steps on fewer threads than the engine has: other programs used its cores

    @property
    def outputs(self) -> list[list[int]]:
        return [r.token_ids for r in self.runs]

    @property
    def decode_tok_s(self) -> float:
        tokens = sum(len(r.token_ids) - 1 for r in self.runs)
        seconds = sum(r.decode_time_s for r in self.runs)
        return tokens / seconds if seconds > 0 else 0.0

    @property
    def ttft_ms(self) -> float:
        return 1000.0 * sum(r.ttft_s for r in self.runs) / len(self.runs)

    def _spec_sum(self, name: str) -> float | None:
        specs = [r.spec for r in self.runs if r.spec is not None]
        return sum(getattr(s, name) or 0 for s in specs) if specs else None

    @property
    def tau(self) -> float | None:
        """Tokens per target verify step over all prompts (None without speculation)."""
        steps = self._spec_sum("num_steps")
        return self._spec_sum("num_emitted") / steps if steps else None

    @property
    def acceptance_rate(self) -> float | None:
        drafted = self._spec_sum("num_drafted")
        return self._spec_sum("num_accepted") / drafted if drafted else None

    @property
    def cache_hit_rate(self) -> float | None:
        """SSD: the verify steps that drafted (not the plain ones: k = 0) whose proposal came from the cache."""
        hits = self._spec_sum("num_cache_hits") if self.mode == "ssd" else None
        drafting = (self._spec_sum("num_steps") or 0) - (self._spec_sum("num_plain_steps") or 0)
        return hits / drafting if hits is not None and drafting else None

    @property
    def ideal_tok_s(self) -> float | None:
        """SSD's ceiling on these prompts: tau on hit over the mean verify time (the target never waits)."""
        hits = self._spec_sum("num_cache_hits") if self.mode == "ssd" else None
        if not hits:
            return None
        return self._spec_sum("emitted_on_hit") / hits / (self._spec_sum("verify_time_s") / self._spec_sum("num_steps"))

    @property
    def round_ms(self) -> dict[str, float] | None:
        """Where a round's time goes, in ms: the target's verify forward and its wait for the proposal, per round;
        SSD also splits the wait into rounds the cache answered and rounds drafted just in time (the first round
        of each prompt counts as a miss). SD's wait is its whole drafting; SSD's, on a hit, mostly messages.
        "plain": the share of the rounds that drafted nothing (k = 0: a plain step), and SSD's "wait_on_plain" there
        (sending the outcome)."""
        steps = self._spec_sum("num_steps")
        if not steps:
            return None
        wait, plain = self._spec_sum("draft_time_s"), self._spec_sum("num_plain_steps")
        out = {"verify": 1e3 * self._spec_sum("verify_time_s") / steps, "wait": 1e3 * wait / steps,
               "plain": plain / steps}
        hits = self._spec_sum("num_cache_hits") if self.mode == "ssd" else None
        if hits is not None:
            on_hit = self._spec_sum("draft_time_on_hit_s")
            if hits:
                out["wait_on_hit"] = 1e3 * on_hit / hits
            if plain:
                out["wait_on_plain"] = 1e3 * self._spec_sum("draft_time_plain_s") / plain
            if steps - plain > hits:
                misses = steps - plain - hits
                out["wait_on_miss"] = 1e3 * (wait - on_hit - self._spec_sum("draft_time_plain_s")) / misses
        return out

    @property
    def draft_s_per_token(self) -> float | None:
        """SD (draft in the target's process): the target's wait for drafts per drafted token, i.e. the draft's
        per-token cost on the target's cores (its catch-up forward on the last accepted tokens included)."""
        drafted = self._spec_sum("num_drafted") if self.mode == "sd" else None
        if not drafted:
            return None
        return self._spec_sum("draft_time_s") / drafted

    def to_dict(self) -> dict:
        return {
            "mode": self.mode,
            "draft_s_per_token": self.draft_s_per_token,
            "ideal_tok_s": self.ideal_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "ttft_ms": self.ttft_ms,
            "tau": self.tau,
            "acceptance_rate": self.acceptance_rate,
            "cache_hit_rate": self.cache_hit_rate,
            "outputs": self.outputs,
            "identical_to_ar": self.identical_to_ar,
            "row_cost": self.row_cost,
            "compiled_share": self.compiled_share,
            "fewer_threads_share": self.fewer_threads_share,
            "round_ms": self.round_ms,
        }


@dataclass(frozen=True)
class BenchReport:
    machine: dict
    config: dict
    results: list[ModeResult] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"machine": self.machine, "config": self.config, "results": [r.to_dict() for r in self.results]}
