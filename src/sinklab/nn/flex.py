"""FlexAttention for the softmax family (``model.attention_backend = "flex"``).

:func:`flex_attend` computes the operations that :func:`torch.nn.attention.flex_attention.flex_attention`
expresses exactly: softmax over the visible keys, with a ``score_mod`` for additive positional
biases and a ``block_mask`` for the visibility rule, plus a virtual key in front of the keys or a
virtual logit folded in through the log-sum-exp. The operations it serves, :func:`flex_operations`,
are those with ``op.sdpa`` (:mod:`sinklab.nn.ops`); the others (sigmoid and ReLU without
normalisation, kernels, softpick, p-norms) have no softmax to hand to FlexAttention and use the
compiled tile path (:mod:`sinklab.nn.compiled`).

Notation: query position i, key position j (0-based), logit ``s_ij = scale * q_i . k_j`` with
``scale = 1 / sqrt(d_h)``, visible keys ``V(i)`` (:mod:`sinklab.attention_masks`):
``j in V(i)`` iff ``(j <= i or j < p)`` and, with a sliding window w, ``|i - j| < w``
(p = ``prefix_len``; a bidirectional model runs with p = T).

Each operation as FlexAttention sees it (``score_mod(s, b, h, i, j)`` is the identity unless a
positional bias is in use; ``mask_mod(b, h, i, j)`` is ``j in V(i)``)::

    softmax, gated_headwise, gated_elementwise, diff (per map)
                         o_i = sum_{j in V(i)} exp(s_ij) v_j / sum_{j in V(i)} exp(s_ij)
                         (the gates and differential attention's combination act on o outside)
    softmax_scaled       o_i = alpha * softmax(...)            (output times alpha)
    sink_token, kv_bias, k_bias, v_bias
                         key 0 is the virtual key k* (value v*), visible to every query, no
                         position: mask_mod(b, h, i, 0) = True, real key j sits at index j + 1
    softmax_off_by_one, sink_logit
                         o_i = softmax_o_i * sigmoid(LSE_i - b_h)    with LSE_i = log sum_{j in V(i)} exp(s_ij):
                         exp(s) / (exp(b_h) + sum exp(s)) = softmax * exp(LSE) / (exp(LSE) + exp(b_h));
                         b_h = 0 for off-by-one, learned for sink_logit (gpt-oss)

Positional biases as ``score_mod`` (RoPE acts on q and k before attention and needs none)::

    alibi   s_ij - m_h |i - j|                        (Press et al. 2022; slopes m_h)
    t5      s_ij + table[bucket(j - i), h]            (Raffel et al. 2020; learned table)
    other   s_ij + bias[h, i, j]                      (a dense (H, T, T) table: any logit_bias)

The virtual key gets no bias (``score_mod`` adds the bias only for real keys).

Gradients: on CUDA FlexAttention's own backward (its kernel also differentiates the captured
ALiBi/T5 tensors and the log-sum-exp). On CPU, FlexAttention has no backward (torch 2.13 raises
``NotImplementedError``), so when an input requires grad :class:`_FlexForwardReferenceBackward`
runs the forward through FlexAttention and the backward by recomputing the layer through the
reference formula (:func:`sinklab.nn.attention.attend_block`, full T x T float32 logits for one
layer at a time): **on CPU, the gradient is the reference path's.**
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from sinklab.attention_masks import build_mask, repeat_kv
from sinklab.errors import ConfigError

__all__ = ["flex_attend", "flex_kernel", "flex_operations", "check_flex_operation", "op_name"]


def flex_operations() -> list[str]:
    """Names of the registered attention operations FlexAttention computes exactly (``op.sdpa``)."""
    from sinklab.nn.ops import ATTENTION

    return [n for n in ATTENTION.names() if ATTENTION.get(n).sdpa]


def check_flex_operation(name: str) -> None:
    """Raise :class:`ConfigError` unless FlexAttention computes operation ``name`` exactly; the
    message names the supported set and the backend for the others."""
    ops = flex_operations()
    if name not in ops:
        raise ConfigError(
            f"model.attention_backend='flex' computes the softmax family only ({', '.join(ops)}); "
            f"attention={name!r} has no softmax for FlexAttention: use attention_backend='compiled' "
            "(the torch.compile'd tile path) or 'auto'")


_COMPILED: dict[str, Callable] = {}


def flex_kernel(compiled: bool = True) -> Callable:
    """``flex_attention``, under ``torch.compile`` (the fused kernel; compiled once per shape, about
    a minute on a busy CPU) or eager (``compiled=False``: PyTorch's unfused implementation, which
    materialises the (B, H, T, Tk) scores; for tests and debugging)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


