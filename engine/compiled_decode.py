"""The CPU's compiled decode step: one sequence, one new token, keys in one contiguous run of KV slots.

Eager decode of a small model is bound by per-operation overhead, not by memory: SmolLM2-135M runs about
1,300 aten calls per token, and on the 2-core box they cost ~6 ms of a 23 ms token whose matmuls stream the
weights in ~17 ms. `torch.compile` (inductor, C++ wrapper) turns the whole forward into one call: the
matmuls stay MKL's, the norms, rotary and SiLU*up become fused C++ loops, and only attention's key count
changes from step to step (one symbolic size, so one graph serves every length).

Only the model's own forward is compiled (the LM head and sampling stay eager, as with CUDA graphs).
Anything else (prefill, verification rows, batches, keys in scattered blocks) runs eagerly. A machine
without a working C++ toolchain falls back to eager with one warning, at start-up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, Index, SeqSpan
from engine.attention.sdpa import SdpaBackend, attend

log = logging.getLogger(__name__)

# Dynamo treats the int values 0 and 1 as special (a size-0/1 graph of its own). Offsetting the first key
# slot keeps every traced int >= 2, so one symbolic graph covers all decode steps (num_keys >= 2 always:
# a prompt has at least one token before the new one).
_OFFSET = 2


@dataclass(frozen=True)
class SliceDecode:
    """What the compiled step's attention reads: keys in slots first - _OFFSET .. + num_keys - 1, the last
    of them the new token's (written first)."""

    first: int
    num_keys: int


class SliceSdpa(AttentionBackend):
    """SdpaBackend's decode over one contiguous run of slots, written for tracing (same KV tensors)."""

    name = "sdpa-slice"

    def __init__(self, inner: SdpaBackend):
        self.inner = inner

    def allocate(self, **kwargs) -> None:
        raise AssertionError("SliceSdpa uses its inner backend's KV cache")

    def forward(self, layer, q, k, v, meta: SliceDecode, scale: float) -> torch.Tensor:  # q [1, H, D] -> [1, H*D]
        k_cache, v_cache = self.inner.k[layer], self.inner.v[layer]  # [KVH, S, D]
        start = meta.first - _OFFSET
        k_cache.select(1, start + meta.num_keys - 1).copy_(k[0])
        v_cache.select(1, start + meta.num_keys - 1).copy_(v[0])
        keys = k_cache.narrow(1, start, meta.num_keys).unsqueeze(0)  # [1, KVH, T, D]
        values = v_cache.narrow(1, start, meta.num_keys).unsqueeze(0)
        _, h, d = q.shape
        o = attend(q.view(1, h, 1, d), keys, values, mask=None, causal=False, scale=scale)  # [1, H, 1, D]
        return o.view(1, h * d)


class CompiledDecode:
    """The model forward compiled for single-token decode of one sequence; `handles` says when it applies."""

    def __init__(self, forward: Callable, backend: AttentionBackend, *, device: torch.device):
        """forward(ids [1], positions [1], meta, backend) -> hidden [1, hidden]: the model's forward."""
        self.available = isinstance(backend, SdpaBackend) and torch.device(device).type == "cpu"
        self.backend = SliceSdpa(backend) if self.available else None
        self.device = device
        self.step = torch.compile(forward, fullgraph=True, options={"cpp_wrapper": True})
        self.num_runs = 0  # tests check that the compiled path really ran

    def warm_up(self) -> None:
        """Compile now (start-up), not on the first reply. Writes K/V into slots 0..3 only, before any
        sequence owns them. The second call checks that the graph is symbolic (no recompile)."""
        if not self.available:
            return
        log.info("compiling the decode step (the first run on a machine takes about a minute, later ones load it)")
        try:
            # both ints symbolic from the first compile (`attn` is CausalLM.forward's parameter name)
            with torch.compiler.config.patch(dynamic_sources="L['attn'].first,L['attn'].num_keys"):
                for first, num_keys in ((0, 2), (1, 3)):
                    self._run([0], torch.tensor([num_keys - 1]), first, num_keys)
        except Exception as e:  # no C++ compiler, an inductor bug: the eager path is always there
            log.warning("compiled decode unavailable, running eager (%s: %s)", type(e).__name__, str(e)[:200])
            self.available = False
        self.num_runs = 0

    def handles(self, write_slots: list[int] | Index, spans: list[SeqSpan]) -> bool:
        if not self.available or len(spans) != 1:
            return False
        span = spans[0]
        keys = span.key_slots
        return (span.q_len == 1 and span.mask is None and isinstance(keys, slice) and span.num_keys >= 2
                and isinstance(write_slots, slice) and write_slots.start == keys.stop - 1)

    def run(self, ids: list[int], positions: torch.Tensor, span: SeqSpan) -> torch.Tensor:  # -> [1, hidden]
        return self._run(ids, positions, span.key_slots.start, span.num_keys)

    def _run(self, ids: list[int], positions: torch.Tensor, first: int, num_keys: int) -> torch.Tensor:
        self.num_runs += 1
        return self.step(torch.tensor(ids), positions, SliceDecode(first + _OFFSET, num_keys), self.backend)
