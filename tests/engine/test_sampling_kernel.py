"""engine/kernels/sampling.cpp, the CPU's `probabilities` and `inverse_cdf`, against the torch ops they replace (the
reference: SSD_CHAT_SAMPLING=torch): the same tokens kept, the same probabilities to float32's rounding, the same
draws for the same probabilities and uniform, rows alone or batched, and torch's path wherever a row is not
finite."""

from __future__ import annotations

import pytest
import torch

from engine import sampling
from engine.layers import native
from engine.sampling import draw, inverse_cdf, probabilities
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(native.library() is None, reason="no CPU kernels here")

SETTINGS = [(0.2, 0, 0.9), (0.7, 0, 1.0), (0.7, 0, 0.9), (1.0, 40, 0.95), (1.5, 3, 1.0), (1.0, 0, 0.5)]


def rows(n: int, width: int, seed: int) -> torch.Tensor:
    """Logit rows from nearly one-hot to nearly flat, a few of them with ties at the top."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.tensor([30.0, 8.0, 3.0, 1.0, 0.2]).repeat(n // 5 + 1)[:n, None]
    out = torch.randn(n, width, generator=gen) * scales
    out[::7, 1] = out[::7].amax(dim=-1)  # ties with the largest
    return out


def reference(logits: torch.Tensor, params: SamplingParams, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as patch:
        patch.setattr(sampling, "TORCH_ONLY", True)
        return probabilities(logits, params)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SETTINGS)
def test_the_kernel_keeps_the_tokens_torch_keeps_with_their_probabilities(temperature, top_k, top_p, monkeypatch):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    for width in (49152, 8192, 37):  # SmolLM2's vocabulary, a reduced draft head, a width that is no multiple of 16
        logits = rows(40, width, seed=width)
        assert sampling._kernel_probabilities(logits, temperature, top_k, top_p) is not None  # the kernel ran
        got, want = probabilities(logits, params), reference(logits, params, monkeypatch)
        for row, g, w in zip(logits, got, want, strict=True):
            differ = (g > 0) != (w > 0)
            if differ.any():  # only at the nucleus's edge, where float32's rounding of the sums decides
                assert top_p < 1.0 and int(differ.sum()) <= 3
                probs = torch.softmax(row.double() / temperature, -1)
                for i in differ.nonzero().flatten():
                    assert abs(float(probs[probs > probs[i]].sum()) - top_p) < 1e-4
                g, w = g.masked_fill(differ, 0), w.masked_fill(differ, 0)
                g, w = g / g.sum(), w / w.sum()
            assert torch.allclose(g, w, rtol=2e-5, atol=1e-12), float((g - w).abs().max())
            assert abs(float(g.sum()) - 1.0) < 1e-5


def test_a_batch_is_each_row_alone_and_the_draws_are_torchs():
    params = SamplingParams(temperature=0.8, top_k=0, top_p=0.95)
    logits = rows(20, 49152, seed=2)
    batched = probabilities(logits, params)
    assert torch.equal(batched, torch.stack([probabilities(row, params) for row in logits]))
    gen = torch.Generator().manual_seed(9)
    for row in batched:
        for u in torch.rand(50, generator=gen, dtype=torch.float64):
            want = int(torch.searchsorted(row.double().cumsum(0), (u * row.double().sum()).view(1), right=True))
            assert inverse_cdf(row, u) == want == inverse_cdf(row.double(), u)  # float64 input: torch's path
    assert inverse_cdf(torch.tensor([0.0, 0.25, 0.0, 0.75]), torch.tensor(1.0 - 2**-53)) == 3  # rounded up to the total


def test_the_seeded_draws_of_a_row_are_the_same_with_or_without_the_kernel(monkeypatch):
    probs = probabilities(rows(4, 49152, seed=4)[3], SamplingParams(temperature=1.0))  # (scale 1: a flat row)
    fast = [draw(probs, torch.Generator().manual_seed(s)) for s in range(30)]
    monkeypatch.setattr(sampling, "TORCH_ONLY", True)
    assert fast == [draw(probs, torch.Generator().manual_seed(s)) for s in range(30)]
    assert len(set(fast)) > 5  # (a flat enough row: the draws differ)


def test_the_tiny_and_the_extreme(monkeypatch):
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(1)) * 10
    for row in logits:  # a temperature below float32's least normal: the argmax
        probs = probabilities(row, SamplingParams(temperature=1e-46))
        assert probs.max() == 1.0 and int(probs.argmax()) == int(row.argmax())
    far = torch.tensor([0.0, -86.5, -87.5, -1.0, -300.0])  # e^-87 below the top: no probability (a subnormal exp)
    probs = probabilities(far, SamplingParams(temperature=1.0))
    assert probs[2] == 0 and probs[4] == 0 and probs[1] > 0
    assert torch.equal(probs > 0, reference(far, SamplingParams(temperature=1.0), monkeypatch) > 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_row_that_is_not_finite_takes_torchs_path_alone(bad, monkeypatch):
    good = rows(3, 300, seed=5)
    logits = torch.cat([good, torch.tensor([[1.0, bad, *[0.5] * 298]])])  # [4, 300]: the last row is not finite
    params = SamplingParams(temperature=1.0, top_p=0.9)
    got = probabilities(logits, params)
    assert torch.equal(got[:3], probabilities(good, params))  # the other rows: the kernel's, as alone
    assert torch.equal(got[3].isnan(), reference(logits[3], params, monkeypatch).isnan())  # torch's row
    with pytest.raises(RuntimeError, match="not finite"):
        draw(probabilities(logits[3], params), torch.Generator().manual_seed(0))
    masked = torch.tensor([1.0, float("-inf"), 0.5, float("-inf")])  # masked tokens: the kernel, no probability
    probs = probabilities(masked, SamplingParams(temperature=1.0))
    assert probs[1] == 0 and probs[3] == 0
    assert torch.allclose(probs, reference(masked, SamplingParams(temperature=1.0), monkeypatch))
    with pytest.raises(RuntimeError, match="not finite"):  # every token masked: no distribution
        draw(probabilities(torch.full((5,), float("-inf")), params), torch.Generator().manual_seed(0))


def test_what_the_kernel_leaves_to_torch():
    assert sampling._kernel_probabilities(torch.zeros(8, dtype=torch.float64), 1.0, 0, 1.0) is None  # float32 only
    assert sampling._kernel_probabilities(torch.zeros(8), 1.0, 0, 1 - 2**-30) is None  # a top-p float32 makes 1
    assert sampling._kernel_probabilities(torch.zeros(8), 1.0, 2**70, 1.0) is not None  # (a top-k past the width)


def test_a_long_nucleus_ends_where_torchs_does(monkeypatch):
    # Thousands of tokens in the nucleus: its end depends on how the mass before each token is summed (torch: in
    # float64, each prefix rounded to float32), and a float32 running sum drifted from it.
    # (a float32 running sum kept one token more or fewer in 6 of these 12 rows)
    for scale, top_p in ((0.5, 0.95), (0.2, 0.999)):
        params = SamplingParams(temperature=1.0, top_p=top_p)
        for row in torch.randn(6, 49152, generator=torch.Generator().manual_seed(8)) * scale:
            got, want = probabilities(row, params), reference(row, params, monkeypatch)
            assert int((got > 0).sum()) == int((want > 0).sum()) > 40000


def test_no_kernel_when_told(monkeypatch):
    monkeypatch.setattr(sampling, "TORCH_ONLY", True)
    assert sampling._kernel_probabilities(torch.zeros(8), 1.0, 0, 1.0) is None
    # (SSD_CHAT_SAMPLING, read once as a process starts, sets it)
    assert sampling.torch_only({"SSD_CHAT_SAMPLING": "torch"}) and not sampling.torch_only({})
    assert not sampling.torch_only({"SSD_CHAT_SAMPLING": "kernel"})
