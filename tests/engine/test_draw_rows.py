"""The draft's draws (drafter.draw_rows): from a reduced head's compact rows, the tokens and q rows are those of the
full rows, and rows drawn together are drawn as one at a time."""

from __future__ import annotations

import torch

from engine.drafter import CompactHead, Proposal, draw_rows
from engine.layers.embedding import ReducedLMHead
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

V, VR = 500, 120
PARAMS = SamplingParams(temperature=0.5, top_p=0.9)


def _rows(n: int, seed: int) -> tuple[torch.Tensor, CompactHead]:
    """[n, V] logits that are -inf outside a reduced head's VR token ids, and the head."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(V, generator=gen)[:VR].sort().values
    logits = torch.full((n, V), float("-inf"))
    logits[:, ids] = torch.randn(n, VR, generator=gen) * 3
    logits[0, ids[7]] = logits[0, ids[90]] = logits[0].amax() + 1  # a tie for the top: the lower id is the argmax
    return logits, CompactHead(ids, V)


def _draw(logits, seqs, head=None, temperature=None):
    proposals = [Proposal([], None if s.params.is_greedy else []) for s in seqs]
    draw_rows(proposals, seqs, logits, temperature, head)
    return proposals


def _seqs(params: SamplingParams, n: int) -> list[Sequence]:
    return [Sequence(i, [1], params, None if params.is_greedy else torch.Generator().manual_seed(i)) for i in range(n)]


def test_compact_rows_give_the_tokens_and_q_rows_of_the_full_rows():
    logits, head = _rows(6, seed=1)
    compact = logits[:, head.ids]  # [6, VR]
    for params in (PARAMS, SamplingParams(temperature=0.0)):
        full, small = _draw(logits, _seqs(params, 6)), _draw(compact, _seqs(params, 6), head)
        assert [p.tokens for p in small] == [p.tokens for p in full]
        for a, b in zip(small, full, strict=True):
            assert (a.probs is None) == (b.probs is None) == params.is_greedy
            if a.probs:
                assert a.probs[0].shape == (V,) and torch.allclose(a.probs[0], b.probs[0], atol=1e-7)
    assert _draw(compact, _seqs(SamplingParams(temperature=0.0), 1), head)[0].tokens == [int(head.ids[7])]
    assert len({p.tokens[0] for p in _draw(compact, _seqs(PARAMS, 6), head)}) > 1


def test_rows_drawn_together_are_drawn_as_one_at_a_time_in_row_order():
    """A greedy request, one sampling two rows (branches share their request's generator) and one with other
    settings: the tokens and q rows of one call are those of calls row by row."""
    logits, head = _rows(4, seed=2)
    compact = logits[:, head.ids]
    greedy = Sequence(0, [1], SamplingParams(temperature=0.0))

    def seqs():
        shared = Sequence(1, [1], PARAMS, torch.Generator().manual_seed(5))
        other = Sequence(2, [1], SamplingParams(temperature=1.2), torch.Generator().manual_seed(6))
        return [greedy, shared, shared, other]

    together = _draw(compact, seqs(), head, temperature=0.7)
    alone, rows = [], seqs()
    for i in range(4):
        alone += _draw(compact[i : i + 1], rows[i : i + 1], head, temperature=0.7)
    assert [p.tokens for p in together] == [p.tokens for p in alone]
    for a, b in zip(together[1:], alone[1:], strict=True):
        assert torch.equal(a.probs[0], b.probs[0])


def test_a_reduced_head_gives_its_rows_compact_over_ascending_ids():
    head = ReducedLMHead(V, 8)
    head.weight.data = torch.randn(3, 8)
    head.set_vocab_ids(torch.tensor([30, 10, 20]))
    hidden = torch.randn(2, 8)
    full = head(hidden)  # [2, V]
    head.finish_loading()  # sorts the rows by token id
    model = type("M", (), {"lm_head": head, "args": type("A", (), {"vocab_size": V})})()
    compact = CompactHead.of(model)
    assert compact.ids.tolist() == [10, 20, 30]
    assert torch.equal(head(hidden, compact=True), full[:, compact.ids])
    assert torch.equal(head(hidden), full)
    assert CompactHead.of(type("M", (), {"lm_head": torch.nn.Linear(8, V)})()) is None
