"""RMSNorm, with the residual add fused into the same call.

y = w * x / sqrt(mean(x^2) + eps), in the order transformers computes it. A single row (decode) takes
a shorter route: its mean square is one dot product and its scale a Python float, three kernels
instead of eight. On a 2-core CPU, SmolLM2 runs 61 norms per token and each kernel launch costs a
few microseconds once the weights have streamed through the caches (measured: 1.6 ms per token for
the eight-kernel form).
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
        if x.dim() == 2 and x.shape[0] == 1 and x.device.type == "cpu" and not torch.compiler.is_compiling():
            # float() syncs a GPU and breaks a traced graph: eager CPU only
            row = x[0]
            inv_rms = (float(torch.dot(row, row)) / row.shape[0] + self.eps) ** -0.5
            return x * (self.weight * inv_rms)
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm transformer's residual stream step."""
        residual = x.add_(residual)
        return self.forward(residual), residual
