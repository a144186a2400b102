"""How many tokens to draft per round: the k that maximises expected tokens per second.

With a per-token acceptance a (engine.spec_policy.AcceptanceEstimate, the geometric model), a round that drafts k
tokens emits E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens (bonus included). It costs one verify
over k + 1 query rows plus the drafting the target waits for:

    cost(k) = v1 * (1 + row_cost * k) + k * d

v1 is the verify time of one row and row_cost the extra time of each further row as a share of it (a CPU's
small GEMMs grow with the rows, a GPU's barely do; it also changes with the threads, the packed weights and
--compile, so it is fitted to the measured verify times: RowCostFit, from a per-device prior); d is the
measured target wait for drafts per drafted token (SD: the whole drafting; SSD: only the misses' just-in-time
drafts). v1 and d are moving averages of the rounds this engine ran. A weak draft then drafts fewer tokens, and
a strong one the full k. A round may also pick k = 0, a plain one-row step (cost v1, one token), when no k pays
for its drafting (SSD: for its verify rows); it then still drafts every PROBE_EVERY-th round, so the acceptance and
costs it decides on stay measured (the engine's core counts the rounds; SSD's draft process pre-drafts that probe
during the round before it). On a machine where verifying rows or drafting is dear, or on text the draft cannot
predict, SD and SSD then run at about AR's speed instead of below it.
Exactness never depends on k: verification is the same for any proposal length.
"""

from __future__ import annotations

from dataclasses import dataclass

# The prior of RowCostFit: extra verify time per extra query row, as a share of a one-row step. CPU: measured on
# the 2-core AVX-512 box, SmolLM2-135M on one core, in SD rounds with the packed weights (engine.layers.packed):
# 52.2 ms for 2 rows and 67.6 ms for 5, against 46-48 ms for one (0.12 per row; without the packed weights 58.1
# and 74.0 ms). CUDA: not measured yet (a decode step is bandwidth-bound far beyond 5 rows: a small share).
ROW_COST = {"cpu": 0.12, "cuda": 0.02}
PROBE_EVERY = 8  # while k = 0 pays best, one round in this many drafts anyway, to keep measuring


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round emits on average (accepted drafts plus the target's own token) under the geometric model."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


class RowCostFit:
    """row_cost fitted to the measured verify times: the least-squares line verify_s = a + b (rows - 1) over the
    rounds so far (each older round weighs DECAY times less), with a ridge term PRIOR_WEIGHT (b - prior a)^2
    that holds b / a at the prior until the rows have varied enough to tell (the adaptive length varies them).
    SD's plain rounds (k = 0) measure a directly; without them a is extrapolated from speculative rounds (x >= 1),
    which on a CPU can be far off: a one-row step may run another GEMM kernel than a packed few-row one
    (engine.layers.packed), dearer per row, and one slow round at 5 rows can tilt the line to a tiny a."""

    DECAY = 0.98          # about the last 50 rounds
    PRIOR_WEIGHT = 1.0    # like one round's worth of rows one apart
    LIMITS = (0.0, 1.0)

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.value = prior  # refitted once per round (add), read for every k best_k weighs
        self.sums = [0.0] * 5  # weighted sums of 1, x, y, x^2, x y (x = rows - 1, y = verify seconds)

    def add(self, num_rows: int, verify_s: float) -> None:
        x, y = num_rows - 1.0, verify_s
        self.sums = [self.DECAY * s + t for s, t in zip(self.sums, (1.0, x, y, x * x, x * y), strict=True)]
        self.value = self._solve()

    def _solve(self) -> float:
        w, sx, sy, sxx, sxy = self.sums
        lam, c = self.PRIOR_WEIGHT, self.prior
        # Normal equations of sum w (y - a - b x)^2 + lam (b - c a)^2 for (a, b).
        m00, m01, m11 = w + lam * c * c, sx - lam * c, sxx + lam
        det = m00 * m11 - m01 * m01
        a = (m11 * sy - m01 * sxy) / det
        b = (m00 * sxy - m01 * sy) / det
        if a <= 0.0:  # the line crosses zero before one row: rows dominate (or the data are noise)
            return self.LIMITS[1] if b > 0.0 else self.prior
        return min(max(b / a, self.LIMITS[0]), self.LIMITS[1])


@dataclass
class RoundCost:
    """Moving averages of one mode's measured round costs (seconds): v1, the verify time scaled to one row, and
    d, the target's wait for drafts per drafted token (each new round weighs 1 - DECAY); and the fitted extra
    cost per row, from the prior ``row_cost``."""

    row_cost: float
    verify_one_row_s: float | None = None
    draft_per_token_s: float | None = None
    DECAY = 0.8

    def __post_init__(self) -> None:
        self.fit = RowCostFit(self.row_cost)

    def update(self, num_rows: int, verify_s: float, num_drafted: int, draft_s: float) -> None:
        """One round's measurements. A plain round (nothing drafted: SD's k = 0) measures the one-row step, what
        best_k weighs k = 0 at, and no drafting."""
        if num_rows < 1:
            return
        self.fit.add(num_rows, verify_s)
        v1 = verify_s / (1.0 + self.fit.value * (num_rows - 1))
        self.verify_one_row_s = self._average(self.verify_one_row_s, v1)
        if num_drafted > 0:
            self.draft_per_token_s = self._average(self.draft_per_token_s, draft_s / num_drafted)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else self.DECAY * old + (1 - self.DECAY) * new

    def seconds(self, k: int) -> float:
        """A round's cost with k drafts; before any measurement, the verify alone in units of one row."""
        v1 = 1.0 if self.verify_one_row_s is None else self.verify_one_row_s
        return v1 * (1.0 + self.fit.value * k) + k * (self.draft_per_token_s or 0.0)


def best_k(max_k: int, acceptance: float, cost: RoundCost, *, min_k: int = 1) -> int:
    """The k in min_k..max_k with the most expected tokens per second (the smaller k on a tie). k = 0 is a plain
    one-row step: one token for v1."""
    rates = [(expected_tokens(acceptance, k) / cost.seconds(k), -k) for k in range(min_k, max_k + 1)]
    return -max(rates)[1]
