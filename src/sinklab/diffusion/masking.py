"""The forward (noising) process and the loss of a masked diffusion language model.

Masked diffusion as in MDLM (Sahoo et al. 2024, "Simple and Effective Masked Diffusion
Language Models", Eq. 10) and LLaDA (Nie et al. 2025, "Large Language Diffusion Models",
Eq. 3): for a clean sequence ``x0`` of T tokens draw a mask ratio ``t ~ U(eps, 1)`` per
sequence, replace every token by the mask token independently with probability ``t``, and
train a bidirectional model to predict the masked tokens::

    L = - 1 / (B T) * sum_b sum_i  1[x_t^{b,i} = MASK] / t_b * log p(x0^{b,i} | x_t^b)

(nats per token; the sum runs over masked positions, the normaliser is every position of the
batch, as LLaDA's code divides by ``batch * length``). ``L`` upper-bounds the negative log-likelihood
per token; it is the continuous-time ELBO of the linear schedule.

Positions that are not text (BOS, the tokens the packing inserted) are never masked and never
scored (``maskable`` False).

The draws are a pure function of (seed, global sample index): a resumed or data-parallel run
masks every sample exactly as one uninterrupted process would.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from sinklab.data.packing import IGNORE_INDEX
from sinklab.data.tokenizer import MASK_TOKEN
from sinklab.errors import InputError

__all__ = ["MASK_TOKEN", "mask_ratio_and_mask", "corrupt", "diffusion_targets"]

_STREAM = 0xD1F  # separates the diffusion draws from every other seeded stream


def mask_ratio_and_mask(seed: int, first_sample: int, maskable: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Mask ratio and mask of samples ``first_sample ..`` (0-based global indices).

    Sample ``g`` draws from ``numpy.random.default_rng([seed, 0xD1F, g])``: first
    ``t = eps + (1 - eps) * u`` (``u ~ U[0, 1)``), then ``T`` uniforms ``r``; position i is
    masked iff ``r_i < t`` and ``maskable[i]``.

    Args:
        seed: run seed (``train.seed``; the tracker uses ``track.seed``).
        first_sample: global index of row 0.
        maskable: (B, T) bool, positions that may be masked (text tokens).
        eps: lower end of the mask ratio, 0 < eps < 1.

    Returns:
        (t (B,) float32 in [eps, 1), masked (B, T) bool).

    Raises:
        InputError: eps outside (0, 1) or ``maskable`` not 2-D.
    """
    if not 0.0 < eps < 1.0:
        raise InputError(f"mask eps must be in (0, 1), got {eps}")
    if maskable.dim() != 2:
        raise InputError(f"maskable must be (B, T), got shape {tuple(maskable.shape)}")
    B, T = maskable.shape
    t = np.empty(B, dtype=np.float64)
    r = np.empty((B, T), dtype=np.float64)
    for b in range(B):
        rng = np.random.default_rng([seed, _STREAM, first_sample + b])
        t[b] = eps + (1.0 - eps) * rng.random()
        r[b] = rng.random(T)
    masked = torch.from_numpy(r < t[:, None]).to(maskable.device) & maskable
    return torch.from_numpy(t).to(torch.float32).to(maskable.device), masked


def corrupt(x0: Tensor, masked: Tensor, mask_id: int) -> Tensor:
    """``x_t``: the clean ids (B, T) with the masked positions replaced by ``mask_id`` (new tensor)."""
    return torch.where(masked, torch.full_like(x0, mask_id), x0)


def diffusion_targets(x0: Tensor, masked: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    """Targets and per-position weights that make the mean cross-entropy equal ``L`` above.

    :func:`sinklab.nn.loss.linear_cross_entropy` returns ``sum_i w_i ce_i / n`` over the
    ``n`` counted positions; with ``w_i = (1 / t_b) * n / (B T)`` on the masked positions this
    is LLaDA's ``sum ce / t / (B T)``. When nothing in the batch is masked the loss is exactly 0:
    one position is counted with weight 0 (a finite loss with zero gradient, never NaN).

    Args:
        x0: (B, T) int64 clean ids; masked: (B, T) bool; t: (B,) float mask ratios.

    Returns:
        (targets (B, T) int64 with -100 where not masked, weights (B, T) float32).
    """
    targets = torch.where(masked, x0, torch.full_like(x0, IGNORE_INDEX))
    n = int(masked.sum())
    if n == 0:
        targets = targets.clone()
        targets[0, 0] = x0[0, 0]
        return targets, torch.zeros(x0.shape, dtype=torch.float32, device=x0.device)
    w = masked.to(torch.float32) / t.to(torch.float32)[:, None] * (n / x0.numel())
    return targets, w
