"""Sampled SD and SSD steps, end to end through the engine's own step code, follow AR's distribution exactly.

test_speculative*.py check the rejection rule (`verify_sampled`) on distributions they build themselves; the engine
checks (test_spec_sampling.py) run real models but never a draft temperature, top-k or top-p, and take minutes.
Here the real `sd_step` / `ssd_step`, `Drafter` / `SsdDrafter` (proposals, cache, hits, misses, fast backup),
`draw_rows` and `spec_decode.verify` run on stand-in runners whose "models" are order-1 Markov chains (a token's
next-token logits are one row of a table), so thousands of requests take seconds. What is checked is what a user
sees: the joint distribution of a request's first NUM_EMIT tokens, by a chi-square test against the exact AR
distribution (the product of the filtered target rows AR samples from). Each case has a temperature, top-k and
top-p on the request, a draft temperature of its own, a draft head that cannot emit one token (q = 0 there) and
a draft length that changes with the request's history, so that a q recorded from another distribution than the
one drawn from, or a p filtered otherwise than AR's, shows. A correct engine fails with probability P_PASS
(1e-6) per case: all seeds are fixed, so each run is deterministic.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import engine.spec_decode
from engine.drafter import Drafter, Proposal
from engine.sampling import probabilities, race, sample_next
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.spec_decode import sd_step, ssd_step
from engine.speculative import Verdict
from engine.ssd import SsdDrafter
from tests.engine.chi_square import P_BROKEN, P_PASS, chi_square_p_value

VOCAB, START, NUM_EMIT, MAX_K = 4, 1, 4, 2
BLOCK_SIZE, MAX_LEN = 4, 64
PARAMS = SamplingParams(temperature=0.8, top_k=2, top_p=0.9, max_tokens=8, ignore_eos=True)
DRAFT_TEMPERATURE = 1.7  # far from the request's 0.8: a q taken at the wrong temperature is far from the right one
FANOUT = (2, 2, 2)  # few branches: both cache hits and misses are common (asserted)


def _tables() -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft next-token logits [V, V] (row = the previous token). Top-k drops two tokens of every row
    (of the draft's too, which has three), and in target row 0 top-p drops one more. The draft ranks the tokens
    otherwise, and its head cannot emit token V - 1 (a reduced-vocabulary head: -inf, q = 0), which the target
    often allows."""
    target = torch.tensor([[2.5, 0.3, 0.0, -0.5], [0.0, 0.9, 0.2, 0.6], [0.5, 0.1, 0.9, 0.2], [0.3, 0.8, 0.0, 0.7]])
    draft = target[:, [1, 2, 0, 3]].clone()
    draft[:, VOCAB - 1] = float("-inf")
    return target, draft


TARGET_LOGITS, DRAFT_LOGITS = _tables()


class MarkovRunner:
    """A ModelRunner stand-in: the logits after a token are TABLE[token], whatever the KV slots hold. With `support`
    its model has a reduced head over those token ids, whose rows it gives compact when asked (engine.drafter)."""

    block_size, first_extra_slot = BLOCK_SIZE, 1 << 20

    def __init__(self, table: torch.Tensor, support: list[int] | None = None):
        self.table = table  # [V, V]
        self.model = SimpleNamespace(args=SimpleNamespace(vocab_size=table.shape[-1]))
        self.support = None if support is None else torch.tensor(support)
        if support is not None:
            self.model.lm_head = SimpleNamespace(vocab_ids=self.support)

    def run(self, chunks, *, all_logits: bool = False, greedy: bool = False, compact: bool = False) -> torch.Tensor:
        ids = [t for c in chunks for t in c.token_ids()] if all_logits else [c.token_ids()[-1] for c in chunks]
        return self._rows(ids, compact)  # [rows, V or Vr]

    def run_spans(self, ids, positions, write_slots, spans, *, all_logits: bool, greedy: bool = False,
                  compact: bool = False) -> torch.Tensor:
        rows = range(len(ids)) if all_logits else [s.q_start + s.q_len - 1 for s in spans]
        return self._rows([ids[r] for r in rows], compact)  # [rows, V or Vr]

    def _rows(self, ids: list[int], compact: bool) -> torch.Tensor:
        return self.table[ids][:, self.support] if compact and self.support is not None else self.table[ids]


