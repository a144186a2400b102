"""A model's decoder layers in one kernel call (engine/kernels/layer.cpp) for the few-row steps of one sequence.

An eager one-row step of SmolLM2-135M spends about a fifth of its time in Python: some twenty torch calls per layer
around the kernels that do the work (norms, panel GEMMs, row attention). ``decoder_layers`` runs every layer's
residual add, input norm, qkv product, rotary, cache write, attention, o product, residual add, post-attention norm,
gate/up product, silu times up and down product in one call, with the eager forward's kernels and roundings, so its
outputs are the eager path's bits (tests/engine/test_fused.py: logits equal to the bit). Its silu is torch's bits
where ``silu_matches`` finds it so (x86 builds of torch use SLEEF's exp, which layer.cpp copies) and torch's silu
would run its vectorized exp on every value (``whole``); elsewhere, or where a down product runs another kernel, each
layer's front half is one call (``layer_front``) and torch's silu and the down product run in Python.

It takes a step only where every piece of it is what the eager forward would run: a CPU float32 model on one rank
whose layers have no biases or q/k norms and whose products run the panel kernels at this row count, one
causal span of at most ``ROW_KERNEL_ROWS`` rows over contiguous cache slots, written to contiguous slots, on the
SDPA backend, outside torch.compile. Anything else runs the eager layers. ``SSD_CHAT_FUSED=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionMetadata
from engine.attention.sdpa import KERNEL_CACHE_DTYPES, ROW_KERNEL_ROWS, SdpaBackend
from engine.layers import native, packed, panel
from engine.layers.rotary import apply_rotary

ENABLED = os.environ.get("SSD_CHAT_FUSED", "1") != "0"
log = logging.getLogger(__name__)


class _Weight(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_long), ("n", ctypes.c_long), ("k", ctypes.c_long),
                ("a", ctypes.c_void_p), ("b", ctypes.c_void_p), ("c", ctypes.c_void_p)]


class _Layer(ctypes.Structure):  # layer.cpp's Layer, field for field
    _fields_ = [("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("norm1", ctypes.c_void_p),
                ("norm2", ctypes.c_void_p), ("eps", ctypes.c_float), ("k_cache", ctypes.c_void_p),
                ("v_cache", ctypes.c_void_p), ("down", _Weight), ("kv_half", ctypes.c_long)]


# layer.cpp's Weight.kind
KINDS = {"panel_gemm": 0, "panel4_gemm": 4, "panel4q8_gemm": 5, "panel8_gemm": 8, "panel8q8_gemm": 9}


def _weight(module: nn.Module, rows: int, held: list[torch.Tensor]) -> _Weight | None:
    """The ctypes view of a linear module's panels, when the eager path would run them at ``rows`` rows (the
    tensors it points into are added to ``held``)."""
    if not packed.runs_panels(module, rows):
        return None
    kernel, tensors = packed.panel_operands(module.packed)
    if not all(t.is_contiguous() for t in tensors):
        return None
    held.extend(tensors)
    return _Weight(KINDS[kernel], *module.weight.shape, *(t.data_ptr() for t in tensors), *[None] * (3 - len(tensors)))


class FusedLayers:
    """The ctypes descriptions of a model's layers (one per row count), built on first use. They hold raw
    addresses: ``held`` keeps every tensor they point into alive, and a re-allocated cache (the backend's new
    lists of tensors) drops them all."""

    def __init__(self, model: nn.Module, backend: SdpaBackend):
        self.model, self.backend = model, backend
        self.plans: dict[int, ctypes.Array | None] = {}
        self.held: list[torch.Tensor] = []
        self.caches: tuple[list, list] | None = None

    def plan(self, rows: int) -> ctypes.Array | None:
        """The layers' descriptions for steps of ``rows`` rows (their down products filled in where the whole layer
        runs in C: ``whole``), or None where the eager layers must take such steps."""
        if self.caches is None or self.caches[0] is not self.backend.k or self.caches[1] is not self.backend.v:
            self.plans, self.held, self.caches = {}, [], (self.backend.k, self.backend.v)  # (allocate: new lists)
        if rows not in self.plans:
            self.plans[rows] = self._build(rows)
        return self.plans[rows]

    def _build(self, rows: int) -> ctypes.Array | None:
        first = self.model.model.layers[0].self_attn
        if first.head_dim % 32 or self.model.args.hidden_size % 16:  # layer.cpp's rotary and adds: whole vectors
            return None
        if not rotary_matches():
            return None
        layers = []
        for i, layer in enumerate(self.model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            weights = [_weight(m, rows, self.held) for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj)]
            if any(w is None for w in weights) or attn.q_norm is not None:
                return None
            norms = (layer.input_layernorm, layer.post_attention_layernorm)
            if any(nm.eps != norms[0].eps for nm in norms):
                return None
            tensors = [norms[0].weight, norms[1].weight, self.backend.k[i], self.backend.v[i]]
            if not all(t.is_contiguous() for t in tensors):
                return None
            self.held.extend(tensors)
            layers.append(_Layer(*weights, tensors[0].data_ptr(), tensors[1].data_ptr(), norms[0].eps,
                                 tensors[2].data_ptr(), tensors[3].data_ptr(), self._down(mlp, rows),
                                 tensors[2].dtype == torch.float16))
        if any(layer.down.a is None for layer in layers):  # whole layers everywhere, or nowhere
            for layer in layers:
                layer.down = _Weight()
        return (_Layer * len(layers))(*layers)

    def _down(self, mlp: nn.Module, rows: int) -> _Weight:
        """The down product's weight where layer.cpp can run the MLP's back half as the eager forward would (silu
        with torch's bits, the down product on the panels), else an empty one (that half stays in Python)."""
        intermediate = mlp.down_proj.weight.shape[1]
        down = _weight(mlp.down_proj, rows, self.held) if intermediate % SILU_RUN == 0 and silu_matches() else None
        return down or _Weight()


# F.silu runs torch's vectorized exp on whole runs of 2 vectors (AVX-512: 32 floats) of each contiguous stretch and
# libm's expf on what is left; at GRAIN values or more it splits them over threads, at points of its own. So its bits
# are silu_mul's where every row is whole runs (I % SILU_RUN == 0) and it does not split: one thread or few values.
SILU_RUN, GRAIN = 32, 32768


def whole(plan: ctypes.Array, rows: int, threads: int) -> bool:
    """Whether ``plan``'s layers run whole in C (silu and the down product included) for a step of ``rows`` rows
    on ``threads`` threads."""
    return plan[0].down.a is not None and (threads == 1 or rows * plan[0].down.k < GRAIN)


@functools.cache
def silu_matches() -> bool:
    """Whether layer.cpp's silu_mul gives F.silu(gate).mul_(up)'s bits here (it copies SLEEF's expf, which torch's
    x86 builds use); checked once, on values over exp's whole range and its edges, 8192 of them (whole runs: see
    SILU_RUN). If not, silu stays in Python."""
    g = torch.Generator().manual_seed(0)
    gate = torch.cat([torch.randn(4016, generator=g) * 30, torch.linspace(-110, 110, 4096),
                      torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7, 103.9, -103.9, 100.1, -100.1] * 8)])
    gate_up = torch.stack([gate, torch.randn(gate.shape[0], generator=g)])  # rows: gate, up ([1, 2 I])
    out = torch.empty(gate.shape[0])
    native.library().silu_mul(gate_up.data_ptr(), 1, gate.shape[0], out.data_ptr())
    same = torch.equal(out, F.silu(gate_up[0]).mul_(gate_up[1]))
    if not same:
        log.warning("this torch build's silu is not engine/kernels/layer.cpp's: the MLPs' back halves stay in Python")
    return same


