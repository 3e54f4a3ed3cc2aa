"""FlexAttention for the softmax family (``model.attention_backend = "flex"``).

:func:`flex_attend` computes the operations that
:func:`torch.nn.attention.flex_attention.flex_attention` expresses exactly: a softmax over the
visible keys, a ``score_mod`` for the additive positional bias and the virtual key's logit, and a
``block_mask`` for the visibility rule. The operations it serves are those with ``op.sdpa``
(:func:`flex_operations`, :mod:`sinklab.nn.backend`); the others (sigmoid and ReLU without
normalisation, kernels, softpick, p-norms) have no softmax to hand to FlexAttention and use the
compiled tile path (:mod:`sinklab.nn.compiled`).

Notation: query position i, key position j (0-based), logit ``s_ij = scale * q_i . k_j`` with
``scale = 1 / sqrt(d_h)``, visible keys ``V(i)`` (:mod:`sinklab.attention_masks`):
``j in V(i)`` iff ``(j <= i or j < p)`` and, with a sliding window w, ``|i - j| < w``
(the :class:`~sinklab.attention_masks.MaskSpec` ``(causal, prefix_len=p, window=w)``; a
bidirectional model runs with p = T; ``causal=False`` drops the first condition).

Each operation as FlexAttention sees it (``mask_mod(b, h, i, kv)`` is ``j in V(i)``)::

    softmax, gated_headwise, gated_elementwise, diff (each of its two maps)
                         o_i = sum_{j in V(i)} exp(s_ij) v_j / sum_{j in V(i)} exp(s_ij)
                         (the gates and differential attention's combination act on o outside)
    softmax_scaled       alpha * the softmax output
    sink_token, kv_bias, k_bias, v_bias
                         a virtual key k* (value v*) at kv index 0, visible to every query, no
                         position; real key j sits at kv index j + 1
    softmax_off_by_one, sink_logit
                         a virtual key at kv index 0 with value 0 whose score the score_mod
                         replaces by b_h: exp(s) / (exp(b_h) + sum exp(s)); b_h = 0 for
                         off-by-one, learned for sink_logit (gpt-oss; its gradient flows through
                         the score_mod's captured tensor)

Positional biases as ``score_mod`` on real keys (RoPE acts on q and k before and needs none)::

    alibi   s_ij - m_h |i - j|                        (Press et al. 2022; slopes m_h)
    t5      s_ij + table[bucket(j - i), h]            (Raffel et al. 2020; learned table)
    other   s_ij + bias[h, i, j]                      (a dense (H, T, T) table: any logit_bias)

Gradients. On CUDA, FlexAttention's own backward kernel, which also differentiates the tensors the
score_mod captures (T5's table, the sink logit). **On CPU, PyTorch has no FlexAttention backward**
(torch 2.13 raises ``NotImplementedError`` eagerly and compiled), so when gradients are needed
:class:`_FlexCPU` runs the forward through FlexAttention and the backward by differentiating
PyTorch's own dense evaluation of the *same* ``score_mod`` and ``mask_mod``
(``torch._higher_order_ops.flex_attention.math_attention``: the score_mod vmapped over the
(b, h, q_idx, kv_idx) grid, float32, a (B, H, T, 1 + T) score tensor per layer). The CPU tests
therefore check the score_mods and mask_mods that FlexAttention differentiates on a GPU, not
FlexAttention's backward kernel itself, which only a GPU run can check. Under ``train.compile`` the
CPU Function runs outside the compiled graph (``torch.compiler.disable``: one graph break per layer;
dynamo tracing its backward failed for sink_logit), its FlexAttention call still compiled.

CPU kernel: ``torch.compile(flex_attention)`` on CPU (torch 2.13) gave NaN rows for a sequence
length of 40 (not a multiple of its 128 block) and correct ones for 64, 128, and 40 / 200 padded to
128 / 256, so on CPU the compiled kernel pads queries and keys to a multiple of 128 (padded keys
masked, padded rows dropped).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.attention_masks import CAUSAL, MaskSpec
from sinklab.errors import ConfigError

__all__ = ["flex_attend", "flex_kernel", "flex_operations", "check_flex_operation", "op_name"]

#: the CPU kernel pads T to a multiple of this (see the module docstring)
CPU_PAD = 128


def flex_operations() -> list[str]:
    """Names of the registered attention operations FlexAttention computes exactly (``op.sdpa``)."""
    from sinklab.nn.backend import served_by
    from sinklab.nn.ops import ATTENTION

    return [n for n in ATTENTION.names() if "flex" in served_by(ATTENTION.get(n))]


def check_flex_operation(name: str) -> None:
    """Raise :class:`ConfigError` unless FlexAttention computes operation ``name`` exactly."""
    from sinklab.nn.backend import check_backend

    check_backend("flex", name)


_COMPILED: dict[str, Callable] = {}


def flex_kernel(compiled: bool = True) -> Callable:
    """``flex_attention`` under ``torch.compile`` (the fused kernel; compiled once per shape and
    mask, about a minute on a busy 2-core CPU; dynamo's recompile limit raised to
    :data:`sinklab.nn.compiled.RECOMPILE_LIMIT`) or eager (``compiled=False``: PyTorch's unfused
    implementation, which materialises the (B, H, T, Tk) scores; for tests and debugging)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if "flex" not in _COMPILED:
        from sinklab.nn.compiled import RECOMPILE_LIMIT

        # one version per shape, mask and score_mod: dynamo's default limit of 8 would fall back to
        # eager silently after a few operations or masks in one process (as for the compiled tile path)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _COMPILED["flex"] = torch.compile(flex_attention, dynamic=False)
    return _COMPILED["flex"]


