"""Which keys each query may see, and grouped-query head repetition: the one definition that
sinklab's own attention (:mod:`sinklab.nn.attention`) and the capture collectors
(:mod:`sinklab.capture.collectors`, :mod:`sinklab.capture.blockwise`) share.

Positions are 0-based. Query ``i`` sees key ``j`` iff

* causal: ``j <= i`` or ``j < prefix_len`` (a bidirectional prefix, prefix LM);
  bidirectional (``causal=False``): every key;
* and, with a sliding window ``w``: ``|i - j| < w`` (for a causal key ``j <= i``: ``j > i - w``).

When there are fewer queries than keys (``t_q < t_k``), the queries are the *last* ``t_q``
positions: query row ``q`` is position ``q + offset`` with ``offset = t_k - t_q``.

Depends on torch only, so every layer of sinklab may import it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["visible", "build_mask", "key_range", "repeat_kv"]


def visible(qpos: Tensor, kpos: Tensor, *, prefix_len: int = 0, window: int | None = None,
            causal: bool = True) -> Tensor:
    """Which keys each query may attend.

    Args:
        qpos: (C,) 0-based query positions. kpos: (Tk,) 0-based key positions.
        prefix_len: length p of the bidirectional prefix (prefix LM); 0 = none.
        window: sliding-window width w (``|i - j| < w``), or None.
        causal: False for bidirectional attention (every key, within the window).

    Returns:
        (C, Tk) bool, True where query i sees key j.
    """
    i, j = qpos[:, None], kpos[None, :]
    m = (j <= i) | (j < prefix_len) if causal else torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=i.device)
    if window is not None:
        m = m & ((i - j).abs() < window)
    return m


def build_mask(t_q: int, t_k: int | None = None, *, prefix_len: int = 0, window: int | None = None,
               causal: bool = True, device=None) -> Tensor:
    """(T_q, T_k) bool mask of :func:`visible`, True = may attend.

    Keys are positions ``0..T_k-1`` (``T_k`` defaults to ``T_q``); the queries are the last
    ``T_q`` of them (query row ``q`` is position ``q + T_k - T_q``).
    """
    t_k = t_q if t_k is None else t_k
    kpos = torch.arange(t_k, device=device)
    qpos = torch.arange(t_q, device=device) + (t_k - t_q)
    return visible(qpos, kpos, prefix_len=prefix_len, window=window, causal=causal)


def key_range(q0: int, q1: int, t_k: int, *, offset: int = 0, prefix_len: int = 0, window: int | None = None,
              causal: bool = True) -> tuple[int, int]:
    """Keys ``[k0, k1)`` that contain every key some query row in ``[q0, q1)`` may see.

    Query row ``q`` is position ``q + offset``. Tight at both ends for causal attention without
    a prefix; with a prefix the range may hold keys that only some rows see (the mask inside
    the range decides). An empty range has ``k0 >= k1``.
    """
    if causal:
        k1 = min(t_k, max(q1 + offset, prefix_len))
    else:
        k1 = t_k if window is None else min(t_k, q1 + offset + window - 1)
    k0 = 0 if window is None else max(0, q0 + offset - window + 1)
    return k0, k1


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * n_rep, T, D): each key/value head repeated for its group of
    ``n_rep`` query heads (grouped-query attention; query head h uses kv head ``h // n_rep``)."""
    if n_rep == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)