# ------------------------------------------------------------------ masks and score_mods
def _mask_mod(prefix_len: int, window: int | None, offset: int):
    """``mask_mod(b, h, i, kv)``: key index kv (``offset`` = 1 with a virtual key at index 0) is
    visible from query i (0-based) by the rule of :func:`sinklab.attention_masks.visible`."""

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx - offset
        vis = (j <= q_idx) | (j < prefix_len)
        if window is not None:
            vis = vis & ((q_idx - j).abs() < window)
        if offset:
            vis = vis | (kv_idx == 0)
        return vis

    return mask_mod


def _score_mod(positional, T: int, offset: int, device) -> Callable | None:
    """The additive positional bias as ``score_mod(score, b, h, i, kv)`` or None (no logit bias).

    ALiBi and T5 are computed from the indices (no T x T table); any other ``logit_bias`` uses its
    dense (H, T, T) table. The virtual key (index 0 when ``offset`` = 1) gets no bias."""
    if not positional.logit_bias_kind:
        return None
    from sinklab.nn.positional import ALiBi, T5Relative, t5_bucket

    if isinstance(positional, ALiBi):
        slopes = positional.slopes.to(device)  # (H,)

        def bias(h, i, j):
            return -slopes[h] * (i - j).abs()
    elif isinstance(positional, T5Relative):
        table = positional.bias.weight  # (num_buckets, H), learned
        nb, md = positional.num_buckets, positional.max_distance

        def bias(h, i, j):
            return table[t5_bucket(j - i, nb, md), h]
    else:
        pos = torch.arange(T, device=device)
        dense = positional.logit_bias(pos, pos)  # (H, T, T)

        def bias(h, i, j):
            return dense[h, i, j.clamp_min(0)]

    def score_mod(score, b, h, q_idx, kv_idx):
        j = kv_idx - offset
        add = bias(h, q_idx, j)
        if offset:
            add = torch.where(kv_idx >= offset, add, 0.0)
        return score + add.to(score.dtype)

    return score_mod


