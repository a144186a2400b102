"""RMSNorm, with the residual add fused into the same call."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., D]
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): the pre-norm transformer's residual stream step."""
        residual = x.add_(residual)
        return F.rms_norm(residual, self.weight.shape, self.weight, self.eps), residual
