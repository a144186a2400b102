"""The coupled race (engine.coupling): its noise is SplitMix64's, its winner is an exact draw from p, positions are
independent, the CPU kernel ranks the runners as the torch reference does, and verification keeps exactly the drafts
that equal the target's own winners."""

from __future__ import annotations

import pytest
import torch

from engine import coupling, sampling
from engine.layers import native
from engine.sampling import probabilities, race, race_ranked
from engine.sampling_params import SamplingParams
from engine.speculative import Rows, Verdict, verify_coupled
from tests.engine.chi_square import P_BROKEN, P_PASS, chi_square_p_value

P = torch.tensor([0.4, 0.25, 0.0, 0.2, 0.1, 0.05])  # one token without mass
kernels = pytest.mark.skipif(native.library() is None, reason="no CPU kernels here")


def splitmix64(key: int, position: int, token: int) -> int:
    """The reference, in Python's integers: SplitMix64's output for the state key + golden * counter."""
    mask = (1 << 64) - 1
    z = (key + 0x9E3779B97F4A7C15 * ((position << 32) | token)) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_the_noise_is_splitmix64():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.cat([torch.tensor([0, 1, 49151, 2**31 - 1]), torch.randint(0, 200_000, (60,), generator=gen)])
    for key, position in ((0, 0), (2**63 - 1, 7), (2**62 + 12345, 2**31 - 1), (987654321, 300)):
        bits = coupling.noise_bits(key, position, tokens)  # [n] int64
        expected = [splitmix64(key, position, int(t)) for t in tokens]
        assert [b & ((1 << 64) - 1) for b in bits.tolist()] == expected


def winners(probs: torch.Tensor, keys: range, position: int) -> torch.Tensor:
    counts = torch.zeros(probs.shape[0])
    for key in keys:
        counts[race(probs, key, position)] += 1
    return counts


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_the_winner_is_a_draw_from_p(path, monkeypatch):
    if path == "torch":
        monkeypatch.setattr(sampling, "TORCH_ONLY", True)
    counts = winners(P, range(6000), position=5)
    assert counts[2] == 0  # (a token without mass never wins)
    assert chi_square_p_value(counts, P) > P_PASS
    assert chi_square_p_value(counts, torch.softmax(P, dim=0)) < P_BROKEN  # the test tells distributions apart


def test_positions_are_independent():
    """The winners at positions n and n + 1 of one key: their joint is the product of the marginals (noise
    correlated across positions would make a reply's tokens depend on each other beyond the model)."""
    joint = torch.zeros(len(P), len(P))
    for key in range(6000):
        joint[race(P, key, 40), race(P, key, 41)] += 1
    assert chi_square_p_value(joint.flatten(), torch.outer(P, P).flatten()) > P_PASS
    keyed = torch.zeros(len(P), len(P))  # the same position under keys k and k + 1: independent too
    for key in range(0, 12000, 2):
        keyed[race(P, key, 9), race(P, key + 1, 9)] += 1
    assert chi_square_p_value(keyed.flatten(), torch.outer(P, P).flatten()) > P_PASS


def rows(n: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scales = torch.tensor([30.0, 8.0, 3.0, 1.0, 0.2]).repeat(n // 5 + 1)[:n, None]
    return torch.randn(n, width, generator=gen) * scales


@kernels
@pytest.mark.parametrize(("temperature", "top_p"), [(0.2, 0.9), (0.7, 1.0), (1.5, 1.0), (1.0, 0.5)])
def test_the_kernel_ranks_the_runners_as_the_reference(temperature, top_p):
    """Winners and the first finishers (SSD's fan-out), plain rows and compact ones over token ids, filtered rows
    and unfiltered ones (where the kernel skips the logs of runners that cannot place)."""
    params = SamplingParams(temperature=temperature, top_p=top_p)
    gen = torch.Generator().manual_seed(1)
    for width, compact in ((49152, False), (8192, True), (37, False)):
        ids = torch.randperm(49152, generator=gen)[:width].sort().values if compact else None
        for i, row in enumerate(rows(20, width, seed=width)):
            probs = probabilities(row, params)
            key, position = int(torch.randint(2**63 - 1, (1,), generator=gen)), 100 + i
            for n in (1, 3, 12):
                assert race_ranked(probs, key, position, ids, n) == coupling.ranked(probs, key, position, ids, n)


def test_ranked_runners_come_winner_first():
    ranked = coupling.ranked(P, 3, 4, None, 10)
    assert ranked[0] == race(P, 3, 4) and sorted(ranked) == [0, 1, 3, 4, 5]  # only the tokens with mass, each once


def test_a_compact_row_races_as_the_row_spread_over_the_vocabulary():
    """A reduced draft head's row [Vr] over token ids: each runner's noise is its token's, so the winner is the one
    the full row [V] gives."""
    ids = torch.tensor([10, 20, 30, 40, 50, 60])
    spread = torch.zeros(64).index_copy_(0, ids, P)
    assert all(int(ids[race(P, key, 4, ids)]) == race(spread, key, 4) for key in range(200))
    assert any(race(P, key, 4, ids) != race(P, key, 4) for key in range(200))  # (the ids matter)


@pytest.mark.parametrize("bad", [[0.0, 0.0], [float("nan")] * 2])
@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_a_race_over_no_distribution_says_so(bad, path, monkeypatch):
    if path == "torch":
        monkeypatch.setattr(sampling, "TORCH_ONLY", True)
    with pytest.raises(RuntimeError, match="cannot sample from a distribution of total mass"):
        race(torch.tensor(bad), 1, 2)


def test_verification_keeps_the_drafts_equal_to_the_targets_winners():
    gen = torch.Generator().manual_seed(4)
    params = SamplingParams(temperature=1.0)
    for trial in range(40):
        logits = torch.randn(5, 50, generator=gen) * 2  # [K+1, V], K = 4
        key, position = trial * 7919, 30 + trial
        targets = [race(probabilities(row, params), key, position + i) for i, row in enumerate(logits)]  # [K+1]
        m = trial % 5  # drafts right up to m, then (m < K) a wrong one
        drafts = targets[:m] + [(t + 1) % 50 for t in targets[m:4]]
        verdict = verify_coupled(torch.tensor(drafts), Rows(logits, params), key, position)
        assert verdict == Verdict(m, targets[m])