class Blocks:
    """A BlockManager stand-in: every sequence gets fresh block ids as it grows; nothing is shared or freed."""

    def __init__(self) -> None:
        self.next_block = 0

    def ensure_capacity(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.block_table) * BLOCK_SIZE < num_tokens:
            seq.block_table.append(self.next_block)
            self.next_block += 1

    def allocate(self, seq: Sequence) -> None:
        self.ensure_capacity(seq, len(seq.token_ids))

    def commit(self, seq: Sequence) -> None:
        pass

    def free_blocks(self, seq: Sequence) -> None:
        seq.block_table.clear()


def draft_length(seq: Sequence) -> int:
    """k for this round: a function of the request's history only (as adaptive k's estimates are), 0..MAX_K."""
    return (sum(seq.token_ids) + len(seq.token_ids)) % (MAX_K + 1)


def exact_ar_probs(table: torch.Tensor | None = None) -> torch.Tensor:
    """P(t1..t4 | START) when AR samples each token from `table`'s row for the token before it (default: the
    filtered target rows, which AR samples from), flattened to t1 * V^3 + t2 * V^2 + t3 * V + t4. [V^4]"""
    if table is None:
        table = torch.stack([probabilities(row, PARAMS) for row in TARGET_LOGITS])  # [V, V]
    joint = table[START].double()  # [V]: sequences of one token
    for _ in range(NUM_EMIT - 1):  # sequence s then token t: index s * V + t; s's last token is s % V
        joint = (joint[:, None] * table.double()[torch.arange(joint.numel()) % VOCAB]).reshape(-1)  # [V * len]
    return joint


def speculative_counts(
    mode: str, n: int, seed: int, backup: str = "jit", lookup: bool = False, support: bool = False
) -> tuple[torch.Tensor, dict[str, int]]:
    """Counts [V^NUM_EMIT] of the first NUM_EMIT tokens of `n` requests (`speculative_runs`), and how the rounds
    went."""
    seqs, tally = speculative_runs(mode, n, seed, backup, lookup, support)
    return joint_counts(seqs), tally


def joint_counts(seqs: list[Sequence]) -> torch.Tensor:
    """Counts [V^NUM_EMIT] of the requests' first NUM_EMIT tokens (index t1 * V^3 + t2 * V^2 + t3 * V + t4)."""
    first = torch.tensor([seq.generated_ids[:NUM_EMIT] for seq in seqs])  # [n, NUM_EMIT]
    index = (first * VOCAB ** torch.arange(NUM_EMIT - 1, -1, -1)).sum(-1)  # [n]
    return torch.bincount(index, minlength=VOCAB**NUM_EMIT)