def _block_mask(T: int, offset: int, prefix_len: int, window: int | None, device, cache: dict | None):
    """The (T, T + offset) :class:`BlockMask` of the visibility rule, built once per forward (``cache``:
    a per-forward dict shared by the layers, or None)."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = ("flex_block_mask", T, offset, prefix_len, window, str(device))
    if cache is not None and key in cache:
        return cache[key]
    bm = create_block_mask(_mask_mod(prefix_len, window, offset), None, None, T, T + offset, device=device)
    if cache is not None:
        cache[key] = bm
    return bm


# ------------------------------------------------------------------ the path
def _flex_forward(op, q, k, v, vk, vv, vlogit, *, scale, prefix_len, window, positional, cache, compiled):
    """FlexAttention forward of one layer (see :func:`flex_attend`)."""
    from torch.nn.attention.flex_attention import AuxRequest

    B, H, T, dh = q.shape
    Hkv = k.shape[1]
    offset = 0
    if vk is not None:
        offset = 1
        k = torch.cat([vk.to(k.dtype)[None, :, None, :].expand(B, Hkv, 1, k.shape[-1]), k], dim=2)  # (B, H_kv, 1+T, d_h)
        v = torch.cat([vv.to(v.dtype)[None, :, None, :].expand(B, Hkv, 1, v.shape[-1]), v], dim=2)  # (B, H_kv, 1+T, d_h)
    block_mask = _block_mask(T, offset, prefix_len, window, q.device, cache)
    score_mod = _score_mod(positional, T, offset, q.device)
    kernel = flex_kernel(compiled)
    kw: dict[str, Any] = dict(score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=Hkv != H)
    if vlogit is not None:
        out, aux = kernel(q, k, v, return_aux=AuxRequest(lse=True), **kw)  # out (B, H, T, d_v), lse (B, H, T)
        keep = torch.sigmoid(aux.lse.float() - vlogit.float().view(1, H, 1))  # exp(LSE) / (exp(LSE) + exp(b_h))
        out = out * keep[..., None].to(out.dtype)
    else:
        out = kernel(q, k, v, **kw)
    return out * op.output_scale if op.output_scale != 1.0 else out


def _reference_forward(op, q, k, v, vk, vv, vlogit, *, scale, prefix_len, window, positional):
    """The same layer through the reference formula :func:`sinklab.nn.attention.attend_block`."""
    from sinklab.nn.attention import attend_block

    B, H, T, _ = q.shape
    mask = build_mask(T, prefix_len=prefix_len, window=window, device=q.device)
    pos = torch.arange(T, device=q.device)
    bias = positional.logit_bias(pos, pos) if positional.logit_bias_kind else None
    if vk is not None:
        vk = repeat_kv(vk.to(q.dtype)[None, :, None, :], H // vk.shape[0])  # (1, H, 1, d_h)
        vv = repeat_kv(vv.to(v.dtype)[None, :, None, :], H // vv.shape[0])
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
    return attend_block(op, q, k, v, mask, scale, bias=bias, vk=vk, vv=vv, vlogit=vlogit)[0]


class _FlexForwardReferenceBackward(torch.autograd.Function):
    """Forward through FlexAttention, backward through the reference formula (CPU training).

    ``apply(flex_fn, ref_fn, params, q, k, v, vk, vv, vlogit)``: ``flex_fn`` and ``ref_fn`` map
    ``(q, k, v, vk, vv, vlogit)`` to the layer's output (B, H, T, d_v); ``params`` are the
    positional encoding's parameters (T5's table) that ``ref_fn`` reads, whose gradients are
    returned too (they follow ``q, ..., vlogit`` in the inputs). The backward recomputes ``ref_fn``
    under autograd (one (B, H, T, T) float32 logit tensor) and returns its gradients: the gradient is
    the reference path's, the forward FlexAttention's (equal within float32 rounding).
    """

    @staticmethod
    def forward(ctx, flex_fn, ref_fn, n_params, *inputs):
        tensors = inputs[:6]
        ctx.ref_fn = ref_fn
        ctx.params = inputs[6:6 + n_params]
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            return flex_fn(*[None if t is None else t.detach() for t in tensors])

    @staticmethod
    def backward(ctx, dout):
        tensors = ctx.saved_tensors
        need = ctx.needs_input_grad[3:]
        with torch.enable_grad():
            xs = [None if t is None else t.detach().requires_grad_(bool(r)) for t, r in zip(tensors, need[:6])]
            out = ctx.ref_fn(*xs)
            wrt = [x for x in xs if x is not None and x.requires_grad]
            wrt += [p for p, r in zip(ctx.params, need[6:]) if r]
            grads = list(torch.autograd.grad(out, wrt, dout, allow_unused=True)) if wrt else []
        result = []
        for x in xs:
            result.append(grads.pop(0) if x is not None and x.requires_grad else None)
        for r in need[6:]:
            result.append(grads.pop(0) if r else None)
        return (None, None, None, *result)


def flex_attend(
    op,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    prefix_len: int = 0,
    window: int | None = None,
    positional=None,
    vk: Tensor | None = None,
    vv: Tensor | None = None,
    vlogit: Tensor | None = None,
    cache: dict | None = None,
    compiled: bool = True,
) -> Tensor:
    """One layer's attention through FlexAttention (softmax family; see the module docstring).

    Args:
        op: the :class:`~sinklab.nn.ops.AttentionOp`; must have ``op.sdpa`` (else ConfigError).
        q: (B, H, T, d_h) queries after positions (RoPE applied).
        k, v: (B, H_kv, T, d_h) and (B, H_kv, T, d_v) keys (after positions) and values,
            H_kv dividing H (grouped-query attention: ``enable_gqa``).
        scale: the logit scale (1 / sqrt(d_h)).
        prefix_len, window: the visibility rule (0-based positions, :mod:`sinklab.attention_masks`).
        positional: the :class:`~sinklab.nn.positional.Positional` (its logit bias becomes the
            score_mod), or None for none.
        vk, vv: (H_kv, d_h) virtual key and value, or None. vlogit: (H,) virtual logit with value
            0, or None (not both with ``vk``).
        cache: per-forward dict for the block mask (shared by the layers of one forward), or None.
        compiled: use ``torch.compile(flex_attention)`` (True) or the eager one.

    Returns:
        (B, H, T, d_v) in the dtype of ``v``.

    Raises:
        ConfigError: ``op`` is not in the softmax family.
    """
    if not type(op).sdpa:
        check_flex_operation(op_name(op))
    positional = _NoBias() if positional is None else positional
    kw = dict(scale=scale, prefix_len=prefix_len, window=window, positional=positional)
    tensors = (q, k, v, vk, vv, vlogit)
    params = [p for p in positional.parameters()]
    grad = torch.is_grad_enabled() and (any(t is not None and t.requires_grad for t in tensors)
                                        or any(p.requires_grad for p in params))
    if grad and q.device.type == "cpu":
        def flex_fn(*ts):
            return _flex_forward(op, *ts, **kw, cache=cache, compiled=compiled)

        def ref_fn(*ts):
            return _reference_forward(op, *ts, **kw)

        return _FlexForwardReferenceBackward.apply(flex_fn, ref_fn, len(params), *tensors, *params)
    return _flex_forward(op, *tensors, **kw, cache=cache, compiled=compiled)


class _NoBias:
    """Stands for "no positional encoding" when :func:`flex_attend` gets ``positional=None``."""

    logit_bias_kind = False

    def parameters(self):
        return iter(())


def op_name(op) -> str:
    """The registry name of an operation instance (``ATTENTION`` lookup), or its class name."""
    from sinklab.nn.ops import ATTENTION

    for n in ATTENTION.names():
        if ATTENTION.get(n) is type(op):
            return n
    return type(op).__name__
