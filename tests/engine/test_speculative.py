"""Speculative verification, one step: greedy keeps the argmax prefix; a sampled verdict's first token follows
the target's p (chi-square tests: tests/engine/chi_square.py); zero-mass edge cases; reproducible verdicts. Whole
sequences: test_speculative_sequences.py."""

from __future__ import annotations

import pytest
import torch

from engine.sampling import draw, probabilities
from engine.sampling_params import SamplingParams
from engine.speculative import Rows, Verdict, verify_greedy, verify_sampled
from tests.engine.chi_square import P_BROKEN, P_PASS, chi_square_p_value, random_dist

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
