"""Attention collectors: compute a layer's attention output and the column sums of
its attention matrix in one pass.

A collector has the signature::

    collector(query, key, value, *, scaling, attention_mask, is_causal,
              softcap=None, sinks=None, sliding_window=None, entropy=False) -> (output, column_sums)

with ``query`` (B, H_q, T_q, D), ``key``/``value`` (B, H_kv, T_k, D) (grouped-query
heads not repeated), ``attention_mask`` None, a boolean mask (True = may attend) or
an additive float mask broadcastable to (B, H_q, T_q, T_k); ``output`` (B, T_q, H_q, D)
in ``value``'s dtype, and ``sliding_window`` the layer's window (applied by the
collector when the mask is None: sinklab's mask builder returns None for a plain
causal sliding-window pattern rather than a T x T mask), and ``column_sums`` (B, H_q, T_k) float64:
``sum_i A[b, h, i, j]``. With ``entropy=True`` a collector returns a third tensor, the row
entropies (B, H_q, T_q) float64 in nats, ``-sum_j A[b, h, i, j] log A[b, h, i, j]`` (a gpt-oss
sink logit's share counted as one more entry of the row; :func:`sinklab.metrics.attention_entropy`).
Registered collectors are interchangeable: ``eager`` builds one layer's T x T matrix at a time,
others may never build it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.attention_masks import MaskSpec, build_mask, repeat_kv
from sinklab.metrics.entropy import attention_entropy
from sinklab.registry import Registry

COLLECTORS: Registry = Registry("attention collector")


def layer_mask(
    attention_mask: Tensor | None, is_causal: bool, t_q: int, t_k: int, device, sliding_window: int | None = None
) -> Tensor | None:
    """Boolean mask (True = may attend) broadcastable to (B, H, T_q, T_k), or None for full attention.

    A given mask wins; float masks are converted (0 -> allowed, large negative ->
    masked). With no mask, a causal layer gets :func:`sinklab.attention_masks.build_mask`:
    the lower-triangular mask aligned to the last query (query i sees keys j <= i + T_k - T_q),
    narrowed to the sliding window ``j > i + T_k - T_q - sliding_window`` when one is given
    (0-based positions); a bidirectional layer without a mask gets None.
    """
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            return attention_mask
        return attention_mask > torch.finfo(attention_mask.dtype).min / 2
    if not is_causal:
        return None
    return build_mask(t_q, t_k, MaskSpec(window=sliding_window), device=device)


@COLLECTORS.register("eager", description="one layer's full T x T attention matrix at a time (reference)")
def eager_collector(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    scaling: float | None,
    attention_mask: Tensor | None,
    is_causal: bool,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    sliding_window: int | None = None,
    edit=None,
    entropy: bool = False,
) -> tuple[Tensor, ...]:
    """Plain matmul-mask-softmax attention that also returns the column sums.

    Scores are ``scaling * q k^T`` (``scaling`` defaults to ``1/sqrt(D)``), optionally
    soft-capped (``softcap * tanh(s / softcap)``, Gemma 2), plus an additive float
    ``attention_mask``'s values where it does not mask (the ALiBi bias Falcon and MPT pass in
    it), masked (-inf where :func:`layer_mask` says hidden), and normalised with
    a softmax in float32; ``sinks`` (H_q,) are per-head sink logits added to the
    softmax denominator (gpt-oss) and receive no output. Memory: O(B H T_q T_k) for
    this one layer. ``edit`` (used by :mod:`sinklab.analyze`): a callable that gets the
    weights (B, H_q, T_q, T_k) float32 and returns replacement weights or None (no change);
    the output and the column sums then come from the replacement.

    Returns:
        output (B, T_q, H_q, D) in value's dtype, column sums (B, H_q, T_k) float64; with
        ``entropy``, also the row entropies (B, H_q, T_q) float64 in nats of the (possibly edited)
        weights, the sink logit's weight ``1 - sum_j A[i, j]`` counted as one more entry.
    """
    B, Hq, Tq, D = query.shape
    Tk = key.shape[2]
    n_rep = Hq // key.shape[1]
    k = repeat_kv(key, n_rep)  # (B, Hq, Tk, D)
    v = repeat_kv(value, n_rep)  # (B, Hq, Tk, D)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(D)
    scores = torch.matmul(query.float(), k.float().transpose(-1, -2)) * scale  # (B, Hq, Tq, Tk)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        # an additive float mask may carry a bias besides its masked entries (Falcon and MPT pass ALiBi in
        # it): its values are added, as transformers' eager attention does; the masked entries become -inf
        scores = scores + attention_mask.float().masked_fill(
            attention_mask <= torch.finfo(attention_mask.dtype).min / 2, 0.0)
    mask = layer_mask(attention_mask, is_causal, Tq, Tk, query.device, sliding_window)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink_col = sinks.float().reshape(1, Hq, 1, 1).expand(B, Hq, Tq, 1)
        probs = torch.softmax(torch.cat([scores, sink_col], dim=-1), dim=-1)[..., :Tk]
    else:
        probs = torch.softmax(scores, dim=-1)
    if mask is not None:  # fully masked rows (padding) contribute nothing; a NaN from an overflow stays NaN (refused)
        probs = probs.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if edit is not None:
        edited = edit(probs)
        probs = probs if edited is None else edited
    out = torch.matmul(probs.to(v.dtype), v)  # (B, Hq, Tq, D)
    col = probs.sum(dim=-2, dtype=torch.float64)
    if entropy:
        extra = None if sinks is None else (1.0 - probs.sum(dim=-1, dtype=torch.float64)).clamp_min(0.0)
        return out.transpose(1, 2).contiguous(), col, attention_entropy(probs, extra)
    return out.transpose(1, 2).contiguous(), col
