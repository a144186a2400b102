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
- ``verify_coupled``: a request sampled by the coupled race (engine.coupling): the target's token at each
  position is its race's winner over p; keep the drafts while they equal it (greedy's rule), t* the winner at
  the first mismatch or after the last draft. Output == the coupled AR output with the same key.

Random draws (``verify_sampled``; ``verify_coupled`` draws none: its noise is keyed by position): exactly K+1
float64 uniforms from the caller's generator, in one call: u_1..u_K decide acceptance position by position,
u_{K+1} picks t* by inverse CDF. All K+1 are drawn whatever the outcome, so the generator always advances by the
same amount; same generator state and inputs -> same verdict (whether p comes as a tensor or as `Rows` computed
when read).

``p`` and ``q`` (the rejection rule's) are the distributions the requests really sample from (after temperature /
top-k / top-p, see ``engine.sampling.probabilities``): the output is exact for that filtered target distribution,
provided q is exactly what the draft sampled its tokens from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.sampling import inverse_cdf, probabilities, race
from engine.sampling_params import SamplingParams

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
    draft_probs: torch.Tensor | Sequence[torch.Tensor],
    target_probs: torch.Tensor | Rows,
    generator: torch.Generator | None,
) -> Verdict:
    """Exact speculative sampling for one sequence.

    draft_tokens: [K] long, x_i drawn from draft_probs[i]
    draft_probs:  [K, V]   q_i, the distributions the draft tokens were drawn from (or K rows [V])
    target_probs: [K+1, V] p_i, the target's (filtered) distributions at [last, x_1..x_K], or `Rows` that
                  compute p_i when read: rows past the first rejection are never read
    """
    num_draft = _check_shapes(draft_tokens, target_probs)
    assert len(draft_probs) == num_draft and all(q.shape == target_probs.shape[-1:] for q in draft_probs), (
        f"draft_probs {[tuple(q.shape) for q in draft_probs]} do not match [K={num_draft}, V={target_probs.shape[-1]}]"
    )
    u = torch.rand(num_draft + 1, generator=generator, dtype=torch.float64).tolist()  # [K+1] in [0, 1)
    for i, x in enumerate(draft_tokens.tolist()):
        p, q = target_probs[i], draft_probs[i]  # [V], [V]
        # u < p/q written as u * q < p in float64 (Python floats): no division, tiny masses compared without
        # rounding, q >= p always accepts, and q == 0 (a token the draft "could not" have drawn) is accepted
        # exactly when the target allows it (p > 0).
        if not u[i] * float(q[x]) < float(p[x]):  # rejected: t* from the residual
            return Verdict(i, inverse_cdf(_residual(p.double(), q.double()), torch.tensor(u[num_draft])))
    # All kept: the bonus comes straight from the target's last position.
    return Verdict(num_draft, inverse_cdf(target_probs[num_draft], torch.tensor(u[num_draft])))


def verify_coupled(draft_tokens: torch.Tensor, target_probs: torch.Tensor | Rows, key: int, position: int) -> Verdict:
    """Verification of a coupled request. draft_tokens: [K] long; target_probs: [K+1, V] p_i (or `Rows`: rows past
    the first mismatch are never read) at positions position + i (position: the committed length)."""
    num_draft = _check_shapes(draft_tokens, target_probs)
    for i, x in enumerate(draft_tokens.tolist()):
        token = race(target_probs[i], key, position + i)
        if token != x:
            return Verdict(i, token)
    return Verdict(num_draft, race(target_probs[num_draft], key, position + num_draft))


class Rows:
    """The target's p_i = probabilities(logits[i]), computed when verification first reads row i (each costs about
    0.1-0.5 ms over 49152 tokens on one CPU core, and rows past the first rejection are never read). A row is
    computed as alone, the bits a batched call gives it."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams):  # logits: [K+1, V]
        self.logits, self.params, self.rows = logits, params, {}
        self.shape = logits.shape

    def dim(self) -> int:
        return self.logits.dim()

    def __getitem__(self, i: int) -> torch.Tensor:  # [V]
        if i not in self.rows:
            self.rows[i] = probabilities(self.logits[i], self.params)
        return self.rows[i]


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
