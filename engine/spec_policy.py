"""How much to speculate: each request's draft length (the adaptive k) and SSD's fan-out, from what the engine
measured so far: every request's acceptance (`AcceptanceEstimate`) and each mode's round costs
(engine.spec_length.RoundCost). Only speed depends on these choices, never the output: verification is the same
for any proposal length and any speculation cache.
"""

from __future__ import annotations

from engine.config import CPU_MAX_DRAFT, SpeculationConfig, capped
from engine.sequence import Sequence, StepOutput
from engine.spec_length import PROBE_EVERY, ROW_COST, RoundCost, best_k


class AcceptanceEstimate:
    """A request's per-token draft acceptance, for its fan-out and k: the geometric model's estimate (accepted
    tokens over accepted tokens plus rejections), over recent rounds (each weighs DECAY of the one after it),
    starting from PRIOR as if PRIOR_ROUNDS rounds had shown it."""

    PRIOR, PRIOR_ROUNDS, DECAY = 0.8, 4, 0.9

    def __init__(self) -> None:
        self.accepted, self.trials = self.PRIOR * self.PRIOR_ROUNDS, float(self.PRIOR_ROUNDS)

    def update(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted > 0:
            rejected = num_accepted < num_drafted
            self.accepted = self.DECAY * self.accepted + num_accepted
            self.trials = self.DECAY * self.trials + num_accepted + rejected

    @property
    def value(self) -> float:
        return self.accepted / self.trials


def default_fanout(k: int, budget: int | None = None, acceptance: float = 0.8) -> tuple[int, ...]:
    """F_0..F_K for a fan-out budget (default 3 (K + 1) branches), geometric as SSD.md derives with r = 1:
    F_j ~ P(outcome k=j)^(1/2), with P(j) = a^j (1-a) for j < K and a^K for j = K (all accepted)."""
    budget = budget or 3 * (k + 1)
    outcome_p = [acceptance**j * (1 - acceptance) for j in range(k)] + [acceptance**k]
    weights = [p ** 0.5 for p in outcome_p]
    return tuple(max(1, round(budget * w / sum(weights))) for w in weights)


def adaptive_fanout(k: int, estimates: list[AcceptanceEstimate]) -> tuple[int, ...]:
    """The geometric fan-out for the batch's mean acceptance, rounded to 0.1 (so it changes rarely)."""
    mean = sum(e.value for e in estimates) / len(estimates) if estimates else AcceptanceEstimate.PRIOR
    return default_fanout(k, acceptance=min(0.9, max(0.1, round(mean, 1))))


class SpecPolicy:
    """The engine's speculation choices and the measurements they rest on (one per EngineCore)."""

    def __init__(self, device_type: str) -> None:
        self.acceptance: dict[int, AcceptanceEstimate] = {}  # request id -> its draft acceptance
        self.paused: dict[int, int] = {}  # request id -> rounds it ran with k = 0 (engine.spec_length)
        row_cost = ROW_COST.get(device_type, ROW_COST["cuda"])
        self.round_cost = {mode: RoundCost(row_cost) for mode in ("sd", "ssd")}  # measured, for the adaptive k
        # CPU: a verify of k + 1 rows reproduces one-row decoding bit for bit only up to ROW_KERNEL_ROWS rows (the
        # fused layers' and, on Intel, the panel GEMM's most: packed_kernels.MAX_ROWS); more rows ran SDPA's
        # attention, and on Intel still run MKL's GEMM, whose last bits differ (under --cpu-matmul q8 the tokens
        # did): --k 32 --fixed-k drafts at most 31 (EngineConfig.max_draft says so to the chat app)
        self.max_draft = CPU_MAX_DRAFT if device_type == "cpu" else None

    def draft_length(self, seq: Sequence, spec: SpeculationConfig) -> int:
        """_chosen_length, at most `max_draft` (the verify rows that still give one-row decoding's bits)."""
        return capped(self._chosen_length(seq, spec), self.max_draft)

    def pre_draft(self, seq: Sequence, spec: SpeculationConfig) -> int:
        """SSD, for a request that pauses this round (k = 0): the k its next round drafts if that round probes (every
        PROBE_EVERY-th paused round drafts), so that the draft process pre-drafts its outcomes while the target runs
        this round's plain step and the probe is a cache hit; else 0 (the draft process then only follows)."""
        if not _probes(self.paused.get(seq.seq_id, 0) + 1):
            return 0
        return capped(self._probe_k(seq, spec), self.max_draft)

    def fanout(self, spec: SpeculationConfig, k: int, seqs: list[Sequence]) -> tuple[int, ...]:
        """SSD's branches per outcome for a round of at most `k` drafts: the setting's, or the geometric fan-out
        for the batch's measured acceptance."""
        measured = [self.acceptance[s.seq_id] for s in seqs if s.seq_id in self.acceptance]
        return spec.fanout or adaptive_fanout(k, measured)

    def measured(self, mode: str, outputs: dict[Sequence, StepOutput]) -> None:
        """Feed one speculative step's costs to the mode's RoundCost: one verify over every request's rows and one
        draft wait (both shared by the batch), over all the tokens drafted."""
        stats = next((o.stats for o in outputs.values() if o.stats is not None), None)
        if stats is not None:
            rows = sum(o.num_drafted + 1 for o in outputs.values())
            drafted = sum(o.num_drafted for o in outputs.values())
            # SSD: a round with nothing cached to look up (a request's first, or the first after plain rounds that
            # pre-drafted nothing) also waits for the draft process to finish the prompt or catch up: not what a
            # drafted token costs, and one such wait of a prompt's prefill would stop the drafting for a while
            unknown = mode == "ssd" and any(o.num_drafted and o.stats is not None and o.stats.cache_hit is None
                                            for o in outputs.values())
            self.round_cost[mode].update(rows, stats.verify_time_s, 0 if unknown else drafted,
                                         0.0 if unknown else stats.draft_time_s)

    def accepted(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        if num_drafted:
            self.acceptance.setdefault(seq.seq_id, AcceptanceEstimate()).update(num_drafted, num_accepted)

    def forget(self, seq: Sequence) -> None:
        self.acceptance.pop(seq.seq_id, None)
        self.paused.pop(seq.seq_id, None)

    def _chosen_length(self, seq: Sequence, spec: SpeculationConfig) -> int:
        """spec.k, or with adaptive_k the k <= spec.k with the most expected tokens per second for this request's
        measured acceptance (the prior until it has some) and the mode's measured round costs. It may pick 0 (a
        plain step), except every PROBE_EVERY-th such round, which drafts to keep the measurements current (SSD's
        probe comes from the cache: `pre_draft`)."""
        if not spec.adaptive_k:
            return spec.k
        acceptance, cost = self._acceptance(seq), self.round_cost[spec.mode]
        k = best_k(spec.k, acceptance, cost, min_k=0 if cost.verify_one_row_s is not None else 1)
        if k > 0:
            return k
        paused = self.paused[seq.seq_id] = self.paused.get(seq.seq_id, 0) + 1
        return self._probe_k(seq, spec) if _probes(paused) else 0

    def _probe_k(self, seq: Sequence, spec: SpeculationConfig) -> int:
        """A probe's k (a paused request's drafting round): the best k of at least 1 for its measured figures."""
        return best_k(spec.k, self._acceptance(seq), self.round_cost[spec.mode])

    def _acceptance(self, seq: Sequence) -> float:
        """The request's measured per-token acceptance, or the prior before it has drafted."""
        estimate = self.acceptance.get(seq.seq_id)
        return AcceptanceEstimate.PRIOR if estimate is None else estimate.value


def _probes(paused: int) -> bool:
    """Whether a request's `paused`-th plain round in a row drafts instead (every PROBE_EVERY-th: SSD's probe)."""
    return paused % PROBE_EVERY == 0
