"""RMSNorm, with the residual add fused into the same call.

Written out instead of F.rms_norm, which on CPU upcasts and decomposes into about eight kernels; the
order of operations is the one transformers uses, so results agree to the last bits.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D]
        # pow(2).mean(-1) as transformers writes it, minus mean's dtype round trip (same bits)
        variance = x.pow(2).sum(-1, keepdim=True).div_(x.shape[-1])
        return self.weight * (x * torch.rsqrt(variance.add_(self.eps)))

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm transformer's residual stream step."""
        residual = x.add_(residual)
        return self.forward(residual), residual
