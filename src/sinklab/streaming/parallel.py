"""The sinks + window cache's outputs for a whole stream in one forward pass.

Fed one token at a time through :class:`~sinklab.streaming.SinkCache` (with cache positions),
token j attends, in every layer, to the first ``n_sink`` tokens and to tokens ``j - window .. j``,
and RoPE sees the kept tokens at contiguous positions ``0 .. K`` with the query at
``K = min(j, n_sink + window)``. The keys and values a token leaves in the cache were computed
with its own such context, so the whole stream can be computed in parallel: one forward over
the stream at its true positions, in which every layer attends to

* the window ``max(n_sink, j - window) .. j`` -- contiguous, so the true relative distances are the
  cache's;
* the sinks ``c < n_sink, c <= j`` with the query rotated to position ``min(j, n_sink + window)``,
  which puts sink c at the cache distance ``min(j, n_sink + window) - c``

in one softmax. Layers that the model declares sliding-window keep their own window and no sinks
unless the budget fits inside that window, as in the cache (:func:`~sinklab.streaming.cache.own_window`).
This is what ``sinklab stream`` uses for perplexity (tests check it against
the token-by-token cache); decode latency is measured with the real cache.

The attention function plugs into ``transformers``' ``AttentionInterface`` (see
``shared/notes/hf-attention-interface.md``); it computes query blocks of ``block`` rows, each
against at most ``n_sink + window + block`` keys, so memory is O(T (n_sink + window)) per layer: the
output reducer ``_SinkWindowOutput`` on :func:`sinklab.attention_masks.reduce_tiles`, the blocked-attention
driver.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from sinklab.attention_masks import MaskSpec, TileReducer, reduce_tiles
from sinklab.errors import InputError
from sinklab.streaming.cache import own_window
from sinklab.streaming.rope import KeyRotation

NAME = "sinklab_sink_window"


@dataclass
class _Plan:
    """What :func:`_attention` computes for one model inside :func:`sink_window_mode`."""

    n_sink: int
    window: int | None  # None: full causal attention
    rotations: list[KeyRotation | None]
    sliding: list[int | None]  # per layer: the model's own sliding window, or None
    block: int


#: attribute of a model's attention modules (those with a ``layer_idx``) holding their :class:`_Plan`
#: inside :func:`sink_window_mode`: the plan belongs to the model, not to the process
PLAN_ATTR = "sinklab_sink_window_plan"


def sink_window_attention(q: Tensor, k: Tensor, v: Tensor, *, n_sink: int, window: int | None,
                          rotation: KeyRotation | None, scaling: float, block: int = 256,
                          sink_logits: Tensor | None = None) -> Tensor:
    """Attention of every stream position under the sinks + window cache.

    Args:
        q: (B, H, T, d) queries rotated at positions 0..T-1 (0-based stream positions).
        k, v: (B, H_kv, T, d) keys (rotated at 0..T-1) and values; H divisible by H_kv (GQA).
        n_sink: sink tokens (0: window only). window: recent tokens kept (None: full causal).
        rotation: the layer's RoPE (None for a model without RoPE: sinks keep true distances).
        scaling: logit scale (the model's, usually d^-1/2).
        block: query rows per step.
        sink_logits: (H,) learned logits of a virtual key with no value in every softmax's denominator
            (gpt-oss's ``sinks``, passed as ``s_aux``), not scaled; None: none.

    Returns:
        (B, H, T, d) attention outputs in ``q``'s dtype (a model's q, k, v share one); scores, softmax and the weighted sum computed in
        float32 whatever the dtype (float64 for a float64 model), as SDPA accumulates a bfloat16 /
        float16 model's attention in float32, one block of ``block`` queries at a time.
    """
    B, H, T, d = q.shape
    if k.shape[1] != H:
        k = k.repeat_interleave(H // k.shape[1], dim=1)
        v = v.repeat_interleave(H // v.shape[1], dim=1)
    W = T if window is None else window
    s = min(n_sink, T) if window is not None else 0
    pos = torch.arange(T, device=q.device)
    qs = q
    if s and rotation is not None:
        delta = pos.clamp(max=s + W) - pos  # (T,) <= 0: move late queries back to cache position s + W
        if bool((delta != 0).any()):
            qs = rotation.rotate(q, delta)
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax in float32 at least
    # query block [a, b) sees the window keys [max(s, a - W), b) (key j with i - W <= j <= i: a window of W + 1)
    # and the sinks [0, s)
    rows = _SinkWindowOutput(q, qs, k, v, s=s, window=W, scaling=scaling, acc=acc, sink_logits=sink_logits)
    return reduce_tiles(rows, T, block, MaskSpec(causal=True, window=W + 1))


class _SinkWindowOutput(TileReducer):
    """The output reducer of :func:`sink_window_attention`: query rows [a, b) (0-based stream positions) attend the
    window keys [max(s, k0), k1) of their causal window of ``window + 1`` keys and the ``s`` sinks [0, s) (queries
    ``qs``, rotated to their cache positions), in one softmax in ``acc`` (with ``sink_logits`` (H,) in its
    denominator when given). q, qs (B, H, T, d); k, v (B, H, T, d) (kv heads repeated). Result: the (B, H, T, d)
    output in q's dtype. Never empty: every query sees itself."""

    def __init__(self, q: Tensor, qs: Tensor, k: Tensor, v: Tensor, *, s: int, window: int, scaling: float,
                 acc: torch.dtype, sink_logits: Tensor | None) -> None:
        self.q, self.qs, self.k, self.v, self.s, self.W = q, qs, k, v, s, window
        self.scaling, self.acc, self.sink_logits = scaling, acc, sink_logits
        self.pos = torch.arange(q.shape[2], device=q.device)
        self.out = torch.empty_like(q)

    def tile(self, a: int, b: int, k0: int, k1: int) -> None:
        q, k, v, s, W, scaling, acc, pos = self.q, self.k, self.v, self.s, self.W, self.scaling, self.acc, self.pos
        B, H = q.shape[:2]
        lo = max(s, k0)
        j = pos[a:b, None]  # (bq, 1)
        i = pos[None, lo:k1]  # (1, nk)
        sc = (q[:, :, a:b].to(acc) @ k[:, :, lo:k1].to(acc).transpose(-1, -2)) * scaling  # (B, H, bq, nk)
        sc = sc.masked_fill(~((i <= j) & (i >= j - W)), float("-inf"))
        vv = v[:, :, lo:k1]
        if s:
            ss = (self.qs[:, :, a:b].to(acc) @ k[:, :, :s].to(acc).transpose(-1, -2)) * scaling  # (B, H, bq, s)
            ss = ss.masked_fill(~(pos[None, :s] <= j), float("-inf"))
            sc = torch.cat((ss, sc), dim=-1)
            vv = torch.cat((v[:, :, :s], vv), dim=-2)
        if self.sink_logits is not None:  # the virtual key's logit joins the denominator, its weight is dropped
            sl = self.sink_logits.to(device=sc.device, dtype=acc).reshape(1, H, 1, 1).expand(B, H, b - a, 1)
            p = torch.softmax(torch.cat((sc, sl), dim=-1), dim=-1)[..., :-1]
        else:
            p = torch.softmax(sc, dim=-1)
        self.out[:, :, a:b] = (p @ vv.to(acc)).to(v.dtype)

    def result(self) -> Tensor:
        return self.out


def _attention(module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, **kwargs):
    """``AttentionInterface`` function: (B, H, T, d) in, (B, T, H, d) out."""
    plan = getattr(module, PLAN_ATTR, None)
    if plan is None:
        raise RuntimeError(f"{NAME} is only usable inside sinklab.streaming.parallel.sink_window_mode")
    if kwargs.get("softcap") is not None:
        raise InputError("sinklab stream does not support attention logit softcapping (Gemma 2)")
    layer = getattr(module, "layer_idx", 0)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    sw = plan.sliding[layer] if layer < len(plan.sliding) else None
    own = own_window(sw, None if plan.window is None else plan.n_sink + plan.window)
    logits = kwargs.get("s_aux")  # gpt-oss's sink logits (H,)
    if own is not None:  # the model's own local layer: its window, no sinks (as SinkCache keeps it)
        y = sink_window_attention(query, key, value, n_sink=0, window=own, rotation=None, scaling=scale,
                                  block=plan.block, sink_logits=logits)
    else:
        y = sink_window_attention(query, key, value, n_sink=plan.n_sink, window=plan.window,
                                  rotation=plan.rotations[layer], scaling=scale, block=plan.block, sink_logits=logits)
    return y.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, _attention)


@contextmanager
def sink_window_mode(model, n_sink: int, window: int | None, *, block: int = 256):
    """Within the block, ``model``'s attention is the sinks + window cache's (``window=None``: full).

    Args:
        model: a ``transformers`` RoPE decoder (as :class:`~sinklab.streaming.SinkCache` accepts).

    Raises:
        InputError: as :class:`~sinklab.streaming.SinkCache` for an unsupported model.
    """
    from sinklab.streaming.cache import layer_windows
    from sinklab.streaming.rope import key_rotations

    sliding = layer_windows(model)
    types = ["full_attention" if w is None else "sliding_attention" for w in sliding]
    plan = _Plan(n_sink, window, key_rotations(model, types), sliding, block)
    _register()
    before = model.config._attn_implementation
    layers = [m for m in model.modules() if hasattr(m, "layer_idx")]
    prev = [getattr(m, PLAN_ATTR, None) for m in layers]
    for m in layers:
        setattr(m, PLAN_ATTR, plan)
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        for m, p in zip(layers, prev):
            if p is None:
                delattr(m, PLAN_ATTR)
            else:
                setattr(m, PLAN_ATTR, p)
        model.set_attn_implementation(before)


__all__ = ["sink_window_attention", "sink_window_mode", "NAME"]
