"""How many tokens to draft per round: the k that maximises expected tokens per second.

With a per-token acceptance a (engine.ssd.AcceptanceEstimate, the geometric model), a round that drafts k
tokens emits E(k) = 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a) tokens (bonus included). It costs one verify
over k + 1 query rows plus the drafting the target waits for:

    cost(k) = v1 * (1 + row_cost * k) + k * d

v1 is the verify time of one row and row_cost the extra time of each further row as a share of it (a device
constant: a CPU's small GEMMs grow with the rows, a GPU's barely do); d is the measured target wait for drafts
per drafted token (SD: the whole drafting; SSD: only the misses' just-in-time drafts). v1 and d are moving
averages of the rounds this engine ran. A weak draft then drafts fewer tokens, and a strong one the full k.
Exactness never depends on k: verification is the same for any proposal length.
"""

from __future__ import annotations

from dataclasses import dataclass

# Extra verify time per extra query row, as a share of a one-row step. CPU: measured on the 2-core AVX-512 box,
# SmolLM2-135M on one core, in SD rounds with the packed weights (engine.layers.packed): 52.2 ms for 2 rows and
# 67.6 ms for 5, against 46-48 ms for one (0.12 per row; without the packed weights 58.1 and 74.0 ms). CUDA: not
# measured yet (a decode step is bandwidth-bound far beyond 5 rows, so a small share is assumed).
ROW_COST = {"cpu": 0.12, "cuda": 0.02}


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a round emits on average (accepted drafts plus the target's own token) under the geometric model."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass
class RoundCost:
    """Moving averages of one mode's measured round costs (seconds): v1, the verify time scaled to one row, and
    d, the target's wait for drafts per drafted token. Each new round weighs (1 - DECAY)."""

    row_cost: float
    verify_one_row_s: float | None = None
    draft_per_token_s: float = 0.0
    DECAY = 0.8

    def update(self, num_rows: int, verify_s: float, num_drafted: int, draft_s: float) -> None:
        if num_drafted < 1 or num_rows < 1:
            return
        v1 = verify_s / (1.0 + self.row_cost * (num_rows - 1))
        d = draft_s / num_drafted
        if self.verify_one_row_s is None:
            self.verify_one_row_s, self.draft_per_token_s = v1, d
            return
        self.verify_one_row_s = self.DECAY * self.verify_one_row_s + (1 - self.DECAY) * v1
        self.draft_per_token_s = self.DECAY * self.draft_per_token_s + (1 - self.DECAY) * d

    def seconds(self, k: int) -> float:
        """A round's cost with k drafts; before any measurement, the verify alone in units of one row."""
        v1 = 1.0 if self.verify_one_row_s is None else self.verify_one_row_s
        return v1 * (1.0 + self.row_cost * k) + k * self.draft_per_token_s


def best_k(max_k: int, acceptance: float, cost: RoundCost) -> int:
    """The k in 1..max_k with the most expected tokens per second (the smaller k on a tie)."""
    rates = [(expected_tokens(acceptance, k) / cost.seconds(k), -k) for k in range(1, max_k + 1)]
    return -max(rates)[1]
