"""Agreement of a compressed KV cache with the full cache: the next-token distributions compared.

KV-cache compression is judged by how far each next-token distribution moves from the full cache's
(llama.cpp's ``--kl-divergence`` reports the same two figures for quantised models and caches):

* **KL divergence** ``KL(p_full || p_policy) = sum_v p_full(v) (log p_full(v) - log p_policy(v))`` in
  nats, per predicted position (DESIGN.md, "agreement with the full cache");
* **top-1 agreement**: whether ``argmax p_full == argmax p_policy`` at that position.

Both need no labels and move long before perplexity does. Pure functions: logits in, per-position
tensors out; reduced in float64 whatever the logits' dtype (bfloat16 logits are upcast first).
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.errors import InputError

__all__ = ["kl_to_full", "top1_agreement"]


def _check(full: Tensor, other: Tensor) -> None:
    if full.shape != other.shape:
        raise InputError(f"logits of different shapes: full {tuple(full.shape)}, other {tuple(other.shape)}")
    if full.dim() < 1 or full.shape[-1] < 2:
        raise InputError(f"logits need a vocabulary axis of at least 2 entries, got shape {tuple(full.shape)}")


def kl_to_full(full_logits: Tensor, logits: Tensor) -> Tensor:
    """KL(p_full || p) of the next-token distributions, per position, in nats.

    Args:
        full_logits: (..., V) logits of the full (uncompressed) cache at some positions; any float dtype.
        logits: (..., V) logits of the compressed cache at the same positions (same shape).

    Returns:
        (...) float64, >= 0 (0 where the two distributions are equal). Positions are whatever the
        leading axes index (no 0/1-based convention of its own).

    Raises:
        InputError: the shapes differ, or V < 2.
    """
    _check(full_logits, logits)
    lp_full = torch.log_softmax(full_logits.double(), dim=-1)
    lp = torch.log_softmax(logits.double(), dim=-1)
    kl = (lp_full.exp() * (lp_full - lp)).sum(-1)
    return kl.clamp_min(0.0)  # rounding can leave -1e-17 where the distributions are equal


def top1_agreement(full_logits: Tensor, logits: Tensor) -> Tensor:
    """Whether the full cache's and the compressed cache's most likely next tokens agree, per position.

    Args:
        full_logits, logits: (..., V) logits at the same positions (same shape, any float dtype).

    Returns:
        (...) bool. Ties are broken by the lowest token id in both (``torch.argmax``).

    Raises:
        InputError: the shapes differ, or V < 2.
    """
    _check(full_logits, logits)
    return full_logits.double().argmax(-1) == logits.double().argmax(-1)
