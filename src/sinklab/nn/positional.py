"""Positional encodings, chosen by name from :data:`POSITIONAL`.

A positional encoding acts at one (or none) of three places, all positions 0-based:

* ``absolute(T)``: a (T, d_model) table added to the token embeddings
  (``sinusoidal``, ``learned``); these have a hard length limit ``max_len``;
* ``apply_qk(q, k, state)``: rotates queries and keys (``rope``);
* ``logit_bias(qpos, kpos)``: an additive (H, C, Tk) bias on the attention logits
  (``alibi``, ``t5``), shared by all layers.

``nope`` does nothing. Virtual keys (sink token, key biases, sink logits) carry no
position: they are never rotated and get no logit bias.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from sinklab.errors import InputError
from sinklab.registry import Registry

#: name -> :class:`Positional` subclass, built as ``cls(config)``.
POSITIONAL: Registry[type["Positional"]] = Registry("positional encoding")


class Positional(nn.Module):
    """Base class: no positional information (NoPE)."""

    logit_bias_kind: ClassVar[bool] = False  # True if it biases the logits
    learned_bias: ClassVar[bool] = False  # True if that bias has parameters
    max_len: int | None = None  # longest sequence it can encode, or None

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config

    def check_length(self, T: int) -> None:
        """Raise InputError if a sequence of ``T`` tokens is past this encoding's table."""
        if self.max_len is not None and T > self.max_len:
            raise InputError(
                f"sequence length {T} is past the {type(self).name!s} positional table's limit of "
                f"{self.max_len} (max_seq_len); use shorter inputs or a relative encoding"
            )

    def absolute(self, T: int, device: torch.device) -> Tensor | None:
        """(T, d_model) table added to the embeddings at positions 0..T-1, or None."""
        return None

    def prepare(self, T: int, device: torch.device) -> Any:
        """Per-forward state shared by every layer (RoPE's cos/sin), or None."""
        return None

    def apply_qk(self, q: Tensor, k: Tensor, state: Any) -> tuple[Tensor, Tensor]:
        """Queries (B, H, T, d_h) and keys (B, H_kv, T, d_h) after positions; identity here."""
        return q, k

    def logit_bias(self, qpos: Tensor, kpos: Tensor) -> Tensor | None:
        """Additive logit bias (H, C, Tk) float32 for query positions (C,) and key positions (Tk,), or None."""
        return None


def _register(name: str):
    def deco(cls):
        cls.name = name
        return POSITIONAL.register(name)(cls)

    return deco


@_register("nope")
class NoPE(Positional):
    """NoPE: no positional encoding; order comes from the causal mask alone (Kazemnejad et al. 2023)."""


@_register("rope")
class RoPE(Positional):
    """Rotary position embedding on q and k, rotate-half layout as in LLaMA/HF (Su et al. 2021)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        dh = config.qk_dim  # the width one attention map's queries and keys have
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh))  # (d_h/2,)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def prepare(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """cos, sin (T, d_h) float32 for positions 0..T-1."""
        pos = torch.arange(T, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))  # (T, d_h/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (T, d_h)
        return emb.cos(), emb.sin()

    def apply_qk(self, q, k, state):
        cos, sin = state
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # (T, d_h), broadcast over (B, H)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotate_half(x: Tensor) -> Tensor:
    """(..., d_h) -> (..., d_h): [x1, x2] -> [-x2, x1] with x1, x2 the two halves."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@_register("sinusoidal")
class Sinusoidal(Positional):
    """Absolute sinusoidal table PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(...) (Vaswani et al. 2017)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.max_len = config.max_seq_len
        d = config.d_model
        pos = torch.arange(self.max_len, dtype=torch.float64)[:, None]  # (T, 1)
        div = 10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (ceil(d/2),)
        pe = torch.zeros(self.max_len, d, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(pos / div)
        pe[:, 1::2] = torch.cos(pos / div)[:, : d // 2]
        self.register_buffer("table", pe.float(), persistent=False)  # (max_seq_len, d)

    def absolute(self, T, device):
        return self.table[:T].to(device)


@_register("learned")
class Learned(Positional):
    """Learned absolute position embeddings, one row per position up to max_seq_len (GPT-2)."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.max_len = config.max_seq_len
        self.table = nn.Embedding(config.max_seq_len, config.d_model)  # (max_seq_len, d)

    def absolute(self, T, device):
        return self.table.weight[:T]


@_register("alibi")
class ALiBi(Positional):
    """ALiBi: logit bias -m_h |i - j| with geometric head slopes m_h (Press et al. 2022)."""

    logit_bias_kind = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)  # (H,)

    def logit_bias(self, qpos, kpos):
        dist = (qpos[:, None] - kpos[None, :]).abs().float()  # (C, Tk)
        return -self.slopes.to(dist.device)[:, None, None] * dist  # (H, C, Tk)


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi slopes (H,): 2^(-8 h / H) for h = 1..H when H is a power of 2; otherwise the
    slopes of the nearest lower power of 2 followed by every other slope of the next one
    (Press et al. 2022, reference implementation)."""

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_heads).is_integer():
        s = pow2(n_heads)
    else:
        low = 2 ** math.floor(math.log2(n_heads))
        s = pow2(low) + pow2(2 * low)[0::2][: n_heads - low]
    return torch.tensor(s, dtype=torch.float32)


@_register("t5")
class T5Relative(Positional):
    """T5 relative-position buckets: a learned per-head logit bias per bucket of k - q, bidirectional (Raffel et al. 2020)."""

    logit_bias_kind = True
    learned_bias = True

    def __init__(self, config) -> None:
        super().__init__(config)
        self.num_buckets = config.t5_num_buckets
        self.max_distance = config.t5_max_distance
        self.bias = nn.Embedding(self.num_buckets, config.n_heads)  # (num_buckets, H)

    def logit_bias(self, qpos, kpos):
        rel = kpos[None, :] - qpos[:, None]  # (C, Tk), key minus query
        buckets = t5_bucket(rel, self.num_buckets, self.max_distance)  # (C, Tk)
        return self.bias(buckets).permute(2, 0, 1).float()  # (C, Tk, H) -> (H, C, Tk)


def t5_bucket(rel: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Bidirectional T5 bucket of relative positions ``rel = key - query`` (any shape, int).

    Half the buckets are for keys after the query (needed by the prefix LM). Inside each
    half, distances below ``num_buckets // 4`` get their own bucket and larger ones share
    log-spaced buckets up to ``max_distance`` (T5's ``_relative_position_bucket``).
    """
    half = num_buckets // 2
    out = (rel > 0).long() * half
    n = rel.abs()
    max_exact = half // 2
    large = max_exact + (
        torch.log(n.clamp_min(1).float() / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    ).long()
    large = large.clamp_max(half - 1)
    return out + torch.where(n < max_exact, n, large)
