"""Sampling functions: filters keep the right tokens, draws follow the distribution, seeds reproduce."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import InvalidParameterError
from engine.sampling import SUBNORMAL, draw, keep_top_k_top_p, probabilities, sample_batch, sample_token
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])


def kept(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Which tokens the filters keep (logits at temperature 1)."""
    return keep_top_k_top_p(torch.softmax(logits, dim=-1), top_k, top_p) > 0


def test_top_k_keeps_exactly_k():
    assert kept(LOGITS, 2, 1.0).tolist() == [True, True, False, False, False]


def test_top_p_keeps_the_smallest_nucleus():
    probs = torch.softmax(LOGITS, -1)
    p = float(probs[0] + probs[1]) - 1e-3  # needs the top two tokens
    assert kept(LOGITS, 0, p).tolist() == [True, True, False, False, False]
    assert kept(LOGITS, 0, 1e-6).sum() == 1


def test_greedy_and_degenerate_filters_agree():
    gen = torch.Generator().manual_seed(0)
    assert sample_token(LOGITS, SamplingParams(temperature=0.0), None) == 0
    assert sample_token(LOGITS, SamplingParams(temperature=1.0, top_k=1), gen) == 0


def test_draws_follow_the_tempered_distribution():
    params = SamplingParams(temperature=0.7)
    gen = torch.Generator().manual_seed(1)
    n = 20000
    counts = torch.bincount(torch.tensor([sample_token(LOGITS, params, gen) for _ in range(n)]), minlength=5)
    expected = probabilities(LOGITS, params) * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.0  # 4 degrees of freedom: p ~ 5e-4
    wrong = torch.softmax(LOGITS, -1) * n  # the untempered distribution is clearly rejected
    assert float(((counts - wrong) ** 2 / wrong).sum()) > 100.0


def test_a_draw_never_takes_a_token_without_mass_and_follows_the_rest():
    probs = torch.tensor([0.0, 0.5, 0.0, 1e-3, 0.3, 0.0])  # zeros first, inside and last; unnormalised (0.801)
    gen = torch.Generator().manual_seed(2)
    n = 40000
    counts = torch.bincount(torch.tensor([draw(probs, gen) for _ in range(n)]), minlength=6)
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    expected = probs[kept] / probs.sum() * n
    assert float(((counts[kept] - expected) ** 2 / expected).sum()) < 25.0  # 2 degrees of freedom: p ~ 4e-6
    assert draw(torch.tensor([0.0, 0.0, 2.0, 0.0]), gen) == 2


@pytest.mark.parametrize("bad", [[0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0]])
def test_a_draw_from_no_distribution_says_so(bad):
    with pytest.raises(RuntimeError, match="cannot sample from a distribution of total mass"):
        draw(torch.tensor(bad), torch.Generator().manual_seed(0))


def test_same_seed_same_draws():
    def seqs():
        return [Sequence(i, [1], SamplingParams(temperature=1.0), torch.Generator().manual_seed(5)) for i in range(2)]

    a = sample_batch(torch.stack([LOGITS, LOGITS]), seqs())
    b = sample_batch(torch.stack([LOGITS, LOGITS]), seqs())
    assert a == b


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"max_tokens": 0},
        {"seed": -3}, {"stop": [""]}, {"stop_token_ids": [-1]},
        # wrong types (a float max_tokens ran one token past it; the others failed deep in a comparison or a cast)
        {"max_tokens": 2.5}, {"max_tokens": "5"}, {"top_k": 1.0}, {"seed": 1.5}, {"temperature": "0.7"},
        {"top_p": None}, {"temperature": True}, {"stop": [3]}, {"stop": 3}, {"stop_token_ids": ["2"]},
        {"stop_token_ids": [True]}, {"ignore_eos": "no"}, {"temperature": 10**400}, {"max_tokens": bytearray(b"5")},
    ],
)
def test_invalid_values_are_refused_with_one_line(kwargs):
    with pytest.raises(InvalidParameterError) as err:
        SamplingParams(**kwargs)
    assert "\n" not in str(err.value) and str(err.value)


def test_one_stop_string_is_one_stop_string_not_its_characters():
    assert SamplingParams(stop="end").stop == ("end",)  # (it was ("e", "n", "d"): a reply stopped at any e)
    assert SamplingParams(stop=["end", "fin"]).stop == ("end", "fin")


def test_values_of_numeric_types_and_one_shot_lists_are_taken_as_given():
    """numpy's and torch's numbers pass as the Python numbers they are; a generator of stops is read once (the type
    check had used it up: the stops were silently lost)."""
    import numpy as np

    params = SamplingParams(temperature=np.float32(0.5), max_tokens=np.int64(5), seed=torch.tensor(3),
                            stop=(s for s in ["END"]), stop_token_ids=np.array([2, 3]))
    assert (params.temperature, params.max_tokens, params.seed) == (0.5, 5, 3)
    assert params.stop == ("END",) and params.stop_token_ids == (2, 3)
    assert all(type(v) is int for v in (params.max_tokens, params.seed, *params.stop_token_ids))
    assert SamplingParams(stop_token_ids=(t for t in [7])).stop_token_ids == (7,)


