"""Coupled sampling: the token at position n is the winner of an exponential race keyed by (key, n), not a draw from
a generator's state.

A sampled request has a key (its seed). Each token i of the vocabulary gets, at position n, the exponential noise
E_i = -log u(key, n, i), u a uniform in (0, 1) hashed from the three numbers (SplitMix64's output function over the
counter n * 2^32 + i, started at the key). The token emitted at n is argmax_i p_i / E_i over the tokens with mass: an
exact draw from p (P(argmin_i E_i / p_i = j) = p_j for independent exponentials), and independent of every earlier
position's noise, so a reply is distributed exactly as sampling token by token from the target.

Because the noise is a function of (key, n, i) alone, a speculative mode proposes the same race run over the draft's
q (its winner is the target's whenever the two races agree), and verification keeps a draft token exactly where it
equals the target's own winner: greedy's rule, with no q rows and no residual. So a seeded reply is the same in AR,
SD and SSD, whatever k the timings pick, and SSD's cache keys on the recovery token as greedy's does (the fan-out:
the draft's next winners). Per token, the race's agreement was the rejection rule's sum(min(p, q)) at the chat's
default (0.404 against 0.405) and 6% below it at temperature 0.7 (docs/distill-experiments.md, "Gumbel coupling").

engine.sampling.race runs the race, in engine/kernels/sampling.cpp on the CPU (`sampling_race`); `ranked` here is
the reference (CUDA's rows are sampled on the CPU too), and gives the same winners.
"""

from __future__ import annotations

import torch

GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's constants
MASK64 = (1 << 64) - 1  # a key is taken modulo 2^64


def _signed(c: int) -> int:
    """A 64-bit constant as torch's int64 holds it (two's complement; its products wrap modulo 2^64)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shift(z: torch.Tensor, n: int) -> torch.Tensor:
    """z >> n as unsigned 64-bit numbers (int64's own >> copies the sign bit)."""
    return (z >> n) & ((1 << (64 - n)) - 1)


def noise_bits(key: int, position: int, tokens: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output for the counters position * 2^32 + token, from the state `key`. tokens: [n] int64 ->
    [n] int64 (the 64 bits)."""
    z = _signed(key & MASK64) + _signed(GOLDEN) * ((position << 32) | tokens)
    z = (z ^ _shift(z, 30)) * _signed(MIX1)
    z = (z ^ _shift(z, 27)) * _signed(MIX2)
    return z ^ _shift(z, 31)


def exponentials(key: int, position: int, tokens: torch.Tensor) -> torch.Tensor:
    """E_i = -log u_i, u_i = (top 52 bits + 1/2) / 2^52, exactly, in (0, 1). tokens: [n] -> [n] float64 > 0."""
    u = (_shift(noise_bits(key, position, tokens), 12).double() + 0.5) * 2.0**-52
    return -torch.log(u)


def ranked(probs: torch.Tensor, key: int, position: int, ids: torch.Tensor | None, n: int) -> list[int]:
    """The indices of the race's first n finishers (fewer where fewer entries have mass), the winner first. probs:
    [V] (or [Vr] over ids)."""
    probs = probs.cpu()  # (the noise is computed on the CPU)
    total = float(probs.double().sum())
    if not 0 < total < float("inf"):  # (a NaN fails this too)
        raise RuntimeError(f"cannot sample from a distribution of total mass {total}: the model's logits are not "
                           "finite")
    index = torch.nonzero(probs > 0).flatten()  # [m] entries with mass
    tokens = index if ids is None else ids.cpu()[index]
    scores = probs[index].double() / exponentials(key, position, tokens.long())  # [m]
    # (a stable descending sort: of equal scores the lower index first, as argmax and the kernel pick)
    order = torch.sort(scores, descending=True, stable=True).indices[:n]
    return index[order].tolist()
