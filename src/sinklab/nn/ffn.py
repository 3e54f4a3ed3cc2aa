"""Feed-forward blocks, chosen by name from :data:`FFN` (``ModelConfig.ffn``).

Gated units (Shazeer 2020, "GLU Variants Improve Transformer"):
``down(act(gate(x)) * up(x))``; plain units: ``down(act(up(x)))``. No biases.
Projection names follow LLaMA (``gate_proj``, ``up_proj``, ``down_proj``).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from sinklab.registry import Registry

#: name -> class built as ``cls(d_model, d_ff)``.
FFN: Registry[type[nn.Module]] = Registry("feed-forward block")


class GatedFFN(nn.Module):
    """down(act(gate(x)) * up(x)); x (B, T, d) -> (B, T, d), hidden width d_ff."""

    act: ClassVar[Callable[[Tensor], Tensor]]

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(type(self).act(self.gate_proj(x)) * self.up_proj(x))


class PlainFFN(nn.Module):
    """down(act(up(x))); x (B, T, d) -> (B, T, d), hidden width d_ff."""

    act: ClassVar[Callable[[Tensor], Tensor]]

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(type(self).act(self.up_proj(x)))


@FFN.register("swiglu")
class SwiGLU(GatedFFN):
    """SwiGLU: down(silu(gate x) * up x) (LLaMA)."""

    act = staticmethod(F.silu)


@FFN.register("geglu")
class GeGLU(GatedFFN):
    """GeGLU: down(gelu(gate x) * up x), exact erf GELU."""

    act = staticmethod(F.gelu)


@FFN.register("reglu")
class ReGLU(GatedFFN):
    """ReGLU: down(relu(gate x) * up x)."""

    act = staticmethod(F.relu)


@FFN.register("gelu")
class GELU(PlainFFN):
    """GELU MLP: down(gelu(up x)), exact erf GELU (GPT-2 style, no biases)."""

    act = staticmethod(F.gelu)


@FFN.register("relu")
class ReLU(PlainFFN):
    """ReLU MLP: down(relu(up x)) (original Transformer, no biases)."""

    act = staticmethod(F.relu)


@FFN.register("swish")
class Swish(PlainFFN):
    """Swish (SiLU) MLP: down(silu(up x)), no gate (Gu et al. Table 11's "Swish"; no biases)."""

    act = staticmethod(F.silu)