def test_a_batch_of_rows_is_filtered_as_each_row_alone():
    rows = torch.randn(5, 40, generator=torch.Generator().manual_seed(3)) * 3
    for top_k, top_p in ((3, 1.0), (0, 0.7), (8, 0.5), (0, 1.0)):
        params = SamplingParams(temperature=0.6, top_k=top_k, top_p=top_p)
        batched = probabilities(rows, params)
        assert torch.equal(batched, torch.stack([probabilities(row, params) for row in rows]))


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.8), (20, 0.9)])
def test_the_distribution_is_the_softmax_of_the_kept_logits(top_k, top_p):
    """The filters renormalise the kept mass: the distribution a second softmax over the kept logits gives (float64
    reference), to float32's rounding."""
    gen = torch.Generator().manual_seed(6)
    for row in torch.randn(4, 300, generator=gen) * 3:
        params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
        probs = probabilities(row, params)
        want = torch.softmax((row.double() / 0.7).masked_fill(probs == 0, float("-inf")), dim=-1)
        assert torch.allclose(probs.double(), want, rtol=1e-5, atol=1e-9)
        assert (probs > 0).sum() >= 1 and abs(float(probs.sum()) - 1.0) < 1e-5


def test_a_token_e87_times_less_likely_than_the_top_gets_no_probability():
    """Such a token's float32 exp would be subnormal (a slow path of torch's softmax on the CPU): it gets exactly 0,
    and a token just above that line keeps its mass."""
    logits = torch.tensor([0.0, SUBNORMAL - 0.5, SUBNORMAL + 0.5, -1.0, -200.0])
    probs = probabilities(logits, SamplingParams(temperature=1.0))
    assert probs[1] == 0 and probs[4] == 0
    assert float(probs[2]) / float(probs[0]) == pytest.approx(math.exp(SUBNORMAL + 0.5), rel=1e-5)
    assert probs[2] >= torch.finfo(torch.float32).tiny


@pytest.mark.parametrize("temperature", [1e-40, 1e-46, 5e-324])  # (1e-46 and 5e-324 are 0 in float32)
def test_a_tiny_temperature_gives_the_argmax_not_nan(temperature):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 10
    for row in logits:
        probs = probabilities(row, SamplingParams(temperature=temperature))
        assert torch.isfinite(probs).all() and int(probs.argmax()) == int(row.argmax()) and probs.max() == 1.0
        assert sample_token(row, SamplingParams(temperature=temperature), torch.Generator().manual_seed(0)) == int(
            row.argmax())
    assert torch.allclose(probabilities(logits[0], SamplingParams(temperature=0.7)),
                          torch.softmax(logits[0] / 0.7, dim=-1), atol=1e-7)


def _nucleus_by_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: sort everything (float64), keep a token where the strictly more probable ones hold < top_p."""
    probs = torch.softmax(logits.double(), dim=-1)
    greater = torch.stack([probs[probs > p].sum() for p in probs])  # [V]
    return greater < top_p


def test_top_p_keeps_what_a_full_sort_keeps_however_wide_the_nucleus():
    gen = torch.Generator().manual_seed(4)
    for scale in (40.0, 8.0, 2.0, 0.3):  # nuclei of 1 token to most of the 3000 (past the first 32, 256 and 2048)
        for top_p in (0.5, 0.9, 0.99):
            row = torch.randn(3000, generator=gen) * scale
            want = _nucleus_by_sort(row, top_p)
            probs = torch.softmax(row.double(), -1)
            near = [(probs[probs > p].sum() - top_p).abs() < 1e-5 for p in probs]  # float32's rounding decides those
            if any(near):
                continue
            assert torch.equal(kept(row, 0, top_p), want), (scale, top_p)


def test_top_p_keeps_every_token_tied_with_one_it_keeps():
    logits = torch.tensor([3.0, 1.0, 1.0, 1.0, -2.0])  # p = 0.8 needs one of the three tied tokens: all three stay
    probs = torch.softmax(logits, -1)
    assert float(probs[0]) < 0.8 < float(probs[:2].sum())
    assert kept(logits, 0, 0.8).tolist() == [True, True, True, True, False]


def test_rows_of_narrow_and_wide_nuclei_batched_are_filtered_as_alone():
    gen = torch.Generator().manual_seed(5)
    rows = torch.stack([torch.randn(3000, generator=gen) * s for s in (40.0, 0.3, 4.0)])  # 1, ~2500 and ~50 kept
    probs = torch.softmax(rows, dim=-1)
    batched = keep_top_k_top_p(probs, 0, 0.9)
    assert torch.equal(batched, torch.stack([keep_top_k_top_p(row, 0, 0.9) for row in probs]))
    assert [int((r > 0).sum()) > 32 for r in batched] == [False, True, True]