# ------------------------------------------------------------------ masks and score_mods
def _mask_mod(mask: MaskSpec, offset: int, n_kv: int, documents: Tensor | None = None):
    """``mask_mod(b, h, i, kv)``: key index kv (``offset`` = 1 with a virtual key at index 0;
    ``n_kv`` real + virtual keys, indices past it are padding) is visible from query i by the
    rule of :func:`sinklab.attention_masks.visible` under ``mask`` and, with ``documents`` (B, T)
    int ids, only inside query i's own document (the virtual key stays visible to every query)."""
    causal, prefix_len, window = mask.causal, mask.prefix_len, mask.window
    last = None if documents is None else documents.shape[1] - 1

    def mask_mod(b, h, q_idx, kv_idx):
        j = kv_idx - offset
        vis = ((j <= q_idx) | (j < prefix_len)) if causal else (kv_idx >= 0)
        if window is not None:
            vis = vis & ((q_idx - j).abs() < window)
        if documents is not None:  # (padded rows and keys clamped to a real index; masked below / dropped)
            vis = vis & (documents[b, q_idx.clamp(0, last)] == documents[b, j.clamp(0, last)])
        if offset:
            vis = vis | (kv_idx == 0)
        return vis & (kv_idx < n_kv)

    return mask_mod


def _score_mod_parts(positional, T: int, device) -> tuple[Callable | None, list[Tensor]]:
    """The positional bias as ``(bias_fn, tensors)``: ``bias_fn(tensors, h, i, j)`` is the bias of
    real key j for query i in head h, computed from the captured ``tensors`` (ALiBi's slopes (H,),
    T5's table (num_buckets, H), or a dense (H, T, T) table); (None, []) without a logit bias."""
    if positional is None or not positional.logit_bias_kind:
        return None, []
    from sinklab.nn.positional import ALiBi, T5Relative, t5_bucket

    if isinstance(positional, ALiBi):
        def bias(ts, h, i, j):
            return -ts[0][h] * (i - j).abs()

        return bias, [positional.slopes.to(device)]
    if isinstance(positional, T5Relative):
        nb, md = positional.num_buckets, positional.max_distance

        def bias(ts, h, i, j):
            return ts[0][t5_bucket(j - i, nb, md), h]

        return bias, [positional.bias.weight]
    pos = torch.arange(T, device=device)

    def bias(ts, h, i, j):
        return ts[0][h, i.clamp(0, T - 1), j.clamp(0, T - 1)]

    return bias, [positional.logit_bias(pos, pos)]


