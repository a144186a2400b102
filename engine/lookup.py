"""Context lookup for drafting: the token that followed the latest earlier occurrence of the context's last three
(else two) tokens, when there is one.

Chat replies repeat their prompt and themselves (names, list markers, phrases). On SmolLM2's greedy replies to
the held-out chat prompts (EOS respected) a 3- or 2-token suffix has an earlier occurrence at 47% of the
positions, and its follower is the target's next token 83% of the time there, where the distilled draft is
right 47% of the time. Drafting the lookup's token where there is one and the draft model's argmax elsewhere
raises the exact greedy-SD simulation's tau at k = 4 from 1.65 to 2.05 (`/k`, fixed). Any proposal keeps
greedy output exact (the target verifies every token), so this is a pure choice of draft tokens.

Sampled requests take it too: a coupled one's is kept where it is the target's race winner (engine.coupling); for
one sampled by the rejection rule it is proposed with certainty (a one-hot q row, engine.drafter.Proposal.add_guess),
which the rule keeps exact: accepted with probability p(token), else the residual is p without it. On the
held-out chat prompts sampled at 0.7, the lookup has a token at 18% of the positions; there the target gives it
p = 0.53 on average, where the draft model's draw would be accepted with probability 0.33.

`ContextIndex` is incremental: one dict lookup per drafted token, one update per committed token.
"""

from __future__ import annotations

from typing import ClassVar

ORDERS = (3, 2)  # longest suffix first


class ContextIndex:
    """n-gram (n in ORDERS) -> the position of the token that followed its latest occurrence, over one
    growing token list (a request's committed tokens)."""

    def __init__(self) -> None:
        self.tables: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in ORDERS}
        self.size = 0

    def extend(self, tokens: list[int]) -> None:
        """Index the positions of `tokens` added since the last call (`tokens` only ever grows)."""
        for follower in range(max(self.size, 1), len(tokens)):
            for n in ORDERS:
                if follower >= n:
                    self.tables[n][tuple(tokens[follower - n : follower])] = follower
        self.size = len(tokens)

    def guess(self, tokens: list[int], tail: list[int]) -> int | None:
        """The follower in `tokens` of the longest indexed suffix of `tail` (the context's last tokens:
        committed ones, then any drafted after them), or None."""
        for n in ORDERS:
            if len(tail) >= n:
                follower = self.tables[n].get(tuple(tail[-n:]))
                if follower is not None:
                    return tokens[follower]
        return None


class LookupTrust:
    """Whether a request's lookup tokens are accepted at least as often as its draft model's, from the verified
    draft tokens of each kind (accepted over reached, each older one weighing DECAY of the next; priors as if
    PRIOR_TRIALS tokens had shown them). Where the context repeats with other followers (counting, numbered lists:
    ", 1" then "2", later ", 1" then "3"), the lookup is mostly wrong: on "list the numbers from 1 to 40" greedy SD's
    tau was 1.2 with it and 1.9 without. An untrusted lookup still answers every PROBE_EVERY-th time, so that its
    figure stays measured and it comes back where the text turns repetitive."""

    PRIORS: ClassVar[dict[bool, float]] = {True: 0.8, False: 0.5}  # lookup tokens, model tokens
    PRIOR_TRIALS, DECAY, PROBE_EVERY = 4.0, 0.9, 8

    def __init__(self) -> None:
        self.accepted = {kind: p * self.PRIOR_TRIALS for kind, p in self.PRIORS.items()}
        self.trials = dict.fromkeys(self.PRIORS, self.PRIOR_TRIALS)
        self.skipped = 0

    def record(self, from_lookup: bool, accepted: bool) -> None:
        self.accepted[from_lookup] = self.DECAY * self.accepted[from_lookup] + accepted
        self.trials[from_lookup] = self.DECAY * self.trials[from_lookup] + 1

    def rate(self, from_lookup: bool) -> float:
        return self.accepted[from_lookup] / self.trials[from_lookup]

    def consult(self) -> bool:
        """Whether to take the lookup's token now."""
        if self.rate(True) >= self.rate(False):
            return True
        self.skipped += 1
        return self.skipped % self.PROBE_EVERY == 0


class Lookups:
    """One ContextIndex per request, over the draft's mirror of its committed tokens, and its LookupTrust."""

    def __init__(self) -> None:
        self.indexes: dict[int, ContextIndex] = {}
        self.trust: dict[int, LookupTrust] = {}

    def _trust(self, seq_id: int) -> LookupTrust:
        trust = self.trust.get(seq_id)
        if trust is None:
            trust = self.trust[seq_id] = LookupTrust()
        return trust

    def trusted(self, seq_id: int) -> bool:
        return self._trust(seq_id).consult()

    def record(self, seq_id: int, from_lookup: list[bool], num_accepted: int) -> None:
        """A verified proposal: its first num_accepted tokens accepted, the next one (if any) rejected, the rest
        never reached. from_lookup: [k] which tokens the lookup gave."""
        trust = self._trust(seq_id)
        for i, kind in enumerate(from_lookup[: num_accepted + 1]):
            trust.record(kind, i < num_accepted)

    def guess(self, seq_id: int, committed: list[int], drafted: list[int]) -> int | None:
        index = self.indexes.setdefault(seq_id, ContextIndex())
        index.extend(committed)
        tail = (committed[-ORDERS[0]:] + drafted)[-ORDERS[0]:]
        return index.guess(committed, tail)

    def drop(self, seq_id: int) -> None:
        self.indexes.pop(seq_id, None)
        self.trust.pop(seq_id, None)
