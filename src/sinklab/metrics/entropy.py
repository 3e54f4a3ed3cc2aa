"""Entropies of attention rows and of hidden-state representations.

* :func:`attention_entropy`: the Shannon entropy (nats) of every query's attention distribution,
  ``H_i = -sum_j p_ij log p_ij``; a head that spreads its attention evenly over the ``i + 1`` keys
  a causal query sees has ``log(i + 1)``, a head that puts everything on one key (a sink) has 0.
* :func:`matrix_entropy`: the matrix-based Renyi entropy of a set of token representations
  (Giraldo, Rao & Principe 2014, *Measures of entropy from data using infinitely divisible kernels*;
  used for the "compression valley" of Skean et al. 2025 and Queipo-de-Llano et al. 2025, *Attention
  sinks and compression valleys in LLMs are two sides of the same coin*): the entropy of the
  eigenvalue spectrum of the trace-normalised Gram matrix of the T token vectors of one sequence.

Positions are 0-based. Pure functions: tensors in, float64 tensors out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.attention_masks import CAUSAL, MaskSpec
from sinklab.errors import InputError


def attention_entropy(weights: Tensor, extra: Tensor | None = None) -> Tensor:
    """Shannon entropy in nats of each attention row, ``-sum_j p_j log p_j`` (``0 log 0 = 0``).

    Each row is taken as a distribution over its keys (and the virtual key, if any): ``p = |w| /
    sum |w|``, which is ``w`` itself for softmax rows; a row of zeros (a fully masked query) has
    entropy 0.

    Args:
        weights: (..., T_q, T_k) attention weights, rows = queries.
        extra: (..., T_q) weight of each query on a virtual key (learned sink token, sink logit,
            key bias), counted as one more entry of the row, or None.

    Returns:
        (..., T_q) float64 entropies in nats, in [0, log(T_k + 1)].

    Raises:
        InputError: ``weights`` has fewer than 2 dimensions or ``extra`` does not match its rows.
    """
    if weights.dim() < 2:
        raise InputError(f"attention weights must be (..., T_q, T_k), got shape {tuple(weights.shape)}")
    p = weights.to(torch.float64).abs()
    if extra is not None:
        if extra.shape != weights.shape[:-1]:
            raise InputError(f"extra must be (..., T_q) = {tuple(weights.shape[:-1])}, got {tuple(extra.shape)}")
        p = torch.cat([p, extra.to(torch.float64).abs()[..., None]], dim=-1)
    total = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(total > 0, total, torch.ones_like(total))
    return -torch.special.xlogy(p, p).sum(dim=-1)


def uniform_attention_entropy(seq_len: int, mask: MaskSpec = CAUSAL) -> float:
    """The reference for :func:`attention_entropy`: the mean over the T queries of ``log n_i``, the
    entropy of a head that spreads each query's attention evenly over the ``n_i`` keys it may see.

    ``n_i`` (0-based query i) is counted from ``mask`` (:class:`~sinklab.attention_masks.MaskSpec`, the rule of
    :func:`~sinklab.attention_masks.build_mask`): ``T`` for bidirectional attention, ``i + 1`` for causal, a
    prefix LM's queries ``i < mask.prefix_len`` see the whole prefix, and a sliding window (causal or
    bidirectional) keeps only the keys within it.

    Raises:
        InputError: ``seq_len`` < 1 (a negative prefix or a window < 1 is refused by :class:`MaskSpec`).
    """
    from sinklab.attention_masks import build_mask

    if seq_len < 1:
        raise InputError(f"need seq_len >= 1, got {seq_len}")
    if not mask.causal and mask.window is None:
        return math.log(seq_len)
    n = build_mask(seq_len, seq_len, mask).sum(dim=-1).to(torch.float64)  # (T,) keys each query sees
    return float(n.log().mean())


def matrix_entropy(hidden: Tensor, alpha: float = 1.0) -> Tensor:
    """Matrix-based Renyi entropy of order ``alpha`` of the token representations, in nats.

    For the T rows ``x_t`` of each (T, d) matrix: the Gram matrix ``K = X X^T`` (raw hidden states:
    no centring, no per-token normalisation, so one token of massive norm dominates it), normalised
    to unit trace, ``A = K / tr(K)``; with ``lambda_i`` the eigenvalues of ``A`` (non-negative, sum 1):

    * ``alpha = 1`` (von Neumann): ``S = -sum_i lambda_i log lambda_i``;
    * otherwise: ``S_alpha = log(sum_i lambda_i^alpha) / (1 - alpha)``.

    ``S`` lies in [0, log(min(T, d))]: 0 when all tokens are multiples of one vector (rank 1),
    ``log r`` when the representations span r orthogonal directions with equal energy. Giraldo et
    al. 2014, Eq. 9 (their logarithm base 2; here natural log). Computed in float64 from the smaller
    of ``X X^T`` and ``X^T X`` (the same non-zero eigenvalues).

    Args:
        hidden: (..., T, d) token representations (e.g. one layer's block outputs of N sequences).
        alpha: order > 0.

    Returns:
        (...) float64 entropies in nats (NaN where every token vector is 0).

    Raises:
        InputError: ``hidden`` not at least 2-D, or ``alpha`` not positive.
    """
    if hidden.dim() < 2:
        raise InputError(f"hidden states must be (..., T, d), got shape {tuple(hidden.shape)}")
    if not alpha > 0:
        raise InputError(f"the entropy order alpha must be > 0, got {alpha}")
    x = hidden.to(torch.float64)
    T, d = x.shape[-2:]
    gram = x @ x.transpose(-1, -2) if T <= d else x.transpose(-1, -2) @ x  # (..., min(T, d), same)
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(dim=-1)  # (...)
    safe = torch.where(trace > 0, trace, torch.ones_like(trace))[..., None, None]  # all-zero tokens: NaN below
    lam = torch.linalg.eigvalsh(gram / safe).clamp_min(0.0)  # (..., min(T, d))
    total = lam.sum(dim=-1, keepdim=True)
    lam = lam / torch.where(total > 0, total, torch.ones_like(total))  # undo rounding in the clamp
    if alpha == 1.0:
        out = -torch.special.xlogy(lam, lam).sum(dim=-1)
    else:
        out = torch.log((lam ** alpha).sum(dim=-1)) / (1.0 - alpha)
    return torch.where(trace > 0, out, torch.full_like(out, math.nan))


__all__ = ["attention_entropy", "matrix_entropy", "uniform_attention_entropy"]