def _make_score_mod(bias_fn, offset: int, virtual_logit: bool, tensors: list[Tensor]) -> Callable | None:
    """``score_mod(score, b, h, i, kv)`` from the captured ``tensors`` (the bias tensors, then the
    virtual logit (H,) if ``virtual_logit``): adds the bias to real keys (kv >= offset) and, with a
    virtual logit, replaces the virtual key's score (kv = 0) by ``vlogit[h]``. None if it would be
    the identity."""
    if bias_fn is None and not virtual_logit:
        return None
    n_bias = len(tensors) - (1 if virtual_logit else 0)
    bias_ts = tensors[:n_bias]
    vlogit = tensors[-1] if virtual_logit else None

    def score_mod(score, b, h, q_idx, kv_idx):
        if bias_fn is not None:
            add = bias_fn(bias_ts, h, q_idx, kv_idx - offset).to(score.dtype)
            score = torch.where(kv_idx >= offset, score + add, score) if offset else score + add
        if vlogit is not None:
            score = torch.where(kv_idx == 0, vlogit[h].to(score.dtype), score)
        return score

    return score_mod


def _block_mask(Tq: int, Tkv: int, mask_mod, key: tuple, device, cache: dict | None, batch: int | None = None):
    """The (Tq, Tkv) :class:`BlockMask` of ``mask_mod``, built once per forward (``cache``: a
    per-forward dict shared by the layers, or None); one per batch row when ``batch`` is given
    (a document mask), else broadcast over the batch."""
    from torch.nn.attention.flex_attention import create_block_mask

    key = ("flex_block_mask", Tq, Tkv, batch, *key, str(device))
    if cache is not None and key in cache:
        return cache[key]
    bm = create_block_mask(mask_mod, batch, None, Tq, Tkv, device=device)
    if cache is not None:
        cache[key] = bm
    return bm


# ------------------------------------------------------------------ the CPU autograd function
class _FlexCPU(torch.autograd.Function):
    """FlexAttention forward, backward through the dense evaluation of the same score_mod/mask_mod.

    ``apply(run, make_score_mod, mask_mod, scale, n_tensors, q, k, v, *tensors)``: ``run(q, k, v,
    score_mod)`` is the FlexAttention call (no grad, detached inputs); ``make_score_mod(tensors)``
    builds the score_mod from the captured tensors (the forward gets detached ones, the backward
    ones that require grad); q (B, H, T, d), k (B, H_kv, Tk, d), v (B, H_kv, Tk, d_v). Backward:
    ``math_attention`` (PyTorch's eager FlexAttention, differentiable ops only) recomputed under
    autograd with the same score_mod and mask_mod; gradients for q, k, v and every captured tensor
    that requires grad.
    """

    @staticmethod
    def forward(ctx, run, make_score_mod, mask_mod, scale, q, k, v, *tensors):
        ctx.make_score_mod, ctx.mask_mod, ctx.scale = make_score_mod, mask_mod, scale
        ctx.save_for_backward(q, k, v, *tensors)
        with torch.no_grad():
            return run(q.detach(), k.detach(), v.detach(), make_score_mod([t.detach() for t in tensors]))

    @staticmethod
    def backward(ctx, dout):
        from torch._higher_order_ops.flex_attention import math_attention

        saved = ctx.saved_tensors
        need = ctx.needs_input_grad[4:]
        with torch.enable_grad():
            xs = [t.detach().requires_grad_(bool(r) and t.is_floating_point()) for t, r in zip(saved, need)]
            q, k, v, *ts = xs
            out = math_attention(q, k, v, ctx.make_score_mod(ts) or _identity, (ctx.mask_mod,), ctx.scale, {})[0]
            wrt = [x for x in xs if x.requires_grad]
            grads = iter(torch.autograd.grad(out, wrt, dout.to(out.dtype), allow_unused=True) if wrt else [])
        result = [next(grads) if x.requires_grad else None for x in xs]
        return (None, None, None, None, *result)


def _identity(score, b, h, q_idx, kv_idx):
    return score


@torch.compiler.disable
def _flex_cpu(run, make_score_mod, mask_mod, scale, q, k, v, *tensors):
    """:class:`_FlexCPU` run outside any enclosing ``torch.compile`` (``train.compile = true``):
    dynamo would trace its backward, whose ``math_attention`` vmaps the score_mod, and fails on a
    captured tensor the score_mod indexes (sink_logit's ``vlogit[h]``: "vmap over ApplyTemplate").
    The FlexAttention call inside still runs its own compiled kernel (``flex_kernel``)."""
    return _FlexCPU.apply(run, make_score_mod, mask_mod, scale, q, k, v, *tensors)


