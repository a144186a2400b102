"""Speculative verification: greedy keeps the argmax prefix; sampling reproduces the target distribution.

The statistical tests are chi-square goodness-of-fit tests. Every generator is seeded, so each test is
deterministic; the thresholds say how unlikely a correct sampler is to fail for an arbitrary seed:
a correct verifier is accepted when the p-value exceeds ``P_PASS`` (false failure rate 1e-6 per test),
and a deliberately broken one must land below ``P_BROKEN`` (which it misses by many orders of magnitude).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.sampling import draw, probabilities
from engine.sampling_params import SamplingParams
from engine.speculative import Rows, Verdict, verify_greedy, verify_sampled

P_PASS = 1e-6
P_BROKEN = 1e-9
MIN_EXPECTED = 5.0  # chi-square needs ~5 expected counts per cell; rarer cells are pooled into one

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Verdict]


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observing `counts` [C] under `probs` [C]. An outcome with probability 0 seen even once -> 0."""
    n = float(counts.sum())
    expected = probs.double() * n
    counts = counts.double()
    if bool(((expected == 0) & (counts > 0)).any()):
        return 0.0
    big = expected >= MIN_EXPECTED
    observed_cells, expected_cells = counts[big], expected[big]
    pooled = float(expected[~big].sum())
    if pooled > 0:
        observed_cells = torch.cat([observed_cells, counts[~big].sum().view(1)])
        expected_cells = torch.cat([expected_cells, torch.tensor([pooled], dtype=torch.float64)])
    chi2 = ((observed_cells - expected_cells) ** 2 / expected_cells).sum()
    dof = observed_cells.numel() - 1
    # Survival function of chi-square(dof): the regularized upper incomplete gamma Q(dof/2, chi2/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), chi2 / 2))


def random_dist(shape: tuple[int, ...], seed: int, sharpness: float = 1.5) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(shape, generator=gen) * sharpness, dim=-1)


# ----------------------------------------------------------------------------------------------- greedy


def one_hot_logits(tokens: list[int], vocab: int = 5) -> torch.Tensor:
    logits = torch.randn(len(tokens), vocab) * 0.1  # noise below the winning margin
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 3.0
    return logits


@pytest.mark.parametrize(
    ("draft", "target", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], Verdict(3, 4)),  # all accepted: bonus from the last row
        ([1, 2, 3], [0, 2, 3, 4], Verdict(0, 0)),  # first rejected: target's own token at row 0
        ([1, 2, 3], [1, 4, 3, 4], Verdict(1, 4)),  # middle mismatch: later matches do not count
        ([1, 2, 3], [1, 2, 0, 4], Verdict(2, 0)),
        ([], [2], Verdict(0, 2)),  # K = 0: plain argmax of row 0
    ],
)
def test_greedy_keeps_the_argmax_prefix(draft, target, expected):
    assert verify_greedy(torch.tensor(draft, dtype=torch.long), one_hot_logits(target)) == expected


def test_greedy_equals_greedy_ar_on_random_logits():
    # Against an independent loop: walk the positions and stop at the first disagreement.
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        logits = torch.randn(5, 3, generator=gen)
        draft = torch.randint(0, 3, (4,), generator=gen)
        emitted = []
        for i in range(5):
            best = int(logits[i].argmax())
            emitted.append(best)
            if i == 4 or best != int(draft[i]):
                break
        verdict = verify_greedy(draft, logits)
        assert [*draft[: verdict.num_accepted].tolist(), verdict.next_token] == emitted


# --------------------------------------------------------------------------------------- single step

VOCAB = 6
P_ROWS = random_dist((2, VOCAB), seed=10)  # p_0 and the bonus row p_1


def _q_random() -> torch.Tensor:
    return random_dist((VOCAB,), seed=11)


def _q_with_holes() -> torch.Tensor:
    # q misses tokens 0 and 1 that p needs, and puts mass on token 5 that p (below) forbids.
    q = random_dist((VOCAB,), seed=12)
    q[:2] = 0.0
    return q / q.sum()


def _p_with_hole() -> torch.Tensor:
    p = P_ROWS.clone()
    p[0, 5] = 0.0
    return p / p.sum(-1, keepdim=True)


