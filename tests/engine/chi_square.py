"""Chi-square goodness-of-fit for the sampling tests (test_speculative*, test_spec_step_exact,
test_draft_process_exact), and the random distributions they draw from.

Every generator is seeded, so each test is deterministic; the thresholds say how unlikely a correct sampler is to
fail for an arbitrary seed: a correct verifier is accepted when the p-value exceeds ``P_PASS`` (false failure rate
1e-6 per test), and a deliberately broken one must land below ``P_BROKEN`` (which it misses by many orders of
magnitude).
"""

from __future__ import annotations

import torch

P_PASS = 1e-6
P_BROKEN = 1e-9
MIN_EXPECTED = 5.0  # chi-square needs ~5 expected counts per cell; rarer cells are pooled into one


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
