"""The CPU's compiled decode step: one sequence, one new token, keys in one contiguous run of KV slots.

Eager decode of a small model is bound by per-operation overhead, not by memory: SmolLM2-135M runs about
1,300 aten calls per token, and on the 2-core box they cost ~6 ms of a 23 ms token whose matmuls stream the
weights in ~17 ms. `torch.compile` (inductor, C++ wrapper) turns the whole forward into one call: the
matmuls are MKL's (or the panel kernel as one op: engine.layers.panel.linear_op), the norms, rotary and
SiLU*up become fused C++ loops, and only attention's key count changes from step to step (one symbolic size,
so one graph serves every length).

Only the model's own forward is compiled (the LM head and sampling stay eager, as with CUDA graphs). With
`rows`, a second graph runs several causal query rows of one sequence (verification, prefill, a draft's
catch-up). Batches, masked rows (SSD branches) and keys in scattered blocks run eagerly. A machine without a
working C++ toolchain, or a compile that fails later, falls back to eager with one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, Index, SeqSpan
from engine.attention.sdpa import SdpaBackend, attend, causal_rows, read_cache, row_kernel
from engine.layers import panel

log = logging.getLogger(__name__)

# Dynamo treats the int values 0 and 1 as special (a size-0/1 graph of its own). Offsetting the first key
# slot keeps every traced int >= 2, so one symbolic graph covers all decode steps (num_keys >= 2 always:
# a prompt has at least one token before the new one).
_OFFSET = 2


@dataclass(frozen=True)
class SliceDecode:
    """What the compiled step's attention reads: keys in slots first - _OFFSET .. + num_keys - 1, the last
    q of them the new tokens' (written first); query row i sees keys 0 .. num_keys - q + i (causal)."""

    first: int
    num_keys: int


class SliceSdpa(AttentionBackend):
    """SdpaBackend's causal attention for one sequence over one contiguous run of slots, written for tracing
    (same KV tensors)."""

    name = "sdpa-slice"

    def __init__(self, inner: SdpaBackend):
        self.inner = inner

    def allocate(self, **kwargs) -> None:
        raise AssertionError("SliceSdpa uses its inner backend's KV cache")

    def forward(self, layer, q, k, v, meta: SliceDecode, scale: float) -> torch.Tensor:  # q [N, H, D] -> [N, H*D]
        k_cache, v_cache = self.inner.k[layer], self.inner.v[layer]  # [KVH, S, D]
        n, h, d = q.shape
        start, t = meta.first - _OFFSET, meta.num_keys
        k_cache.narrow(1, start + t - n, n).copy_(k.transpose(0, 1))
        v_cache.narrow(1, start + t - n, n).copy_(v.transpose(0, 1))
        if row_kernel(q, k_cache):  # the eager path's op: each row the same bits at any row count
            return causal_rows(q, k_cache, v_cache, slice(start, start + t), t, scale)
        keys = read_cache(k_cache, slice(start, start + t), q.dtype)  # [1, KVH, T, D]
        values = read_cache(v_cache, slice(start, start + t), q.dtype)
        if n == 1:  # decode: the one query sees every key
            return attend(q.view(1, h, 1, d), keys, values, mask=None, causal=False, scale=scale).view(1, h * d)
        rows = torch.arange(n, device=q.device).unsqueeze(1) + (t - n)
        mask = torch.arange(t, device=q.device).unsqueeze(0) <= rows  # [N, T]
        o = attend(q.transpose(0, 1).unsqueeze(0), keys, values, mask=mask, causal=False, scale=scale)  # [1, H, N, D]
        return o[0].transpose(0, 1).reshape(n, h * d)


class CompiledDecode:
    """The model forward compiled for one sequence whose keys lie in one run of slots: single-token decode
    (one graph) and, with `rows`, several causal query rows (verification, a draft's catch-up, prefill: a
    second graph, the row count symbolic too). `handles` says when it applies."""

    def __init__(self, forward: Callable, backend: AttentionBackend, *, device: torch.device, rows: bool = False):
        """forward(ids [N], positions [N], meta, backend) -> hidden [N, hidden]: the model's forward."""
        self.available = isinstance(backend, SdpaBackend) and torch.device(device).type == "cpu"
        self.rows = rows
        self.backend = SliceSdpa(backend) if self.available else None
        torch.compiler.assume_constant_result(panel.ready)  # marks the function itself (see panel.ready)
        self.step = torch.compile(forward, fullgraph=True, options={"cpp_wrapper": True}) if self.available else None
        self.num_runs = 0  # tests check that the compiled path really ran
        # Every model in the process shares CausalLM.forward's graph cache: a target and a draft take 2 graphs each
        dynamo_config = torch._dynamo.config
        dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 32)

    def warm_up(self) -> None:
        """Compile now (start-up), not on the first reply. Writes K/V into slots 0..5 only, before any
        sequence owns them. The second call of each shape checks that the graph is symbolic (no recompile)."""
        if not self.available:
            return
        log.info("compiling the decode step (the first run on a machine takes about a minute, later ones load it)")
        shapes = ((1, 0, 2), (1, 1, 3)) + (((2, 0, 4), (3, 1, 5)) if self.rows else ())
        try:
            # the slot ints symbolic from the first compile (`attn` is CausalLM.forward's parameter name)
            with torch.compiler.config.patch(dynamic_sources="L['attn'].first,L['attn'].num_keys"):
                for n, first, num_keys in shapes:
                    self._run([0] * n, torch.arange(num_keys - n, num_keys), first, num_keys)
        except Exception as e:  # no C++ compiler, an inductor bug: the eager path is always there
            self._give_up(e)
        self.num_runs = 0

    def _give_up(self, e: Exception) -> None:
        log.warning("compiled decode unavailable, running eager (%s: %s)", type(e).__name__, str(e)[:200])
        self.available = False

    def handles(self, write_slots: list[int] | Index, spans: list[SeqSpan]) -> bool:
        if not self.available or len(spans) != 1:
            return False
        span = spans[0]
        keys, n = span.key_slots, span.q_len
        if span.mask is not None or not isinstance(keys, slice) or not isinstance(write_slots, slice):
            return False
        writes_last = (write_slots.start, write_slots.stop) == (keys.stop - n, keys.stop)
        # Rows written from slot 0 (a fresh engine's first prefill) would need a graph of their own: the
        # several-row graph assumes a positive write offset (an inductor guard), so they run eagerly.
        rows_ok = n == 1 or (self.rows and write_slots.start > 0)
        return writes_last and keys.stop - keys.start == span.num_keys >= 2 and rows_ok

    def run(self, ids: list[int], positions: torch.Tensor, span: SeqSpan) -> torch.Tensor | None:  # [N, hidden]
        """The hidden states, or None when compiling a new graph failed (from then on the runner runs eager;
        running the step again eagerly is safe: it rewrites the same KV slots)."""
        try:
            return self._run(ids, positions, span.key_slots.start, span.num_keys)
        except Exception as e:  # a recompile that fails, the recompile limit
            self._give_up(e)
            return None

    def _run(self, ids: list[int], positions: torch.Tensor, first: int, num_keys: int) -> torch.Tensor:
        self.num_runs += 1
        ids_t = torch.tensor(ids)
        if len(ids) > 1:  # several rows: their count symbolic (>= 2), one graph for all
            torch._dynamo.mark_dynamic(ids_t, 0)
            torch._dynamo.mark_dynamic(positions, 0)
        return self.step(ids_t, positions, SliceDecode(first + _OFFSET, num_keys), self.backend)