@functools.cache
def rotary_matches() -> bool:
    """Whether layer.cpp's rotary gives torch's bits here (it copies how this torch build rounds addcmul: the
    product x * cos, then one FMA); checked once, on random rows. If not, the eager layers take every step."""
    g = torch.Generator().manual_seed(0)
    x, cos, sin = (torch.randn(3, 4, 64, generator=g) for _ in range(3))
    cos, sin = cos[:, :1].contiguous(), sin[:, :1].contiguous()
    out = torch.empty_like(x)
    native.library().rotary_rows(x.data_ptr(), 3, 4, 64, 4 * 64, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                                 4 * 64)
    same = torch.equal(out, apply_rotary(x, cos, sin))
    if not same:
        log.warning("this torch build rounds rotary otherwise than engine/kernels/layer.cpp: fused layers off")
    return same


def applies(model: nn.Module, h: torch.Tensor, attn: AttentionMetadata, backend: object) -> bool:
    """Whether this step is one ``forward`` can take (see the module's doc); the weights are checked by ``plan``."""
    if not ENABLED or torch.compiler.is_compiling() or not isinstance(backend, SdpaBackend):
        return False
    if h.device.type != "cpu" or h.dtype != torch.float32 or model.tp.size != 1 or not panel.ready():
        return False
    if len(attn.spans) != 1 or not _within(attn.slot_mapping, h.shape[0], backend.k[0].shape[1]):
        return False
    span = attn.spans[0]
    return (span.mask is None and _within(span.key_slots, span.num_keys, backend.k[0].shape[1]) and span.q_start == 0
            and span.q_len == h.shape[0] <= ROW_KERNEL_ROWS and backend.k[0].dtype in KERNEL_CACHE_DTYPES)


