"""Whole speculative sequences on a toy model (a next-token table): sampled SD's first tokens follow the target's
distribution exactly, filtered by temperature and top-k too, and a deliberately broken rule fails the same
chi-square check (tests/engine/chi_square.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.sampling import probabilities
from engine.sampling_params import SamplingParams
from engine.speculative import Verdict, verify_sampled
from tests.engine.chi_square import P_BROKEN, P_PASS, chi_square_p_value, random_dist

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Verdict]


TOY_VOCAB, NUM_DRAFT, NUM_EMIT, START = 4, 3, 3, 0
TARGET_TABLE = random_dist((TOY_VOCAB, TOY_VOCAB), seed=30)  # next_dist[last] for the target
# A different draft, half-way to the target so that every k in 0..K (and the bonus path) occurs often.
DRAFT_TABLE = 0.5 * TARGET_TABLE + 0.5 * random_dist((TOY_VOCAB, TOY_VOCAB), seed=31)


def exact_ar_probs(table: torch.Tensor) -> torch.Tensor:
    """P(t1, t2, t3 | START) under AR sampling from `table`, flattened to index t1*16 + t2*4 + t3. [64]"""
    joint = table[START][:, None, None] * table[:, :, None] * table[None, :, :]  # [V, V, V]
    return joint.reshape(-1)


def speculative_outcomes(
    target: torch.Tensor, draft: torch.Tensor, verify: Verifier, n: int, seed: int, num_draft: int = NUM_DRAFT
) -> torch.Tensor:
    """Counts [64] of the first NUM_EMIT tokens of `n` SD runs (draft K=num_draft tokens, then verify).

    Rounds are batched over the runs that still need tokens: drafting uses one tensor draw per step;
    verification goes run by run through `verify` (the function under test).
    """
    gen = torch.Generator().manual_seed(seed)
    emitted: list[list[int]] = [[] for _ in range(n)]
    active = list(range(n))
    while active:
        last = torch.tensor([emitted[run][-1] if emitted[run] else START for run in active])  # [A]
        context = [last]  # K+1 tensors [A]: last, x1..xK
        for _ in range(num_draft):
            context.append(torch.multinomial(draft[context[-1]], 1, generator=gen).squeeze(-1))
        context = torch.stack(context, dim=1)  # [A, K+1]
        draft_probs, target_probs = draft[context[:, :-1]], target[context]  # [A, K, V], [A, K+1, V]
        rows = zip(active, context[:, 1:].unbind(0), draft_probs.unbind(0), target_probs.unbind(0), strict=True)
        for run, tokens, q_rows, p_rows in rows:
            verdict = verify(tokens, q_rows, p_rows, gen)
            emitted[run] += [*tokens[: verdict.num_accepted].tolist(), verdict.next_token]
        active = [run for run in active if len(emitted[run]) < NUM_EMIT]
    first = torch.tensor([run[:NUM_EMIT] for run in emitted])  # extras of the last round are truncated
    index = first[:, 0] * TOY_VOCAB**2 + first[:, 1] * TOY_VOCAB + first[:, 2]
    return torch.bincount(index, minlength=TOY_VOCAB**NUM_EMIT)


def test_sequences_follow_the_target_exactly():
    counts = speculative_outcomes(TARGET_TABLE, DRAFT_TABLE, verify_sampled, n=30000, seed=40)
    assert chi_square_p_value(counts, exact_ar_probs(TARGET_TABLE)) > P_PASS
    assert chi_square_p_value(counts, exact_ar_probs(DRAFT_TABLE)) < P_BROKEN


def test_sequences_follow_the_filtered_target():
    # Target at temperature 0.8 with top-k 3 (one token per row forbidden), draft with top-k 2: q is
    # zero where p is not and vice versa. What comes out must be the *filtered* target distribution.
    # K = 2 here so that a bonus token (3rd when both drafts are kept) is among the compared tokens;
    # with K = 3 the bonus is always the 4th token and is truncated away.
    gen = torch.Generator().manual_seed(51)
    target_logits = torch.randn(TOY_VOCAB, TOY_VOCAB, generator=gen) * 1.5
    draft_logits = target_logits + torch.randn(TOY_VOCAB, TOY_VOCAB, generator=gen)  # a noisy copy
    target = torch.stack([probabilities(row, SamplingParams(temperature=0.8, top_k=3)) for row in target_logits])
    draft = torch.stack([probabilities(row, SamplingParams(temperature=1.0, top_k=2)) for row in draft_logits])
    assert bool(((draft == 0) & (target > 0)).any()) and bool(((draft > 0) & (target == 0)).any())
    counts = speculative_outcomes(target, draft, verify_sampled, n=20000, seed=52, num_draft=2)
    assert chi_square_p_value(counts, exact_ar_probs(target)) > P_PASS
    unfiltered = torch.softmax(target_logits / 0.8, dim=-1)
    assert chi_square_p_value(counts, exact_ar_probs(unfiltered)) < P_BROKEN


def _always_accept(tokens, draft_probs, target_probs, gen) -> Verdict:
    bonus = int(torch.multinomial(target_probs[-1], 1, generator=gen))
    return Verdict(tokens.shape[0], bonus)


def _recovery_from_p(tokens, draft_probs, target_probs, gen) -> Verdict:
    # The correct acceptance test, but the recovery token is drawn from p instead of the residual.
    verdict = verify_sampled(tokens, draft_probs, target_probs, gen)
    if verdict.num_accepted == tokens.shape[0]:
        return verdict
    recovery = int(torch.multinomial(target_probs[verdict.num_accepted], 1, generator=gen))
    return Verdict(verdict.num_accepted, recovery)


def _bonus_from_previous_row(tokens, draft_probs, target_probs, gen) -> Verdict:
    # Off by one: the bonus drawn from p_{K-1} instead of p_K (visible only when K < NUM_EMIT).
    verdict = verify_sampled(tokens, draft_probs, target_probs, gen)
    if verdict.num_accepted < tokens.shape[0]:
        return verdict
    return Verdict(verdict.num_accepted, int(torch.multinomial(target_probs[-2], 1, generator=gen)))


@pytest.mark.parametrize(
    ("broken", "num_draft"), [(_always_accept, 3), (_recovery_from_p, 3), (_bonus_from_previous_row, 2)]
)
def test_a_broken_rule_fails_the_same_check(broken, num_draft):
    counts = speculative_outcomes(TARGET_TABLE, DRAFT_TABLE, broken, n=5000, seed=60, num_draft=num_draft)
    assert chi_square_p_value(counts, exact_ar_probs(TARGET_TABLE)) < P_BROKEN