def speculative_runs(
    mode: str, n: int, seed: int, backup: str = "jit", lookup: bool = False, support: bool = False,
    coupled: bool = False, draft_table: torch.Tensor = DRAFT_LOGITS,
    draft_temperature: float | None = DRAFT_TEMPERATURE, fanout: tuple[int, ...] = FANOUT,
) -> tuple[list[Sequence], dict[str, int]]:
    """`n` requests decoded to NUM_EMIT tokens (the first sampled by AR at the prefill, as the core does, the rest by
    sd_step or ssd_step, all requests batched in each step, with the context lookup's tokens where `lookup`), and
    how the rounds went: draft tokens accepted, rounds with a rejection, SSD's cache hits and misses. `support`: the
    draft's head is a reduced one over tokens 1-3, whose rows the drafter takes compact (engine.drafter.CompactHead):
    a row's index is then not its token, and the draft proposes only 1 and 2 (3 is -inf in its table). `coupled`:
    the requests sample by the coupled race (a noise key each) rather than the rejection rule (a generator each).
    `draft_table`, `draft_temperature`: the draft's chain and temperature (None: the request's); `fanout`: SSD's."""
    target, blocks = MarkovRunner(TARGET_LOGITS), Blocks()
    draft = MarkovRunner(draft_table, [1, 2, 3] if support else None)
    drafter = Drafter(draft, Blocks()) if mode == "sd" else SsdDrafter(draft, Blocks(), max_model_len=MAX_LEN,
                                                                       max_num_seqs=n)
    seeds = torch.randint(2**62, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    seqs = [Sequence(i, [START], PARAMS, None if coupled else torch.Generator().manual_seed(s),
                     seed=s if coupled else None) for i, s in enumerate(seeds)]  # (PARAMS: coupled)
    drafter.start(seqs)  # the prefill (as the core: the draft's sequence holds the prompt), then its token, AR's
    for seq in seqs:
        blocks.allocate(seq)
        seq.token_ids.append(sample_next(TARGET_LOGITS[START], seq))
    tally = {"hit": 0, "miss": 0, "rejected": 0, "accepted": 0}
    common = dict(draft_temperature=draft_temperature, max_model_len=MAX_LEN, ensure_capacity=blocks.ensure_capacity,
                  lookup=lookup)
    active = seqs
    while active:
        k = {seq: draft_length(seq) for seq in active}
        ahead = {seq: 1 + seq.seq_id % 2 for seq in active if not k[seq]}  # SSD's pre-drafts in plain rounds
        outputs = (sd_step(active, target, drafter, k=k, **common) if mode == "sd"
                   else ssd_step(active, target, drafter, k=k, fanout=fanout, backup=backup, ahead=ahead, **common))
        for seq, out in outputs.items():  # the core's commit
            seq.token_ids += out.tokens
            seq.num_computed_tokens = out.num_computed
            drafter.commit(seq, out.num_drafted, out.num_accepted)
            tally["accepted"] += out.num_accepted
            tally["rejected"] += out.num_accepted < out.num_drafted
            if out.stats.cache_hit is not None and out.num_drafted:
                tally["hit" if out.stats.cache_hit else "miss"] += 1
        active = [seq for seq in active if seq.num_generated < NUM_EMIT]
    return seqs, tally


def test_the_cases_exercise_what_they_claim():
    filtered = torch.stack([probabilities(row, PARAMS) for row in TARGET_LOGITS])  # [V, V]
    assert bool((filtered == 0).any(-1).all())  # top-k / top-p drop a token in every target row...
    q = torch.stack([probabilities(row, SamplingParams(temperature=DRAFT_TEMPERATURE)) for row in DRAFT_LOGITS])
    assert bool((q[:, -1] == 0).all()) and bool((filtered[:, -1] > 0).any())  # ...the draft never emits one p allows
    draft_params = replace(PARAMS, temperature=DRAFT_TEMPERATURE)
    q_filtered = torch.stack([probabilities(row, draft_params) for row in DRAFT_LOGITS])  # [V, V]
    assert bool(((q - q_filtered).abs().sum(-1) > 0.2).all())  # the filters change q too
    unfiltered = torch.softmax(TARGET_LOGITS / PARAMS.temperature, dim=-1)
    assert bool(((unfiltered - filtered).abs().sum(-1) > 0.2).all())  # and the filters matter
    assert {draft_length(Sequence(0, [START, a, b], PARAMS)) for a in range(VOCAB) for b in range(VOCAB)} == {0, 1, 2}


@pytest.mark.parametrize(("mode", "backup", "lookup", "support"),
                         [("sd", "jit", False, False), ("ssd", "jit", False, False), ("ssd", "fast", False, False),
                          ("sd", "jit", True, False), ("ssd", "jit", True, False), ("sd", "jit", False, True),
                          ("ssd", "jit", True, True)])
def test_sampled_steps_follow_the_ar_distribution(mode, backup, lookup, support, monkeypatch):
    n = 4000
    guessed = []  # the lookup's tokens, proposed with one-hot q rows (Proposal.add_guess)
    add_guess = Proposal.add_guess
    monkeypatch.setattr(Proposal, "add_guess", lambda self, *args: guessed.append(1) or add_guess(self, *args))
    counts, tally = speculative_counts(mode, n, seed=17, backup=backup, lookup=lookup, support=support)
    assert tally["accepted"] > n / 4 and tally["rejected"] > n / 4  # both paths of the rule, often
    if lookup:  # the context repeats a bigram often in a 4-token vocabulary: many drafts are the lookup's
        assert len(guessed) > n / 4, len(guessed)
    if mode == "ssd":  # proposals from the cache and from the backup, often
        assert tally["hit"] > n / 10 and tally["miss"] > n / 10, tally
    exact = exact_ar_probs()
    assert chi_square_p_value(counts, exact) > P_PASS
    # The same counts against the unfiltered target: the test can tell the two apart.
    unfiltered = torch.softmax(TARGET_LOGITS / PARAMS.temperature, dim=-1)  # [V, V]
    assert chi_square_p_value(counts, exact_ar_probs(unfiltered)) < P_BROKEN


def coupled_ar(key: int) -> list[int]:
    """Coupled AR's first NUM_EMIT tokens after [START] for a request of noise key `key`: at position n the race over
    the filtered target row of the token before (engine.coupling)."""
    tokens = [START]
    for _ in range(NUM_EMIT):
        tokens.append(race(probabilities(TARGET_LOGITS[tokens[-1]], PARAMS), key, len(tokens)))
    return tokens[1:]


@pytest.mark.parametrize(("mode", "backup", "lookup", "support"),
                         [("sd", "jit", False, False), ("ssd", "jit", False, False), ("ssd", "fast", False, False),
                          ("sd", "jit", True, False), ("ssd", "jit", True, True)])
def test_coupled_steps_give_coupled_ar_replies(mode, backup, lookup, support):
    """Sampled by the coupled race, every request's reply is AR's for its key, token for token, whatever the draft
    proposed and k drafted; and AR's replies over many keys follow the exact distribution."""
    n = 1500
    seqs, tally = speculative_runs(mode, n, seed=29, backup=backup, lookup=lookup, support=support, coupled=True)
    assert tally["accepted"] > n / 4 and tally["rejected"] > n / 4, tally  # drafts kept and refused, often
    if mode == "ssd":  # (the race's fan-out holds the recovery token more often than the rejection rule's)
        assert tally["hit"] > n / 10 and tally["miss"] > n / 20, tally
    assert [seq.generated_ids[:NUM_EMIT] for seq in seqs] == [coupled_ar(seq.noise_key) for seq in seqs]
    assert chi_square_p_value(joint_counts(seqs), exact_ar_probs()) > P_PASS
    unfiltered = torch.softmax(TARGET_LOGITS / PARAMS.temperature, dim=-1)  # [V, V]
    assert chi_square_p_value(joint_counts(seqs), exact_ar_probs(unfiltered)) < P_BROKEN


def test_a_coupled_step_that_keeps_every_draft_is_caught(monkeypatch):
    """The identity with coupled AR can fail: a verification that keeps every draft gives other replies."""
    def keep_all(draft_tokens, target_probs, key, position):
        k = len(draft_tokens)
        return Verdict(k, race(target_probs[k], key, position + k))

    monkeypatch.setattr(engine.spec_decode, "verify_coupled", keep_all)
    seqs, _ = speculative_runs("sd", 200, seed=29, coupled=True)
    differ = sum(seq.generated_ids[:NUM_EMIT] != coupled_ar(seq.noise_key) for seq in seqs)
    assert differ > 50, differ


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_a_draft_that_is_the_target_races_at_the_targets_positions(mode):
    """With the target's own chain and sampling as the draft (q = p), the draft's race is the target's wherever it
    runs at the same position: coupled SD keeps every draft, and SSD's cache (its proposals, branches, glue fan-out
    and pre-drafts) holds every outcome after a request's first round, one candidate an outcome (its race's winner).
    A draft position one off would be refused about as often as an unrelated draft's token (the identity with AR
    holds whatever the draft proposes)."""
    seqs, tally = speculative_runs(mode, 300, seed=5, coupled=True, draft_table=TARGET_LOGITS, draft_temperature=None,
                                   fanout=(1,))
    assert tally["rejected"] == 0 and tally["accepted"] > 300, tally
    if mode == "ssd":
        assert tally["miss"] == 0 and tally["hit"] > 100, tally
    assert [seq.generated_ids[:NUM_EMIT] for seq in seqs] == [coupled_ar(seq.noise_key) for seq in seqs]
