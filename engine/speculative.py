"""Verification of a speculative draft against the target: pure tensor functions, one sequence at a time.

The draft proposes K tokens x_1..x_K; the target scores the K+1 positions [last, x_1..x_K] in one
forward pass. Verification returns a ``Verdict`` (k, t*): the first k draft tokens are kept and the
target's own token t* follows them, so every verify step emits k + 1 tokens.

- ``verify_greedy``: keep the longest prefix that matches the target's argmax; t* is the argmax at
  the first mismatch (recovery) or after the last draft token (bonus). Output == greedy AR output.
- ``verify_sampled``: the rejection rule of Leviathan et al. / Chen et al. Keep x_i with probability
  min(1, p_i(x_i) / q_i(x_i)); on the first rejection draw t* from norm(max(0, p_i - q_i)); if all K
  are kept draw the bonus from p_K. The emitted tokens are distributed exactly as target-only sampling,
  for ANY draft q (including one that puts zero mass where p does not).

Random draws: exactly K+1 float64 uniforms from the caller's generator, in one call: u_1..u_K decide
acceptance position by position, u_{K+1} picks t* by inverse CDF. All K+1 are drawn whatever the
outcome, so the generator always advances by the same amount; same generator state and inputs ->
same verdict.

``p`` and ``q`` are the distributions the requests really sample from (after temperature / top-k /
top-p, see ``engine.sampling.probabilities``): the output is exact for that filtered target
distribution, provided q is exactly what the draft sampled its tokens from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling import inverse_cdf

# A residual max(0, p - q) whose mass is below this is rounding noise: p and q agree on the rejected
# position, so a rejection there has probability ~0 and sampling from p is as good as anything.
RESIDUAL_EPS = 1e-6


@dataclass(frozen=True)
class Verdict:
    """Outcome (k, t*) of verifying one sequence's K draft tokens."""

    num_accepted: int  # k in 0..K: the draft tokens kept (always a prefix of the proposal)
    next_token: int  # t*: the target's own token after them, recovery (k < K) or bonus (k == K)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """Greedy verification. draft_tokens: [K] long, target_logits: [K+1, V]."""
    num_draft = _check_shapes(draft_tokens, target_logits)
    target_tokens = torch.argmax(target_logits, dim=-1)  # [K+1]
    matches = target_tokens[:num_draft] == draft_tokens  # [K]
    num_accepted = _leading_true(matches)
    # At the first mismatch the target's argmax is exactly what greedy AR would have emitted there.
    return Verdict(num_accepted, int(target_tokens[num_accepted]))


def verify_sampled(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> Verdict:
    """Exact speculative sampling for one sequence.

    draft_tokens: [K] long, x_i drawn from draft_probs[i]
    draft_probs:  [K, V]   q_i, the distributions the draft tokens were drawn from
    target_probs: [K+1, V] p_i, the target's (filtered) distributions at [last, x_1..x_K]
    """
    num_draft = _check_shapes(draft_tokens, target_probs)
    assert draft_probs.shape == (num_draft, target_probs.shape[-1]), (
        f"draft_probs {tuple(draft_probs.shape)} does not match [K={num_draft}, V={target_probs.shape[-1]}]"
    )
    p = target_probs.double()  # [K+1, V] float64: u * q < p compares tiny masses without rounding
    q = draft_probs.double()  # [K, V]
    index = draft_tokens.long().unsqueeze(-1)  # [K, 1]
    p_draft = p[:num_draft].gather(-1, index).squeeze(-1)  # [K] p_i(x_i)
    q_draft = q.gather(-1, index).squeeze(-1)  # [K] q_i(x_i)
    u = torch.rand(num_draft + 1, generator=generator, dtype=torch.float64, device=p.device)  # [K+1] in [0, 1)
    # u < p/q written as u * q < p: no division, q >= p always accepts, and q == 0 (a token the
    # draft "could not" have drawn) is accepted exactly when the target allows it (p > 0).
    accepted = u[:num_draft] * q_draft < p_draft  # [K]
    num_accepted = _leading_true(accepted)
    # All kept: the bonus comes straight from the target's last position. Else: the residual.
    next_probs = p[num_draft] if num_accepted == num_draft else _residual(p[num_accepted], q[num_accepted])
    next_token = inverse_cdf(next_probs, u[num_draft])
    return Verdict(num_accepted, next_token)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)), the distribution of the recovery token after a rejection. [V], [V] -> [V].

    Acceptance already produced min(p, q) of the mass; the residual supplies exactly the missing
    p - min(p, q), which is why the emitted token ends up distributed as p.
    """
    residual = torch.clamp(p - q, min=0.0)  # [V]
    mass = float(residual.sum())
    if mass < RESIDUAL_EPS:
        return p
    return residual / mass


def _leading_true(mask: torch.Tensor) -> int:
    """Length of the run of True at the start of a [K] bool mask (0 for K == 0)."""
    flags = mask.tolist()  # K is small (a few draft tokens): one transfer, then plain Python
    return flags.index(False) if False in flags else len(flags)


def _check_shapes(draft_tokens: torch.Tensor, target_rows: torch.Tensor) -> int:
    """K, after checking draft_tokens is [K] and the target has K+1 rows of some [V]."""
    assert draft_tokens.dim() == 1, f"draft_tokens must be [K], got {tuple(draft_tokens.shape)}"
    num_draft = draft_tokens.shape[0]
    assert target_rows.dim() == 2 and target_rows.shape[0] == num_draft + 1, (
        f"target rows {tuple(target_rows.shape)} do not match [K+1={num_draft + 1}, V]"
    )
    return num_draft
