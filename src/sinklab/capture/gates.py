"""The output gates of gated ``transformers`` attention, read for the ``attn.gate`` hook site (one owner).

Some model types multiply each head's attention output by a sigmoid gate before the output projection
(Qiu et al. 2025, *Gated Attention for Large Language Models*: head-wise or element-wise gates; Qwen3-Next).
``transformers`` keeps the gate in a local variable of the attention module's ``forward``, so no module hook
sees it. :data:`GATES` holds, per model type, a reader ``reader(attn, hidden_states) -> gate | None`` that
computes exactly the tensor the model multiplies by, from the attention module ``attn`` and the
``hidden_states`` (B, T, d) it was called with, through the module's own projections and parameters: gate
(B, H, T, G) (G = 1 head-wise, G = the head's value width element-wise), or None when this module has no
gate (a config that switches it off). The HF seam (:class:`sinklab.capture.hf.HFSeam`) calls the reader in a
forward pre-hook of every attention module, before the attention, and runs the ``attn.gate`` hooks and the
recorder on its result (read-only: the model computes its own gate). ``tests/test_gate_weighted.py`` checks
every reader against the model's own product (the output projection's input divided by the attention
output, in float64) and that :data:`sinklab.capture.families.GATED_TYPES` minus the refused types is exactly
the set of types here.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from sinklab.registry import Registry

#: model type -> ``reader(attn_module, hidden_states (B, T, d)) -> (B, H, T, G) | None``
GATES: Registry[Callable[[nn.Module, Tensor], Tensor | None]] = Registry("gated attention type")


def _qwen3_next(attn: nn.Module, x: Tensor) -> Tensor:
    """Qwen3-Next / Qwen3.5: ``q_proj`` gives each head's query and gate side by side (2 D per head);
    element-wise gate ``sigmoid(gate)``."""
    B, T, _ = x.shape
    qg = attn.q_proj(x).view(B, T, -1, attn.head_dim * 2)  # (B, T, H, 2D): [query | gate] per head
    return torch.sigmoid(qg[..., attn.head_dim:]).transpose(1, 2)  # (B, H, T, D)


for _t in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
    GATES.register(_t, _qwen3_next, description="element-wise: the gate half of q_proj per head (Qwen3-Next)")


@GATES.register("lfm3", description="head-wise: sigmoid(g_proj(x)), when config.use_attention_gate")
def _lfm3(attn: nn.Module, x: Tensor) -> Tensor | None:
    if getattr(attn, "g_proj", None) is None:
        return None
    return torch.sigmoid(attn.g_proj(x)).transpose(1, 2).unsqueeze(-1)  # (B, H, T, 1)


@GATES.register("beam", description="element-wise: sigmoid(gate_proj(x) + a per-head bias)")
def _beam(attn: nn.Module, x: Tensor) -> Tensor:
    B, T, _ = x.shape
    g = attn.gate_proj(x).view(B, T, -1, attn.head_dim) + attn.gate_bias[None, None, :, None]
    return torch.sigmoid(g).transpose(1, 2)  # (B, H, T, D)


@GATES.register("axk2", description="element-wise: the gate part of the fused q_gate_proj per head (float32)")
def _axk2(attn: nn.Module, x: Tensor) -> Tensor:
    B, T, _ = x.shape
    q_compressed = attn.q_a_proj(x)
    q_resid = attn.q_a_layernorm(q_compressed)
    qg = attn.q_gate_proj(torch.cat([q_resid, q_compressed], dim=-1)).view(B, T, -1, attn.qk_head_dim + attn.v_head_dim)
    return torch.sigmoid(qg[..., attn.qk_head_dim:].float()).transpose(1, 2)  # (B, H, T, D_v)


@GATES.register("afmoe", description="element-wise: sigmoid(gate_proj(x)) on the heads' concatenated outputs")
def _afmoe(attn: nn.Module, x: Tensor) -> Tensor:
    B, T, _ = x.shape
    return torch.sigmoid(attn.gate_proj(x).view(B, T, -1, attn.head_dim)).transpose(1, 2)  # (B, H, T, D)


@GATES.register("minicpm5_moe", description="element-wise: the gate half of q_gate_proj per head")
def _minicpm5_moe(attn: nn.Module, x: Tensor) -> Tensor:
    B, T, _ = x.shape
    qg = attn.q_gate_proj(x).view(B, T, -1, 2 * attn.head_dim)  # (B, T, H, 2D): [query | gate] per head
    return torch.sigmoid(qg[..., attn.head_dim:]).transpose(1, 2)  # (B, H, T, D)


def gate_reader(config) -> Callable[[nn.Module, Tensor], Tensor | None] | None:
    """The gate reader of ``config.model_type`` (:data:`GATES`), or None for a type without output gates."""
    t = getattr(config, "model_type", "")
    return GATES.get(t) if t in GATES else None


__all__ = ["GATES", "gate_reader"]