# ------------------------------------------------------------------ the path
def flex_attend(
    op,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    mask: MaskSpec = CAUSAL,
    positional=None,
    vk: Tensor | None = None,
    vv: Tensor | None = None,
    vlogit: Tensor | None = None,
    cache: dict | None = None,
    compiled: bool = True,
    documents: Tensor | None = None,
) -> Tensor:
    """One layer's attention through FlexAttention (softmax family; see the module docstring).

    Args:
        op: the :class:`~sinklab.nn.ops.AttentionOp`; its class must have ``sdpa`` (else ConfigError).
        q: (B, H, T, d_h) queries after positions (RoPE applied).
        k, v: (B, H_kv, T, d_h) and (B, H_kv, T, d_v) keys (after positions) and values,
            H_kv dividing H (grouped-query attention: ``enable_gqa``).
        scale: the logit scale (1 / sqrt(d_h)).
        mask: the visibility rule (:class:`~sinklab.attention_masks.MaskSpec`, 0-based positions).
        positional: the :class:`~sinklab.nn.positional.Positional` (its logit bias becomes the
            score_mod), or None for none.
        vk, vv: (H_kv, d_h), (H_kv, d_v) virtual key and value, or None. vlogit: (H,) logit of a
            virtual key with value 0, or None (not both with ``vk``).
        cache: per-forward dict for the block mask (shared by the layers of one forward), or None.
        compiled: ``torch.compile(flex_attention)`` (True) or the eager one.
        documents: (B, T) int document ids (intra-document masking: a per-row block mask from
            ``documents[b, i] == documents[b, j]``), or None.

    Returns:
        (B, H, T, d_v) in the dtype of ``v``.

    Raises:
        ConfigError: ``op`` is not in the softmax family.
    """
    if not type(op).sdpa:
        check_flex_operation(op_name(op))
    if vk is not None and vlogit is not None:
        raise ConfigError("flex_attend takes a virtual key/value or a virtual logit, not both")
    B, H, T, dh = q.shape
    Hkv = k.shape[1]
    offset = 0
    if vk is not None or vlogit is not None:
        offset = 1
        if vk is None:  # the virtual logit's key: any key (its score is replaced), value 0
            vk, vv = k.new_zeros(Hkv, k.shape[-1]), v.new_zeros(Hkv, v.shape[-1])
        k = torch.cat([vk.to(k.dtype)[None, :, None, :].expand(B, Hkv, 1, k.shape[-1]), k], dim=2)  # (B, H_kv, 1+T, d_h)
        v = torch.cat([vv.to(v.dtype)[None, :, None, :].expand(B, Hkv, 1, v.shape[-1]), v], dim=2)  # (B, H_kv, 1+T, d_v)
    n_kv = T + offset
    pad_q = pad_kv = 0
    if compiled and q.device.type == "cpu":
        pad_q, pad_kv = -T % CPU_PAD, -n_kv % CPU_PAD
    mask_mod = _mask_mod(mask, offset, n_kv, documents)
    doc_key = None if documents is None else id(documents)  # the cache is per forward: the ids' tensor identifies them
    block_mask = _block_mask(T + pad_q, n_kv + pad_kv, mask_mod, (mask, offset, n_kv, doc_key), q.device, cache,
                             batch=None if documents is None else B)
    bias_fn, tensors = _score_mod_parts(positional, T, q.device)
    if vlogit is not None:
        tensors = [*tensors, vlogit.float().to(q.device)]

    def make(ts):
        return _make_score_mod(bias_fn, offset, vlogit is not None, ts)

    kernel = flex_kernel(compiled)

    def run(q_, k_, v_, score_mod):
        if pad_q or pad_kv:
            q_, k_, v_ = F.pad(q_, (0, 0, 0, pad_q)), F.pad(k_, (0, 0, 0, pad_kv)), F.pad(v_, (0, 0, 0, pad_kv))
        out = kernel(q_, k_, v_, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=Hkv != H)
        return out[:, :, :T] if pad_q else out

    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *tensors))
    if grad and q.device.type == "cpu":
        out = _flex_cpu(run, make, mask_mod, scale, q, k, v, *tensors)
    else:
        out = run(q, k, v, make(tensors))
    out = out.to(v.dtype)
    return out * op.output_scale if op.output_scale != 1.0 else out


def op_name(op) -> str:
    """The registry name of an operation instance (``ATTENTION`` lookup), or its class name."""
    from sinklab.nn.ops import ATTENTION

    for n in ATTENTION.names():
        if ATTENTION.get(n) is type(op):
            return n
    return type(op).__name__
