"""RMSNorm, with the residual add fused into the same call.

y = w * (x / sqrt(mean(x^2) + eps)). On a CPU where the panel kernels build (AVX-512 or AVX2), every float32 norm, eager
or inside a compiled step (as the op ``ssd_chat::rms_norm``), runs engine/kernels/rms_norm.cpp: one call per
norm, and each row reduced by the same code whatever the row count, so a row's output is the same bits in a
one-row decode step as in a k + 1-row verify. (The eager one-row shortcut this replaced, a dot product and a
Python float scale, gave other bits than the several-row formula: a verify's hidden states could differ from
plain decoding's by an ulp.) Elsewhere torch's formula, the same for every row count.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.layers import native, panel


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D]
        if x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32 and panel.ready():
            if torch.compiler.is_compiling():
                return rms_norm_op(x, self.weight, self.eps)
            return rms_norm(x, self.weight, self.eps)
        # in float32, as transformers' LlamaRMSNorm: a half hidden state's squares overflow (SmolLM2's residual stream
        # reaches 7,000 on a chat prompt: 5e7 > float16's 65,504), which made the norm 0 and every --dtype float16
        # reply token 0
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm transformer's residual stream step."""
        residual = x.add_(residual)
        return self.forward(residual), residual


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] float32 (CPU) -> its RMSNorm by the kernel (panel.ready() first)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    native.library().rms_norm(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], weight.contiguous().data_ptr(),
                              eps, y.data_ptr())
    return y


@torch.library.custom_op("ssd_chat::rms_norm", mutates_args=())
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` as one opaque op, for compiled steps: the same bits as eager."""
    return rms_norm(x, weight, eps)


@rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)
