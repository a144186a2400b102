"""Token sampling as pure tensor functions with an explicit generator.

On the CPU, `probabilities` and `inverse_cdf` run engine/kernels/sampling.cpp where the kernels build (a row's
distribution in a few passes: about 1 ms a token less at the chat's default temperature 0.2 and top-p 0.9 than the
torch ops below, which stay the reference: CUDA, no kernels, or SSD_CHAT_SAMPLING=torch). The kernel's
probabilities are not torch's bits (its exp and sums differ by an ulp or so, and a near-tie at the nucleus's edge
can fall the other way), but every sampled path of a process takes the same one, which is what exactness needs;
its draws are the torch path's for the same probabilities and uniform.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from engine import coupling
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

# A float32 exp below e^-87 is subnormal, and torch's CPU softmax computes those on a slow path: 0.4-0.7 ms a row of
# 49152 logits at temperature 0.2 (most of the row lies that far below the top) against 0.06 ms. A token e^87 times
# less likely than the top one gets no probability (it had at most 1.6e-38 of it).
SUBNORMAL = -87.0
FLOAT32_TINY = torch.finfo(torch.float32).tiny  # 1.2e-38


def keep_top_k_top_p(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero the tokens outside the top-k and outside the top-p nucleus, and renormalise. probs: [..., V] (rows summing
    to 1) -> [..., V].

    The nucleus keeps a token where the tokens more probable than it hold less than `top_p` of the mass left by the
    top-k (so the top token always stays, and tokens tied with a kept one stay too: no tie is broken by a sort's
    order). Renormalising the kept mass gives the distribution a second softmax over the kept logits would.
    """
    if top_k > 0 and top_k < probs.shape[-1]:
        kth = torch.topk(probs, top_k).values[..., -1:]  # [..., 1]
        probs = torch.where(probs < kth, 0.0, probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if top_p < 1.0:
        probs = torch.where(probs < nucleus_floor(probs, top_p), 0.0, probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def nucleus_floor(probs: torch.Tensor, top_p: float, first: int = 32) -> torch.Tensor:
    """The least probability inside each row's top-p nucleus. probs: [..., V] -> [..., 1].

    It looks at the `first` likeliest tokens, then 8x as many until every row's nucleus ends among them: a full
    sort of 49152 tokens took 4.5 ms a row on one core, the first 32 about 0.2 ms. A row's floor does not depend on
    how many were looked at (a cumulative sum is a scan), so a row batched gets the one it gets alone.
    """
    width = probs.shape[-1]
    m = min(first, width)
    while True:
        top = torch.topk(probs, m).values  # [..., m], descending
        cum = top.cumsum(dim=-1)
        before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # mass ranked before each
        inside = before < top_p  # [..., m] (of tied tokens the first is inside where any is, and sets the floor)
        if m == width or bool((~inside).any(dim=-1).all()):  # every row's nucleus ends inside the m
            return top.masked_fill(~inside, float("inf")).amin(dim=-1, keepdim=True)
        m = min(m * 8, width)


def torch_only(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for torch's ops alone: SSD_CHAT_SAMPLING=torch."""
    return environ.get("SSD_CHAT_SAMPLING", "kernel") == "torch"


TORCH_ONLY = torch_only(os.environ)  # read once, as the process starts (each process of an engine reads it): per
# call it cost 10-15 us a row of a batched step, where a row's sampling is a few us


def _kernels() -> ctypes.CDLL | None:
    """engine/kernels/sampling.cpp's library, or None: no kernels here, or SSD_CHAT_SAMPLING=torch."""
    if TORCH_ONLY:
        return None
    from engine.layers import native  # (torch's own ops only where the engine never loads the kernels)

    return native.library()


def _row_kernels(probs: torch.Tensor) -> ctypes.CDLL | None:
    """`_kernels()` for one float32 CPU row [V] (what `inverse_cdf` and the race take); else None."""
    return _kernels() if probs.dtype == torch.float32 and probs.device.type == "cpu" and probs.dim() == 1 else None


def _kernel_probabilities(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor | None:
    """`probabilities` by the kernel, row by row; None where it does not run (not a float32 CPU tensor, no kernels,
    a top-p that float32 rounds to 1). A row with a NaN or +inf logit, or no finite one, takes torch's path alone
    (which says what is wrong)."""
    usable = logits.dtype == torch.float32 and logits.device.type == "cpu" and logits.dim() >= 1
    lib = _kernels() if usable and logits.shape[-1] > 0 else None
    if lib is None or (top_p < 1.0 and ctypes.c_float(top_p).value >= 1.0):
        return None
    rows = logits.contiguous().view(-1, logits.shape[-1])  # [n, V]
    out = torch.empty_like(rows)
    width, bytes_per_row = rows.shape[1], rows.shape[1] * 4
    top_k = top_k if 0 < top_k < width else 0  # (all of them: no filter)
    src, dst = rows.data_ptr(), out.data_ptr()
    for i in range(rows.shape[0]):
        if lib.sampling_probs(src + i * bytes_per_row, width, temperature, top_k, top_p, dst + i * bytes_per_row):
            out[i] = _torch_probabilities(rows[i], temperature, top_k, top_p)
    return out.view(logits.shape)


def probabilities(logits: torch.Tensor, params: SamplingParams, temperature: float | None = None) -> torch.Tensor:
    """The distribution a request samples from: temperature (`temperature`, where given, in place of the request's:
    a draft's own), then top-k/top-p. [..., V] -> [..., V] (fp32), each row as alone. The largest logit is subtracted
    first, so that a tiny temperature (1e-40) gives the argmax rather than inf / inf; a temperature below float32's
    smallest normal number divides as that number (1e-46 was 0 in float32: 0 / 0 made every logit NaN)."""
    logits = logits.float()  # (amax: max(dim=) also finds the indices, 147 against 9 us over 49152 logits)
    temperature = max(temperature or params.temperature, FLOAT32_TINY)
    fast = _kernel_probabilities(logits, temperature, params.top_k, params.top_p)
    return fast if fast is not None else _torch_probabilities(logits, temperature, params.top_k, params.top_p)


def _torch_probabilities(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """`probabilities` by torch's ops (the reference). [..., V] float32 -> [..., V]."""
    scaled = (logits - logits.amax(dim=-1, keepdim=True)).div_(temperature)
    probs = torch.softmax(F.threshold(scaled, SUBNORMAL, float("-inf")), dim=-1)  # [..., V]
    return keep_top_k_top_p(probs, top_k, top_p)


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from logits [V]: argmax when greedy, else a draw from `probabilities`."""
    if params.is_greedy:
        return int(torch.argmax(logits))
    return draw(probabilities(logits, params), generator)


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs [V] (>= 0, any positive total), by the inverse CDF of one float64 uniform: the same
    distribution as torch.multinomial, which took 1.9 ms a draw over SmolLM2's 49152 tokens on one core (79 us)."""
    u = torch.rand((), generator=generator, dtype=torch.float64)
    return inverse_cdf(probs, u)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> int:
    """The token whose CDF interval [cdf_{i-1}, cdf_i) holds u * total, the CDF summed in float64 (no token's interval
    is off by float32's rounding). probs: [V] >= 0 (float32 or float64), u: [] in [0, 1).

    A token with zero mass has an empty interval, so it is never picked.
    """
    lib = _row_kernels(probs)
    if lib is not None:
        probs = probs.contiguous()
        token = int(lib.sampling_inverse_cdf(probs.data_ptr(), probs.shape[0], float(u)))
        if token >= 0:
            return token  # (else no mass, or not finite: said below)
    cdf = probs.double().cumsum(dim=0)  # [V]
    total = float(cdf[-1])
    if not 0 < total < float("inf"):  # (a NaN fails this too)
        raise RuntimeError(f"cannot sample from a distribution of total mass {total}: the model's logits are not "
                           "finite")
    token = int(torch.searchsorted(cdf, (u * total).view(1).to(cdf.device), right=True))
    if token == probs.shape[0]:
        # u * total rounded up to total (u within 2^-53 of 1): take the last token with mass.
        token = int(torch.nonzero(probs).max())
    return token


def race(probs: torch.Tensor, key: int, position: int, ids: torch.Tensor | None = None) -> int:
    """The index of engine.coupling's race winner in probs [V] (or a compact row [Vr] over token ids [Vr]) at
    `position`."""
    return race_ranked(probs, key, position, ids, 1)[0]


def race_ranked(probs: torch.Tensor, key: int, position: int, ids: torch.Tensor | None, n: int) -> list[int]:
    """The indices of the race's first n finishers (fewer where fewer entries have mass), the winner first: the
    kernel's where it runs (the same ones), else `coupling.ranked`'s."""
    lib = _row_kernels(probs)
    usable_ids = ids is None or (ids.dtype == torch.long and ids.device.type == "cpu" and ids.shape == probs.shape)
    if lib is not None and n > 0 and usable_ids:
        probs = probs.contiguous()
        ids = None if ids is None else ids.contiguous()  # (held here: the kernel reads it)
        out = torch.empty(n, dtype=torch.long)
        count = int(lib.sampling_race(probs.data_ptr(), probs.shape[0], None if ids is None else ids.data_ptr(),
                                      key & coupling.MASK64, position, n, out.data_ptr()))
        if count > 0:
            return out[:count].tolist()  # (else no mass, or not finite: `ranked` says so)
    return coupling.ranked(probs, key, position, ids, n)


def sample_next(logits: torch.Tensor, seq: Sequence) -> int:
    """A request's next token (position len(seq.token_ids)) from its logits [V]: the argmax when greedy, else from
    `probabilities` by the request's sampler (the coupled race where it has a noise key, else a generator's draw)."""
    if seq.noise_key is None:
        return sample_token(logits, seq.params, seq.generator)
    return race(probabilities(logits, seq.params), seq.noise_key, len(seq.token_ids))


def sample_batch(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits: [B, V] -> each request's next token (`sample_next`). Greedy rows share one argmax."""
    if all(s.params.is_greedy for s in seqs):
        return torch.argmax(logits, dim=-1).tolist()
    return [sample_next(row, s) for row, s in zip(logits, seqs, strict=True)]
