"""Normalisation layers, chosen by name from :data:`NORM` (``ModelConfig.norm``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinklab.registry import Registry

#: name -> class built as ``cls(d_model, eps)``.
NORM: Registry[type[nn.Module]] = Registry("norm")


@NORM.register("rmsnorm")
class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * w, computed in float32 (Zhang & Sennrich 2019; LLaMA)."""

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))  # (d,)

    def forward(self, x: Tensor) -> Tensor:
        """(..., d) -> (..., d), same dtype as x."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


@NORM.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm with a bias: (x - mean) / sqrt(var + eps) * w + b (Ba et al. 2016; GPT-2)."""

    def __init__(self, d: int, eps: float = 1e-5) -> None:
        super().__init__(d, eps=eps)
