"""Llama-3.x and Qwen3 decoder-only models (Qwen3 = Llama + RMSNorm on q and k per head).

Parameter names mirror Hugging Face checkpoints, except that q/k/v and gate/up are fused;
``PACKED`` maps checkpoint names onto the fused parameters. Every layer takes a tensor-parallel
rank and size. Per layer the decode step runs: rms_norm, qkv matmul, rope, attention, o matmul,
add+rms_norm, gate_up matmul, silu*up, down matmul.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, AttentionMetadata
from engine.errors import UnsupportedArchitectureError
from engine.layers import fused, greedy_head
from engine.layers.embedding import ParallelLMHead, ReducedLMHead, VocabParallelEmbedding
from engine.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from engine.layers.norm import RMSNorm
from engine.layers.parallel import SINGLE, TensorParallel
from engine.layers.rotary import RotaryEmbedding, apply_rotary
from engine.models.args import ModelArgs

# checkpoint name fragment -> (our fused parameter fragment, shard id)
PACKED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@dataclass(frozen=True)
class ForwardContext:
    """What every layer of one forward pass needs besides its input."""

    attn: AttentionMetadata
    backend: AttentionBackend
    cos: torch.Tensor  # [N, 1, D]
    sin: torch.Tensor  # [N, 1, D]


class SelfAttention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, tp: TensorParallel):
        super().__init__()
        self.layer = layer
        self.head_dim = args.head_dim
        self.qkv_proj = QKVParallelLinear(
            args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, bias=args.attention_bias, tp=tp
        )
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.o_proj = RowParallelLinear(
            args.num_heads * args.head_dim, args.hidden_size, bias=args.attention_bias, tp=tp
        )
        self.scale = args.head_dim**-0.5
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # [N, hidden]
        n, d, h = x.shape[0], self.head_dim, self.num_heads
        qkv = self.qkv_proj.forward(x)  # [N, (H + 2 KVH) D]  (.forward: skip nn.Module hooks in the hot loop)
        qk, v = qkv.split([(h + self.num_kv_heads) * d, self.num_kv_heads * d], dim=-1)
        qk, v = qk.view(n, -1, d), v.view(n, -1, d)  # [N, H + KVH, D], [N, KVH, D]
        if self.q_norm is None:  # rotate q and k in one go
            qk = apply_rotary(qk, ctx.cos, ctx.sin)
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = apply_rotary(self.q_norm.forward(qk[:, :h]), ctx.cos, ctx.sin)
            k = apply_rotary(self.k_norm.forward(qk[:, h:]), ctx.cos, ctx.sin)
        o = ctx.backend.forward(self.layer, q, k, v, ctx.attn, self.scale)  # [N, H D]
        return self.o_proj.forward(o)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs, tp: TensorParallel):
        super().__init__()
        size = args.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(args.hidden_size, [size, size], bias=args.mlp_bias, tp=tp)
        self.down_proj = RowParallelLinear(size, args.hidden_size, bias=args.mlp_bias, tp=tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj.forward(x).chunk(2, dim=-1)  # 2 x [N, I]
        return self.down_proj.forward(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int, tp: TensorParallel):
        super().__init__()
        self.self_attn = SelfAttention(args, layer, tp)
        self.mlp = MLP(args, tp)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            h, residual = self.input_layernorm.forward(x), x
        else:
            h, residual = self.input_layernorm.add_forward(x, residual)
        h = self.self_attn.forward(h, ctx)
        h, residual = self.post_attention_layernorm.add_forward(h, residual)
        return self.mlp.forward(h), residual


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs, tp: TensorParallel):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, tp=tp)
        self.layers = nn.ModuleList(DecoderLayer(args, i, tp) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, args: ModelArgs, *, max_positions: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.args = args
        self.tp = tp
        self.model = Backbone(args, tp)
        if args.reduced_head:
            if args.tie_word_embeddings or tp.size > 1:
                raise UnsupportedArchitectureError("a reduced head needs an untied head and a single rank (a draft)")
            self.lm_head = ReducedLMHead(args.vocab_size, args.hidden_size)
        else:
            self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, tp=tp)
        if args.tie_word_embeddings and not args.reduced_head:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = RotaryEmbedding(args.head_dim, max_positions, args.rope)

    @property
    def num_kv_heads_local(self) -> int:
        return self.model.layers[0].self_attn.num_kv_heads

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata, backend: AttentionBackend
    ) -> torch.Tensor:  # [N] -> [N, hidden]
        h, residual = self.model.embed_tokens.forward(input_ids), None
        cos, sin = self.rotary.lookup(positions, h.dtype)
        plan = self._fused_plan(h, attn, backend) if fused.applies(self, h, attn, backend) else None
        if plan is not None:  # a few-row step of one sequence: its layers in one kernel call (fused.py)
            h, residual = fused.forward(self._fused, plan, h, attn, cos, sin)
        else:
            ctx = ForwardContext(attn, backend, cos, sin)
            for layer in self.model.layers:
                h, residual = layer.forward(h, residual, ctx)
        h, _ = self.model.norm.add_forward(h, residual)
        return h

    def _fused_plan(self, h: torch.Tensor, attn: AttentionMetadata, backend: AttentionBackend) -> ctypes.Array | None:
        """engine.layers.fused's plan for this step's row count (None: the eager layers take it)."""
        if getattr(self, "_fused", None) is None or self._fused.backend is not backend:
            self._fused = fused.FusedLayers(self, backend)
        return self._fused.plan(h.shape[0])

    def compute_logits(
        self, hidden: torch.Tensor, greedy: bool = False, compact: bool = False
    ) -> torch.Tensor:  # [M, hidden] -> [M, V]
        """greedy: only each row's argmax is used (engine.layers.greedy_head may then skip most of the head).
        compact: a reduced head's scores [M, Vr] over its `vocab_ids` (a draft's: engine.drafter)."""
        if compact and isinstance(self.lm_head, ReducedLMHead):
            return self.lm_head(hidden, compact=True)
        if greedy:
            screened = greedy_head.logits(self.lm_head, hidden)
            if screened is not None:
                return screened
        return self.lm_head(hidden)