def _within(slots: object, count: int, num_slots: int) -> bool:
    """Whether ``slots`` is a plain slice of ``count`` slots inside the cache (the kernel writes and reads them
    unchecked, where the eager path's views would raise)."""
    return (isinstance(slots, slice) and slots.step in (None, 1) and slots.start is not None
            and slots.start >= 0 and slots.stop == slots.start + count <= num_slots)


def forward(fused: FusedLayers, plan: ctypes.Array, h: torch.Tensor, attn: AttentionMetadata, cos: torch.Tensor,
            sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager forward's loop over layers, in one call (or each layer's front half in one): (last MLP output,
    residual). h: [n, hidden] embeddings; cos, sin: [n, 1, D] (the rotary tables at the rows' positions)."""
    lib = native.library()
    n, hidden = h.shape
    attention = fused.model.model.layers[0].self_attn
    span, write = attn.spans[0], attn.slot_mapping
    shape = (attention.num_heads, attention.num_kv_heads, attention.head_dim)
    cos, sin = cos.reshape(n, shape[2]).contiguous(), sin.reshape(n, shape[2]).contiguous()
    cache = (fused.backend.k[0].shape[1], write.start, span.key_slots.start, span.num_keys, attention.scale)
    residual, threads = torch.empty(n, hidden, dtype=torch.float32), torch.get_num_threads()
    if whole(plan, n, threads):
        h, out = h.contiguous(), torch.empty(n, hidden, dtype=torch.float32)
        status = lib.decoder_layers(plan, len(plan), n, h.data_ptr(), residual.data_ptr(), out.data_ptr(), hidden,
                                    *shape, cos.data_ptr(), sin.data_ptr(), *cache, threads)
        if status == 2:
            raise RuntimeError("engine/kernels/layer.cpp: a layer without its down product")
        if status:
            raise MemoryError("engine/kernels/layer.cpp: no memory for a step's scratch buffers")
        return out, residual
    gate_up = torch.empty(n, plan[0].gate_up.n, dtype=torch.float32)
    for i, layer in enumerate(fused.model.model.layers):
        h = h.contiguous()
        if lib.layer_front(ctypes.byref(plan[i]), n, h.data_ptr(), residual.data_ptr(), int(i > 0), hidden, *shape,
                           cos.data_ptr(), sin.data_ptr(), *cache, gate_up.data_ptr(), threads):
            raise MemoryError("engine/kernels/layer.cpp: no memory for a step's scratch buffers")
        gate, up = gate_up.chunk(2, dim=-1)
        h = layer.mlp.down_proj.forward(F.silu(gate).mul_(up))
    return h, residual