@pytest.mark.parametrize(
    ("p_rows", "q_row", "q_is_p"),
    [(P_ROWS, _q_random(), False), (_p_with_hole(), _q_with_holes(), False), (P_ROWS, P_ROWS[0], True)],
    ids=["random-q", "q-and-p-with-zeros", "q-equals-p"],
)
def test_first_emitted_token_follows_p(p_rows, q_row, q_is_p):
    n = 20000
    gen = torch.Generator().manual_seed(20)
    drafts = torch.multinomial(q_row.expand(n, VOCAB), 1, replacement=True, generator=gen)  # [n, 1]
    first, bonus = [], []
    for x in drafts:
        verdict = verify_sampled(x, q_row.view(1, VOCAB), p_rows, gen)
        first.append(int(x) if verdict.num_accepted else verdict.next_token)
        if verdict.num_accepted:
            bonus.append(verdict.next_token)
    counts = torch.bincount(torch.tensor(first), minlength=VOCAB)
    assert chi_square_p_value(counts, p_rows[0]) > P_PASS
    if q_is_p:
        assert len(bonus) == n  # q == p: u * q < p always holds
        # ...so every verdict carries a bonus token, which must come from the NEXT row, p_1.
        assert chi_square_p_value(torch.bincount(torch.tensor(bonus), minlength=VOCAB), p_rows[1]) > P_PASS
    else:  # sanity of the test itself: the draft's own distribution is clearly rejected
        assert chi_square_p_value(counts, q_row) < P_BROKEN


def test_zero_mass_edge_cases_are_decided_without_randomness():
    # q(x) == 0 < p(x): min(1, p/q) = 1, always kept. p(x) == 0: never kept, whatever q says
    # (a fast backup draft may propose tokens its q gives no mass, and the target may forbid them).
    p = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        assert verify_sampled(torch.tensor([0]), torch.tensor([[0.0, 1.0, 0.0]]), p, gen) == Verdict(1, 2)
        for q in ([0.0, 0.0, 1.0], [0.0, 1.0, 0.0]):
            verdict = verify_sampled(torch.tensor([2]), torch.tensor([q]), p, gen)
            assert verdict.num_accepted == 0 and verdict.next_token in (0, 1)


def test_k_zero_samples_row_zero():
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    empty = torch.zeros(0, dtype=torch.long)
    assert verify_sampled(empty, torch.zeros(0, 4), p, gen) == Verdict(0, 2)


# ------------------------------------------------------------------- whole sequences on a toy model

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


# ------------------------------------------------------------------------------------- reproducibility


def _verdicts(seed: int) -> list[Verdict]:
    gen = torch.Generator().manual_seed(seed)
    q, p = random_dist((4, 8), seed=70), random_dist((5, 8), seed=71)
    tokens = torch.tensor([1, 2, 3, 4])
    return [verify_sampled(tokens, q, p, gen) for _ in range(50)]


def test_same_seed_same_verdicts():
    assert _verdicts(7) == _verdicts(7)
    assert _verdicts(7) != _verdicts(8)


def test_uniforms_are_drawn_first_in_position_order():
    # The documented draw order: K+1 float64 uniforms, the first K decide acceptance in position order.
    # So k can be predicted from the seed alone.
    q, p = random_dist((4, 8), seed=72), random_dist((5, 8), seed=73)
    tokens = torch.tensor([0, 5, 2, 7])
    seen = set()
    for seed in range(30):
        u = torch.rand(5, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)[:4]
        rows = torch.arange(4)
        accepted = [*(u * q[rows, tokens].double() < p[rows, tokens].double()).tolist(), False]
        verdict = verify_sampled(tokens, q, p, torch.Generator().manual_seed(seed))
        assert verdict.num_accepted == accepted.index(False)
        seen.add(verdict.num_accepted)
    assert len(seen) > 1  # the inputs give both acceptances and rejections


def test_rows_computed_when_read_give_the_verdicts_of_all_rows_and_skip_those_past_the_rejection():
    """verify with `Rows` (the target's p_i computed when first read) decides as with every row computed: the same
    verdict for the same generator state, and no row past the first rejection (or the bonus row) is computed."""
    params = SamplingParams(temperature=0.8, top_p=0.9)
    gen = torch.Generator().manual_seed(74)
    seen = set()
    for case in range(40):
        base = torch.randn(5, 300, generator=gen) * 3
        logits = base + torch.randn(5, 300, generator=gen) * case / 20  # [K+1, V]: the draft's, less and less alike
        q = [probabilities(row, SamplingParams(temperature=1.0)) for row in base[:4]]
        tokens = torch.tensor([draw(row, gen) for row in q])
        rows = Rows(logits, params)
        lazy = verify_sampled(tokens, q, rows, torch.Generator().manual_seed(case))
        every_row = probabilities(logits, params)  # [K+1, V]
        full = verify_sampled(tokens, torch.stack(q), every_row, torch.Generator().manual_seed(case))
        assert lazy == full
        assert sorted(rows.rows) == list(range(full.num_accepted + 1))
        seen.add(full.num_accepted)
    assert len(seen) > 2  # rejections at several positions, and all kept
