"""The one attention module, its masks, and its paths.

:class:`Attention` owns the projections, positions, the optional output gate and the
output projection; *how* logits become weights is the operation ``self.op``, chosen
by name from :data:`ATTENTION` (see :mod:`sinklab.nn.ops` for the list).

``Attention.forward`` = projections + positions + the first entry of the registry :data:`ATTENTION_PATHS`
that takes the pass (:meth:`Attention.path` names it; tests check the paths agree):

* **cached**: incremental decoding with a KV cache (streaming, :class:`sinklab.streaming.SinkCache`).
* **observed**: :func:`reference_attention`, plain matmul-mask-normalise over the full
  T x T, used when an observer asks for the weights.
* **flex**: FlexAttention (:mod:`sinklab.nn.flex`): ``attention_backend = "flex"``, or ``"auto"`` on CUDA for the
  softmax family.
* **compiled**: ``attention_backend = "compiled"``, the tile path below with its per-tile functions
  under ``torch.compile``.
* **sdpa**: ``F.scaled_dot_product_attention`` for operations it expresses exactly
  (``op.sdpa``): softmax, scaled softmax, and every softmax with a virtual key
  (sink token, key/value biases: an extra key/value column; off-by-one and the sink
  logit: an extra column whose logit is a constant, via one extra head dimension).
* **tile**: operations with ``op.has_tile_grad`` (every non-SDPA operation without a virtual key) run
  in :class:`_TileAttention`, an autograd function over query tiles whose backward recomputes each
  tile's scores and applies the operation's analytic gradient (:meth:`AttentionOp.tile_grad`); a tile's
  element-wise work runs in :mod:`sinklab.nn.native`'s fused kernels where they take it (bit for bit the same).
* **chunked** (memory-frugal, takes every pass): the other operations, queries in chunks of at most
  ``chunk_elems`` logits, only the key range a chunk can see, each chunk under activation checkpointing
  when gradients are needed.

The tile and chunked paths are loops of :func:`sinklab.attention_masks.reduce_tiles`, the one blocked-attention
driver (mask -> key ranges of :func:`~sinklab.attention_masks.query_blocks` -> tiles; also that of the blockwise
capture and the streaming sink + window attention), each with its per-tile reducer: the tile path's output
(:class:`_TileOutput`) and gradient (:class:`_TileGradient`), with plain or compiled per-tile functions, and the
chunked path's checkpointed output (:class:`_ChunkOutput`); :class:`_MaskedTiles` gives a tile reducer its
tile's mask and bias.

Masks (0-based positions, :class:`sinklab.attention_masks.MaskSpec`, shared with the capture code):
query i sees key j iff ``(j <= i or j < prefix_len)`` and, with a sliding window w, ``|i - j| < w``.
The prefix is bidirectional (prefix LM). With document ids (``SinkLM.forward(document_ids=)``,
packed training windows) query i also sees key j only inside its own document (intra-document
masking, every path); masks are then (B, 1, C, Tk) per window instead of (C, Tk).
"""

from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from sinklab.attention_masks import (CAUSAL, MaskSpec, TileReducer, build_mask, reduce_tiles, repeat_kv, same_document,
                                     visible)
from sinklab.errors import ConfigError
import sinklab.nn.native as native
from sinklab.nn.backend import check_backend, resolve as resolve_backend
from sinklab.nn.norm import NORM
from sinklab.nn.ops import ATTENTION, AttentionOp
from sinklab.nn.positional import Positional
from sinklab.registry import Registry

__all__ = ["ATTENTION", "ATTENTION_PATHS", "Attention", "AttentionOptions", "AttentionPath", "AttnContext", "MaskSpec",
           "paths_taken", "visible", "build_mask",
           "reference_attention", "attend_block", "bind_options", "wants_raw_weights"]


@dataclass(frozen=True)
class AttentionOptions:
    """How :class:`Attention` computes, not what: speed and memory switches of its paths. Every
    setting gives the same attention (the paths agree within float rounding; tests check it).

    Pass one to ``SinkLM(config, attention_options=...)`` (or :meth:`sinklab.nn.SinkLM.set_attention_options`);
    the defaults are what ``sinklab train`` uses.

    Attributes:
        chunk_elems: logits per query chunk on the chunked path (memory bound).
        checkpoint_chunks: recompute chunks in the backward pass instead of storing them.
        tile_autograd: operations with an analytic tile gradient train through :class:`_TileAttention`.
        tile_elems: logits per query chunk of :class:`_TileAttention` (small tiles stay in cache).
        fused_qkv: one matmul with the stacked weight [W_q; W_k; W_v] instead of three (same result;
            the parameters stay q_proj/k_proj/v_proj).
        cpu_fp32_sdpa_backward: on CPU, train the SDPA path in float32 even under bf16/fp16 autocast; under
            bf16 only up to ``cpu_fp32_sdpa_max_keys`` keys. PyTorch's fused bf16 CPU attention (forward +
            backward) is slower than float32's at short sequences and faster at long ones (torch 2.13, AMD EPYC,
            head widths 32-128: bf16 / float32 CPU time 0.99-2.05x at T <= 256, 0.90-1.10x at 512, 0.78-0.87x
            at T >= 1024; ``benchmarks/sdpa_dtype_cpu.py``, ``benchmarks/results/sdpa_dtype_cpu.json``). float16
            is upcast at every length (not measured). Forward-only passes stay in half precision.
        cpu_fp32_sdpa_max_keys: the longest sequence (keys T, a virtual key not counted) for which
            ``cpu_fp32_sdpa_backward`` upcasts bf16; None: at every length.
        causal_virtual_key: plain causal attention with a virtual key uses SDPA's causal kernel (one
            dummy query row in front) instead of an explicit (T, 1+T) mask.
        attention_backend: which kernel computes the attention (:mod:`sinklab.nn.backend`: "auto",
            "reference", "flex", "compiled"); None (the default) = the model config's
            ``attention_backend`` (``model.attention_backend``), filled in by :func:`bind_options`
            when a layer is built, so a layer's ``options.attention_backend`` is always a name.
        flex_compiled: the flex backend uses ``torch.compile(flex_attention)`` (False: PyTorch's
            eager, unfused one).
    """

    chunk_elems: int = 1 << 23
    checkpoint_chunks: bool = True
    tile_autograd: bool = True
    tile_elems: int = 1 << 20
    fused_qkv: bool = True
    cpu_fp32_sdpa_backward: bool = True
    cpu_fp32_sdpa_max_keys: int | None = 512
    causal_virtual_key: bool = True
    attention_backend: str | None = None
    flex_compiled: bool = True


def bind_options(options: AttentionOptions | None, config) -> AttentionOptions:
    """``options`` (None: the defaults) for a layer of a model with ``config`` (a
    :class:`sinklab.nn.ModelConfig`): ``attention_backend=None`` becomes the config's
    ``attention_backend``; an explicit one is checked against the config's operation and
    positional encoding (:func:`sinklab.nn.backend.check_backend`).

    Raises:
        ConfigError: the backend cannot compute the config's operation.
    """
    options = AttentionOptions() if options is None else options
    if options.attention_backend is None:
        return replace(options, attention_backend=getattr(config, "attention_backend", "auto"))
    check_backend(options.attention_backend, config.attention, positional=getattr(config, "positional", None))
    return options


def wants_raw_weights(observer: "Observer") -> bool:
    """Whether ``observer`` asked for the raw (not renormalised) weights of operations whose rows do
    not sum to 1 (sigmoid/ReLU without normalisation, kernels, ...): its attribute
    ``raw_weights = True``; they are then flagged ``renormalised=False``. DESIGN.md asks for the sink
    metric with and without renormalisation for those operations."""
    return bool(getattr(observer, "raw_weights", False))


#: Observer signature: observer(layer_idx, weights (B, H, T, T), *, renormalised, extra (B, H, T) | None,
#: key (B, H_kv, T, d_h), value (B, H_kv, T, d_h)), plus ``query`` and ``mask`` when it asks for them
#: (``wants_query`` / ``wants_mask``, see ``Attention._observed``).
Observer = Callable[..., None]


@dataclass
class AttnContext:
    """What every layer of one forward pass shares: length, mask, positions.

    ``mask`` is the :class:`~sinklab.attention_masks.MaskSpec` of the pass (prefix, window);
    ``documents`` (B, T) int document ids or None (intra-document masking, ANDed with ``mask``);
    ``bool_mask()`` its (T, T) tensor, (B, 1, T, T) with documents. ``sdpa_mask`` is None for plain causal attention (SDPA's
    ``is_causal``). ``full_bias()`` is the (H, T, T) positional logit bias, computed once and
    shared by all layers.
    """

    T: int
    device: torch.device
    positional: Positional
    mask: MaskSpec = CAUSAL
    pos_state: Any = None
    kv_cache: Any = None  # incremental decoding: an object with ``layers[l].update(k, v, position_ids=)`` and ``.kept``
    position_ids: Tensor | None = None  # (1, T) positions of the new tokens when ``kv_cache`` is set
    documents: Tensor | None = None  # (B, T) int document ids: each query sees only keys of its own document
    _mask: Tensor | None = field(default=None, repr=False)
    _bias: Tensor | None = field(default=None, repr=False)
    _sdpa_masks: dict = field(default_factory=dict, repr=False)
    _flex_masks: dict = field(default_factory=dict, repr=False)  # FlexAttention block masks, shared by the layers

    @property
    def plain_causal(self) -> bool:
        """True when the mask over the T positions is the plain lower triangle (:meth:`MaskSpec.plain_causal`)
        and there are no document ids."""
        return self.documents is None and self.mask.plain_causal(self.T)

    def bool_mask(self) -> Tensor:
        """(T, T) bool visibility mask, True = may attend ((B, 1, T, T) with document ids; built once)."""
        if self._mask is None:
            self._mask = build_mask(self.T, mask=self.mask, device=self.device, documents=self.documents)
        return self._mask

    def sdpa_mask(self, *, virtual: bool, dtype: torch.dtype) -> Tensor | None:
        """The ``attn_mask`` SDPA needs, built once per forward and shared by all layers.

        None for plain causal attention without bias or virtual key (use ``is_causal``);
        else (T, T) bool, or (1, H, T, T) float with the positional bias and -inf where
        masked; with ``virtual`` a first column for the virtual key (visible, bias 0). With
        document ids the leading 1 (or the missing batch axis of the bool mask) is B:
        (B, 1, T, [1+]T) bool, (B, H, T, [1+]T) float.
        """
        key = (virtual, dtype)
        if key not in self._sdpa_masks:
            bias = self.full_bias()  # (H, T, T) or None
            if bias is None and not virtual and self.plain_causal:
                m = None
            elif bias is None:
                m = self.bool_mask()  # (T, T) bool, (B, 1, T, T) with documents
                if virtual:
                    m = torch.cat([torch.ones(*m.shape[:-1], 1, dtype=torch.bool, device=self.device), m], dim=-1)
            else:
                if self.documents is None:
                    m = bias.to(dtype).masked_fill(~self.bool_mask(), float("-inf"))[None]  # (1, H, T, T)
                else:
                    m = bias.to(dtype)[None].masked_fill(~self.bool_mask(), float("-inf"))  # (B, H, T, T)
                if virtual:
                    m = torch.cat([m.new_zeros(*m.shape[:-1], 1), m], dim=-1)  # (1 | B, H, T, 1+T)
            self._sdpa_masks[key] = m
        return self._sdpa_masks[key]

    def full_bias(self) -> Tensor | None:
        """(H, T, T) float32 positional logit bias, or None (built once per forward)."""
        if self._bias is None and self.positional.logit_bias_kind:
            pos = torch.arange(self.T, device=self.device)
            self._bias = self.positional.logit_bias(pos, pos)
        return self._bias


# ====================================================== reference math
def attend_block(
    op: AttentionOp,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor,
    scale: float,
    *,
    bias: Tensor | None = None,
    vk: Tensor | None = None,
    vv: Tensor | None = None,
    vlogit: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Matmul-mask-normalise for a block of queries (the reference formula).

    Args:
        op: the attention operation.
        q: (B, H, C, d_h) queries (after positions). k, v: (B, H, Tk, d_h), kv heads
            already repeated to H.
        mask: (C, Tk) bool, True = visible, or (B, 1, C, Tk) (a document mask per window).
        scale: logit scale (1 / sqrt(d_h)).
        bias: (H, C, Tk) positional logit bias or None.
        vk, vv: (1, H, 1, d_h) virtual key / value, or None.
        vlogit: (H,) logit of a virtual key with value 0, or None.

    Returns:
        out (B, H, C, d_h) in v's dtype; weights (B, H, C, Tk) float32 (raw, as the
        operation defines them); weight on the virtual key (B, H, C, 1) or None.
    """
    B, H, C, _ = q.shape
    logits = torch.matmul(op.feature_map(q), op.feature_map(k).transpose(-2, -1)).float() * scale  # (B, H, C, Tk)
    if bias is not None:
        logits = logits + bias
    extra = None
    if vk is not None:
        extra = torch.matmul(q, vk.transpose(-2, -1)).float() * scale  # (B, H, C, 1)
    elif vlogit is not None:
        extra = vlogit.float().view(1, H, 1, 1).expand(B, H, C, 1)  # (B, H, C, 1)
    w, w_extra = op.normalise(logits, mask, extra)
    out = torch.matmul(w.to(v.dtype), v)  # (B, H, C, d_h)
    if w_extra is not None and vv is not None:
        out = out + w_extra.to(v.dtype) * vv
    return out, w, w_extra


def reference_attention(
    op: AttentionOp,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float | None = None,
    mask: MaskSpec = CAUSAL,
    bias: Tensor | None = None,
    vk: Tensor | None = None,
    vv: Tensor | None = None,
    vlogit: Tensor | None = None,
    documents: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Raw (not renormalised) attention of one operation over a whole sequence.

    Args:
        q: (B, H, T, d_h); k, v: (B, H_kv, T, d_h) (repeated here to H heads).
        scale: defaults to 1 / sqrt(d_h). mask: the causal mask with its prefix and window
            (:class:`~sinklab.attention_masks.MaskSpec`, 0-based positions).
        bias: (H, T, T) positional logit bias. vk, vv: (H_kv, d_h) virtual key/value.
        vlogit: (H,) virtual logit with zero value.
        documents: (B, T) int document ids: each query sees only keys of its own document (the
            virtual key stays visible to every query); None = no document mask.

    Returns:
        out (B, H, T, d_h), weights (B, H, T, T) float32, virtual-key weight (B, H, T, 1) or None.
    """
    B, H, T, dh = q.shape
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, T, d_h)
    if vk is not None:
        vk = repeat_kv(vk[None, :, None, :], H // vk.shape[0])  # (H_kv, d_h) -> (1, H, 1, d_h)
        vv = repeat_kv(vv[None, :, None, :], H // vv.shape[0])
    return attend_block(op, q, k, v, build_mask(T, mask=mask, device=q.device, documents=documents), scale, bias=bias,
                        vk=vk, vv=vv, vlogit=vlogit)


# ====================================================== tile autograd
def _tile_scores(q: Tensor, k: Tensor, op: AttentionOp, mask: Tensor, bias: Tensor | None, scale: float,
                 mask_logits: bool = True) -> Tensor:
    """(B*H, C, Tk) float32 logits ``scale * q.k (+ bias)``, -inf where masked if ``op.mask_as_bias`` (and
    ``mask_logits``: False leaves them out where no bias is added, for :mod:`sinklab.nn.native`'s kernels, which
    read masked logits as -inf; the visible logits have the same bits either way).

    q: (B, H, C, d_h), k: (B, H, Tk, d_h), mask (C, Tk) or (B*H, C, Tk) bool (:func:`_tile_mask`),
    bias (H, C, Tk) or None.
    """
    B, H, C, dh = q.shape
    add = None
    if op.mask_as_bias and (mask_logits or bias is not None):
        add = torch.zeros(mask.shape, device=q.device).masked_fill_(~mask, float("-inf"))  # (C, Tk) | (B*H, C, Tk)
    if bias is not None:
        if add is not None and add.dim() == 3:  # a per-window (document) mask: bias per head, then flattened
            add = (bias.float() + add.view(B, H, C, -1)).reshape(B * H, C, -1)
        else:
            add = bias.float() if add is None else bias.float() + add  # (H, C, Tk)
            add = add.expand(B, H, C, add.shape[-1]).reshape(B * H, C, -1)
    q3 = q.reshape(B * H, C, dh).float()
    kT = k.reshape(B * H, -1, dh).float().transpose(1, 2)  # (B*H, d_h, Tk)
    if add is None and op.mask_as_bias:  # the logits baddbmm gives with a 0 bias, without copying one in
        return torch.baddbmm(q3.new_zeros(()), q3, kT, beta=0.0, alpha=scale)
    if add is None:
        return torch.bmm(q3, kT).mul_(scale)
    return torch.baddbmm(add, q3, kT, alpha=scale)


def _mask_logits(s: Tensor, op: AttentionOp, mask: Tensor, bias: Tensor | None, left_out: bool) -> Tensor:
    """``s`` with the -inf of masked keys that :func:`_tile_scores` left out for a fused kernel (``left_out``), for
    the eager tile functions where the kernel declined the tile after all; else ``s`` as it is."""
    if left_out and op.mask_as_bias and bias is None:
        s.masked_fill_(~mask, float("-inf"))
    return s


def _tile_mask(mask: Tensor, B: int, H: int) -> Tensor:
    """A tile's mask as the tile functions use it: (C, Tk) unchanged, a per-window (document) mask
    (B, 1, C, Tk) expanded to the (B*H, C, Tk) of the flattened scores."""
    if mask.dim() == 2:
        return mask
    return mask.expand(B, H, *mask.shape[-2:]).reshape(B * H, *mask.shape[-2:])


def tile_forward(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, bias: Tensor | None, op: AttentionOp,
                 scale: float) -> Tensor:
    """One tile's output: q (B, H, C, d_h), k (B, H, Tk, d_h), v (B, H, Tk, d_v), mask (C, Tk) bool
    (or (B, 1, C, Tk): a document mask per window),
    bias (H, C, Tk) or None -> (B, H, C, d_v) in v's dtype (the weights ``op.tile_weights`` in float32).
    The function :mod:`sinklab.nn.compiled` compiles."""
    B, H, C, _ = q.shape
    mask = _tile_mask(mask, B, H)
    fused = native.takes(op, q.device, (B * H, C, k.shape[2]))  # the fused kernel (the same bits) takes the tile
    s = _tile_scores(q, k, op, mask, bias, scale, mask_logits=not fused)  # (B*H, C, Tk)
    w = native.tile_weights(op, s, mask, v.dtype) if fused else None  # in v's dtype where the kernel can
    if w is None:
        w, _ = op.tile_weights(_mask_logits(s, op, mask, bias, fused), mask)
    vc = v.reshape(B * H, v.shape[2], -1)
    return torch.bmm(w.to(v.dtype), vc).view(B, H, C, -1)


def tile_backward(q: Tensor, k: Tensor, v: Tensor, dout: Tensor, mask: Tensor, bias: Tensor | None, op: AttentionOp,
                  scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """One tile's gradients (float32): the tile's scores and weights recomputed, ``dW = dO V^T``,
    ``dS = op.tile_grad(...)``; returns dq (B, H, C, d_h), and this tile's contributions to dk
    (B, H, Tk, d_h) and dv (B, H, Tk, d_v). Shapes of the inputs as in :func:`tile_forward`, dout
    (B, H, C, d_v). The function :mod:`sinklab.nn.compiled` compiles."""
    B, H, C, dh = q.shape
    Tk = k.shape[2]
    mask = _tile_mask(mask, B, H)
    qc = q.reshape(B * H, C, dh).float()
    kc = k.reshape(B * H, Tk, dh).float()
    vc = v.reshape(B * H, Tk, -1).float()
    do = dout.reshape(B * H, C, -1).float()
    fused = native.takes(op, q.device, (B * H, C, Tk))
    s = _tile_scores(q, k, op, mask, bias, scale, mask_logits=not fused)
    dw = torch.bmm(do, vc.transpose(1, 2))  # (B*H, C, Tk)
    w = native.tile_backward(op, s, mask, dw) if fused else None  # fused: W into s, dS into dw (the same bits)
    eager, aux = w is None, None
    if eager:
        w, aux = op.tile_weights(_mask_logits(s, op, mask, bias, fused), mask)  # (B*H, C, Tk)
    dv = torch.bmm(w.transpose(1, 2), do).view(B, H, Tk, -1)  # before tile_grad, which may overwrite w
    ds = op.tile_grad(w, aux, dw, mask) if eager else dw  # (B*H, C, Tk)
    dq = torch.bmm(ds, kc).mul_(scale).view(B, H, C, dh)
    dk = torch.bmm(ds.transpose(1, 2), qc).mul_(scale).view(B, H, Tk, dh)
    return dq, dk, dv


class _TileAttention(torch.autograd.Function):
    """Query-chunked attention of an operation with an analytic tile gradient.

    Forward: for each chunk of queries, logits over the keys the chunk can see (one
    GEMM with the mask folded in), weights by ``op.tile_weights``, output ``W V``; only
    q, k, v are kept. Backward: per chunk, the logits and weights are recomputed (one
    GEMM), ``dW = dO V^T``, ``dV += W^T dO``, ``dS = op.tile_grad(...)``,
    ``dQ = scale dS K``, ``dK += scale dS^T Q``. Memory: one (B, H, C, Tk) tile (plus a
    few of the operation's temporaries) at a time, nothing T x T kept. The loop over tiles is
    :func:`~sinklab.attention_masks.reduce_tiles` with the reducers :class:`_TileOutput` (forward) and
    :class:`_TileGradient` (backward); the per-tile work is :func:`tile_forward` / :func:`tile_backward`,
    with ``compiled`` their ``torch.compile``d versions (:mod:`sinklab.nn.compiled`), the loop staying in
    Python.
    """

    @staticmethod
    def forward(ctx, q, k, v, op, scale, chunk, spec, positional, compiled=False, documents=None):
        # q (B, H, T, d_h) after phi; k, v (B, H, T, d_h) after phi (k) and kv-head repetition
        T = q.shape[2]
        fwd = tile_forward
        if compiled:
            from sinklab.nn.compiled import compiled_tile_functions

            fwd = compiled_tile_functions(tile_forward, tile_backward)[0]
        # float32 q, k and v in (B, H, T, d) order once per layer: every tile's (B*H, C | Tk, d) operand is then a
        # view, not a copy per tile (the projections hand over transposed views); v keeps its dtype (W V in it)
        tiles = _TileOutput(fwd, q.float().contiguous(), k.float().contiguous(), v.contiguous(), op, scale, spec,
                            positional, documents)
        with torch.autocast(q.device.type, enabled=False), torch.no_grad():
            out = reduce_tiles(tiles, T, chunk, spec)
        ctx.save_for_backward(q, k, v)
        ctx.op, ctx.scale, ctx.chunk, ctx.spec, ctx.positional = op, scale, chunk, spec, positional
        ctx.compiled, ctx.documents = compiled, documents
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        op, scale = ctx.op, ctx.scale
        T = q.shape[2]
        bwd = tile_backward
        if ctx.compiled:
            from sinklab.nn.compiled import compiled_tile_functions

            bwd = compiled_tile_functions(tile_forward, tile_backward)[1]
        tiles = _TileGradient(bwd, q.float().contiguous(), k.float().contiguous(), v.float().contiguous(),
                              dout.float().contiguous(), op, scale, ctx.spec, ctx.positional, ctx.documents)
        with torch.autocast(q.device.type, enabled=False), torch.no_grad():
            dq, dk, dv = reduce_tiles(tiles, T, ctx.chunk, ctx.spec)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, None


def _tile_mask_bias(i0: int, i1: int, j0: int, j1: int, mask: MaskSpec, positional: Positional, device,
                    documents: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """The tile of queries [i0, i1) and keys [j0, j1) (0-based): its (C, Tk) bool mask under ``mask`` ((B, 1, C, Tk)
    with ``documents`` (B, T): :func:`~sinklab.attention_masks.same_document` ANDed in) and its (H, C, Tk) logit
    bias (or None). What every tiled path of the model (tile, compiled tile, chunked) attends a tile with."""
    qpos = torch.arange(i0, i1, device=device)
    kpos = torch.arange(j0, j1, device=device)
    m = visible(qpos, kpos, mask)
    if documents is not None:
        m = m & same_document(documents, qpos, kpos)
    return m, positional.logit_bias(qpos, kpos)


class _MaskedTiles(TileReducer):
    """A reducer of the tile path (:func:`~sinklab.attention_masks.reduce_tiles` over the query chunks): each
    tile of query rows [i0, i1) and keys [j0, j1) (0-based) comes with its mask and bias
    (:func:`_tile_mask_bias` of ``spec``, ``positional`` and ``documents`` (B, T) or None) to :meth:`masked`."""

    def __init__(self, spec: MaskSpec, positional: Positional, device, documents: Tensor | None) -> None:
        self.spec, self.positional, self.device, self.documents = spec, positional, device, documents

    def tile(self, i0: int, i1: int, j0: int, j1: int) -> None:
        self.masked(i0, i1, j0, j1, *_tile_mask_bias(i0, i1, j0, j1, self.spec, self.positional, self.device,
                                                      self.documents))

    def masked(self, i0: int, i1: int, j0: int, j1: int, mask: Tensor, bias: Tensor | None) -> None:
        raise NotImplementedError


class _TileOutput(_MaskedTiles):
    """The tile path's output reducer: rows [i0, i1) of the (B, H, T, d_v) output (v's dtype) are
    ``fwd(q, k, v, mask, bias, op, scale)`` of their tile (:func:`tile_forward` or its compiled version);
    a chunk that sees no key gets zeros. q (B, H, T, d_h) after phi; k, v (B, H, T, d_h | d_v)."""

    def __init__(self, fwd: Callable, q: Tensor, k: Tensor, v: Tensor, op: AttentionOp, scale: float, spec: MaskSpec,
                 positional: Positional, documents: Tensor | None) -> None:
        super().__init__(spec, positional, q.device, documents)
        self.fwd, self.q, self.k, self.v, self.op, self.scale = fwd, q, k, v, op, scale
        B, H, T, _ = q.shape
        self.out = torch.empty(B, H, T, v.shape[-1], dtype=v.dtype, device=v.device)

    def masked(self, i0: int, i1: int, j0: int, j1: int, mask: Tensor, bias: Tensor | None) -> None:
        q, k, v = self.q, self.k, self.v
        self.out[:, :, i0:i1] = self.fwd(q[:, :, i0:i1], k[:, :, j0:j1], v[:, :, j0:j1], mask, bias, self.op,
                                         self.scale)

    def empty(self, i0: int, i1: int) -> None:
        self.out[:, :, i0:i1] = 0

    def result(self) -> Tensor:
        return self.out


class _TileGradient(_MaskedTiles):
    """The tile path's gradient reducer: ``bwd(q, k, v, dout, mask, bias, op, scale)`` of each tile
    (:func:`tile_backward` or its compiled version) gives the tile's dq rows and its contributions to dk and dv
    over its key range, accumulated in float32. Result: (dq, dk, dv) float32 of q's, k's and v's shapes (zero
    rows for queries that see no key, and keys no query sees). Shapes as :class:`_TileOutput`, dout (B, H, T, d_v)."""

    def __init__(self, bwd: Callable, q: Tensor, k: Tensor, v: Tensor, dout: Tensor, op: AttentionOp, scale: float,
                 spec: MaskSpec, positional: Positional, documents: Tensor | None) -> None:
        super().__init__(spec, positional, q.device, documents)
        self.bwd, self.q, self.k, self.v, self.dout, self.op, self.scale = bwd, q, k, v, dout, op, scale
        B, H, T, dh = q.shape
        f32 = torch.float32
        self.dq = torch.zeros(B, H, T, dh, dtype=f32, device=q.device)
        self.dk = torch.zeros(B, H, T, dh, dtype=f32, device=q.device)
        self.dv = torch.zeros(B, H, T, v.shape[-1], dtype=f32, device=q.device)

    def masked(self, i0: int, i1: int, j0: int, j1: int, mask: Tensor, bias: Tensor | None) -> None:
        q, k, v = self.q, self.k, self.v
        dq_t, dk_t, dv_t = self.bwd(q[:, :, i0:i1], k[:, :, j0:j1], v[:, :, j0:j1], self.dout[:, :, i0:i1], mask, bias,
                                    self.op, self.scale)
        self.dq[:, :, i0:i1] = dq_t
        self.dk[:, :, j0:j1] += dk_t
        self.dv[:, :, j0:j1] += dv_t

    def result(self) -> tuple[Tensor, Tensor, Tensor]:
        return self.dq, self.dk, self.dv


def _attend_chunk(op: AttentionOp, scale: float, spec: MaskSpec, positional: Positional, documents: Tensor | None,
                  qc: Tensor, kc: Tensor, vc: Tensor, i0: int, j0: int, vk, vv, vlogit) -> Tensor:
    """One chunk of the chunked path: query rows [i0, i0 + C) of qc (B, H, C, d_h) against keys [j0, j0 + Tk) of kc,
    vc (B, H, Tk, d_h) (0-based), :func:`attend_block` with the tile's mask and bias (:func:`_tile_mask_bias`, built
    here so that checkpointing recomputes them) -> (B, H, C, d_h). A module function, not a method of
    :class:`_ChunkOutput`: checkpointing keeps it in the autograd graph, and a bound method would keep the reducer,
    and with it every chunk's output, alive until a backward (for ever without one)."""
    mask, bias = _tile_mask_bias(i0, i0 + qc.shape[2], j0, j0 + kc.shape[2], spec, positional, qc.device,
                                 documents)  # (C, Tk) or (B, 1, C, Tk); (H, C, Tk) or None
    return attend_block(op, qc, kc, vc, mask, scale, bias=bias, vk=vk, vv=vv, vlogit=vlogit)[0]


class _ChunkOutput(TileReducer):
    """The chunked path's output reducer: each chunk of query rows [i0, i1) against keys [j0, j1) (0-based) is
    :func:`attend_block` with the tile's mask and bias (:func:`_tile_mask_bias`, built inside the chunk so that
    checkpointing recomputes them) and the layer's virtual key, under activation checkpointing when ``use_ckpt``.
    q (B, H, T, d_h); k, v (B, H, T, d_h) (kv heads repeated); vk, vv (1, H, 1, d_h) or None; vlogit (H,) or
    None. Result: the (B, H, T, d_h) output, the chunks concatenated in order. A chunk that sees no real key
    attends an empty key range (its virtual key only, if any)."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, op: AttentionOp, scale: float, spec: MaskSpec,
                 positional: Positional, documents: Tensor | None, vk, vv, vlogit, use_ckpt: bool) -> None:
        self.q, self.k, self.v = q, k, v
        self.vk, self.vv, self.vlogit, self.use_ckpt = vk, vv, vlogit, use_ckpt
        self.outs: list[Tensor] = []
        # what checkpointing keeps in the graph: the chunk function and the layer's settings, not this reducer
        self._block = functools.partial(_attend_chunk, op, scale, spec, positional, documents)

    def tile(self, i0: int, i1: int, j0: int, j1: int) -> None:
        q, k, v = self.q, self.k, self.v
        args = (q[:, :, i0:i1], k[:, :, j0:j1], v[:, :, j0:j1], i0, j0, self.vk, self.vv, self.vlogit)
        self.outs.append(checkpoint(self._block, *args, use_reentrant=False) if self.use_ckpt else self._block(*args))

    def empty(self, i0: int, i1: int) -> None:
        self.tile(i0, i1, 0, 0)

    def result(self) -> Tensor:
        return torch.cat(self.outs, dim=2)  # (B, H, T, d_h)


# ============================================================ the module
def _split_differential(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Differential attention's two maps as 2H heads: q (B, H, T, d_h) -> (B, 2H, T, d_h/2) with heads
    0..H-1 the first halves (q1) and H..2H-1 the second (q2); k likewise over the H_kv heads; v
    (B, H_kv, T, d_h) -> (B, 2H_kv, T, d_h) (both maps share it), so that grouped-query head h of
    the 2H sees kv head h // (H / H_kv) of the right half."""
    def halves(x: Tensor) -> Tensor:
        B, Hx, T, dh = x.shape
        return x.view(B, Hx, T, 2, dh // 2).permute(0, 3, 1, 2, 4).reshape(B, 2 * Hx, T, dh // 2)

    return halves(q), halves(k), torch.cat([v, v], dim=1)


def _merge_differential(x: Tensor) -> Tensor:
    """Inverse of :func:`_split_differential` for zero-padded queries or keys: (B, 2H, T, d_h) whose
    last d_h/2 channels are padding -> each head's (B, H, T, d_h) = [first half, second half]."""
    B, H2, T, dh = x.shape
    halves = x[..., : dh // 2].reshape(B, 2, H2 // 2, T, dh // 2)
    return torch.cat([halves[:, 0], halves[:, 1]], dim=-1)


class Attention(nn.Module):
    """Multi-head (grouped-query) self-attention with a pluggable operation.

    Args:
        config: :class:`sinklab.nn.ModelConfig`. layer_idx: 0-based layer index.
        options: how the paths compute (:class:`AttentionOptions`; None = the defaults).
    """

    def __init__(self, config, layer_idx: int, options: AttentionOptions | None = None) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.options = bind_options(options, config)
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.kv_heads, config.head_dim
        d, H, Hkv, dh = config.d_model, self.n_heads, self.n_kv_heads, self.head_dim
        self.scale = 1.0 / math.sqrt(config.qk_dim)  # differential attention: each map's d = d_h / 2
        self.q_proj = nn.Linear(d, H * dh, bias=config.qkv_bias)
        self.k_proj = nn.Linear(d, Hkv * dh, bias=config.qkv_bias)
        self.v_proj = nn.Linear(d, Hkv * dh, bias=config.qkv_bias)
        self.o_proj = nn.Linear(H * dh, d, bias=False)
        self.q_norm = self.k_norm = None
        if config.qk_norm:  # Qwen3-style QK-norm: the model's norm over each head's d_h
            self.q_norm = NORM.get(config.norm)(dh, config.norm_eps)
            self.k_norm = NORM.get(config.norm)(dh, config.norm_eps)
        self.op: AttentionOp = ATTENTION.get(config.attention)(config.op_context(), **config.attention_options)
        if self.op.differential:
            self.op.set_layer(layer_idx)
        self.gate_proj = self.gate_act = None
        if self.op.gate == "headwise":
            self.gate_proj = nn.Linear(d, H, bias=False)
        elif self.op.gate == "elementwise":
            self.gate_proj = nn.Linear(d, H * dh, bias=False)
        if self.gate_proj is not None:
            # the gate's sigmoid as a module (no parameters): its output is the hook site ``attn.gate``
            self.gate_act = nn.Sigmoid()

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value of a single model-space vector x (d,) -> (H_kv, d_h) each, no position
        (the key through ``k_norm`` when the model has QK-norm)."""
        k = self.k_proj(x).view(self.n_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        return k, self.v_proj(x).view(self.n_kv_heads, self.head_dim)

    def forward(self, x: Tensor, ctx: AttnContext, observer: Observer | None = None) -> Tensor:
        """x (B, T, d) -> (B, T, d). With an observer, uses the reference path and reports weights.

        A gated operation's output gate ``sigmoid(x W_g)`` (B, T, H) or (B, T, H d_h) is computed before the
        attention (it depends on x only), so that an observer of the attention already has it."""
        B, T, _ = x.shape
        H, Hkv, dh = self.n_heads, self.n_kv_heads, self.head_dim
        g = None if self.gate_proj is None else self.gate_act(self.gate_proj(x))  # (B, T, H) or (B, T, H*d_h)
        if self.options.fused_qkv:
            w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # ((H + 2 H_kv) d_h, d)
            b = None if self.q_proj.bias is None else torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
            q, k, v = F.linear(x, w, b).split([H * dh, Hkv * dh, Hkv * dh], dim=-1)  # (B, T, H d_h), (B, T, H_kv d_h) x 2
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, H, dh).transpose(1, 2)  # (B, H, T, d_h)
        k = k.view(B, T, Hkv, dh).transpose(1, 2)  # (B, H_kv, T, d_h)
        v = v.view(B, T, Hkv, dh).transpose(1, 2)  # (B, H_kv, T, d_h)
        if self.q_norm is not None:  # QK-norm (config.qk_norm): per head, before the positions
            q, k = self.q_norm(q), self.k_norm(k)
        diff = self.op.differential
        if diff:
            if ctx.kv_cache is not None:
                raise NotImplementedError("attention='diff' has no KV-cache path yet (streaming, SinkCache)")
            q, k, v = _split_differential(q, k, v)  # (B, 2H, T, d_h/2), (B, 2H_kv, T, d_h/2), (B, 2H_kv, T, d_h)
        q, k = ctx.positional.apply_qk(q, k, ctx.pos_state)
        if diff:  # zero-pad q, k to the value's width: q.k is unchanged and SDPA keeps its fused kernels
            q, k = F.pad(q, (0, dh - q.shape[-1])), F.pad(k, (0, dh - k.shape[-1]))
        y = _first_path(ATTENTION_PATHS.items(), self, ctx, observer, q.device.type)[1].run(self, q, k, v, ctx, observer)
        if diff and observer is None:  # (the reference path combined the two maps itself)
            y = self.op.combine(y.view(B, 2, H, T, dh))
        # y: (B, H, T, d_h)
        if g is not None:
            g = g.view(B, T, H, -1).transpose(1, 2)  # (B, H, T, 1 | d_h)
            y = y * g.to(y.dtype)
        y = y.transpose(1, 2).reshape(B, T, H * dh)  # (B, T, H*d_h)
        return self.o_proj(y)

    # ---------------------------------------------------------- virtual key
    def virtual(self, dtype) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """This layer's virtual key, as :func:`reference_attention` and :func:`attend_block` take it: (vk, vv)
        (H_kv, d_h) each in ``dtype`` (sink token, key / value biases) or None; vlogit (H,) float, the logit of a
        virtual key with value 0 (sink logit, off-by-one's zero logit), or None."""
        kv = self.op.virtual_kv(self)
        vlogit = self.op.virtual_logit()
        vk = vv = None
        if kv is not None:
            vk, vv = kv[0].to(dtype), kv[1].to(dtype)
        if vlogit is not None:
            vlogit = vlogit.to(self.q_proj.weight.device)
        return vk, vv, vlogit

    # ---------------------------------------------------------------- paths
    def _cached(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        """Incremental decoding (reference formula): the T new tokens attend causally to the K tokens
        the cache layer keeps and to each other; positions (RoPE's re-rotation, ALiBi's distances)
        are cache positions. q (B, H, T, d_h); k, v (B, H_kv, T, d_h) -> (B, H, T, d_h)."""
        layer = ctx.kv_cache.layers[self.layer_idx]
        K = layer.kept
        k_all, v_all = layer.update(k, v, position_ids=ctx.position_ids)  # (B, H_kv, K + T, d_h)
        B, H, T, _ = q.shape
        qpos = torch.arange(K, K + T, device=q.device)
        kpos = torch.arange(k_all.shape[-2], device=q.device)
        mask = kpos[None, :] <= qpos[:, None]  # (T, K + T)
        bias = ctx.positional.logit_bias(qpos, kpos) if ctx.positional.logit_bias_kind else None
        vk, vv, vlogit = self.virtual(q.dtype)
        if vk is not None:
            vk = repeat_kv(vk[None, :, None, :], H // vk.shape[0])  # (1, H, 1, d_h)
            vv = repeat_kv(vv[None, :, None, :], H // vv.shape[0])
        rep = H // k_all.shape[1]
        out, w, _ = attend_block(self.op, q, repeat_kv(k_all, rep), repeat_kv(v_all, rep), mask, self.scale,
                                 bias=bias, vk=vk, vv=vv, vlogit=vlogit)
        if getattr(layer, "awaiting", 0):  # an attention-based eviction policy scores the slots from w
            layer.observe(w)
        return out

    def _fast(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        """SDPA path (softmax family). q (B, H, T, d_h); k, v (B, H_kv, T, d_h) -> (B, H, T, d_h)."""
        B, H, T, dh = q.shape
        Hkv, dv = k.shape[1], v.shape[-1]  # dv = dh, or 2 dh for differential attention's maps
        vk, vv, vlogit = self.virtual(q.dtype)
        gqa = Hkv != H
        virtual = vk is not None or vlogit is not None
        out_dtype = q.dtype
        max_keys = self.options.cpu_fp32_sdpa_max_keys
        upcast = (self.options.cpu_fp32_sdpa_backward and q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
                  and torch.is_grad_enabled() and q.requires_grad
                  and (max_keys is None or q.dtype != torch.bfloat16 or k.shape[2] <= max_keys))
        if upcast:
            q, k, v = q.float(), k.float(), v.float()
            vk, vv = (None, None) if vk is None else (vk.float(), vv.float())
        attn_mask = ctx.sdpa_mask(virtual=virtual, dtype=q.dtype)  # None, (T, [1+]T) bool or (1, H, T, [1+]T)
        if vk is not None:
            k = torch.cat([vk[None, :, None, :].expand(B, Hkv, 1, dh), k], dim=2)  # (B, H_kv, 1+T, d_h)
            v = torch.cat([vv[None, :, None, :].expand(B, Hkv, 1, dh), v], dim=2)  # (B, H_kv, 1+T, d_h)
        elif vlogit is not None:
            # Virtual logit b_h with zero value: pad the head dimension to a multiple of 8 (keeps
            # fused kernels usable) with q' = [q, 1, 0..], k' = [k, 0, 0..], k*' = [0, b_h / scale, 0..],
            # so scale * q'.k*' = b_h exactly and q'.k' = q.k; values get zeros there and are sliced off.
            k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, T, d_h): the logit is per query head
            gqa = False
            pad = 8 - dh % 8
            q = F.pad(q, (0, pad))  # (B, H, T, d_h+pad)
            q[..., dh] = 1.0
            k = F.pad(k, (0, pad))  # (B, H, T, d_h+pad)
            v = F.pad(v, (0, pad))  # (B, H, T, d_h+pad)
            kstar = q.new_zeros(H, dh + pad)
            kstar[:, dh] = (vlogit.float() / self.scale).to(q.dtype)
            k = torch.cat([kstar[None, :, None, :].expand(B, H, 1, dh + pad), k], dim=2)  # (B, H, 1+T, d_h+pad)
            v = torch.cat([v.new_zeros(B, H, 1, dh + pad), v], dim=2)  # (B, H, 1+T, d_h+pad)
        shifted = virtual and self.options.causal_virtual_key and ctx.plain_causal and ctx.full_bias() is None
        if shifted:
            # Plain causal with a virtual key in front: prepend one dummy query so that query i is
            # row i+1 and the causal kernel's "key j <= row" is exactly "virtual key or j <= i"
            # (no explicit mask, which would keep SDPA off its causal block skipping).
            q = torch.cat([q.new_zeros(B, H, 1, q.shape[-1]), q], dim=2)  # (B, H, 1+T, d_h[+pad])
            attn_mask = None
        # (CPU autocast would cast float32 inputs of SDPA back down: switch it off for the upcast call)
        with torch.autocast("cpu", enabled=False) if upcast else contextlib.nullcontext():
            if attn_mask is None:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale, enable_gqa=gqa)
        if shifted:
            y = y[:, :, 1:]  # (B, H, T, d_h[+pad]): drop the dummy query
        y = y[..., :dv].to(out_dtype)  # (B, H, T, d_h): drop the padding of the virtual-logit case
        return y * self.op.output_scale if self.op.output_scale != 1.0 else y

    def _flex(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        """FlexAttention path (``attention_backend = "flex"``, :func:`sinklab.nn.flex.flex_attend`).
        Shapes as in :meth:`_fast`."""
        from sinklab.nn.flex import flex_attend

        vk, vv, vlogit = self.virtual(q.dtype)
        return flex_attend(self.op, q, k, v, scale=self.scale, mask=ctx.mask,
                           positional=ctx.positional, vk=vk, vv=vv, vlogit=vlogit, cache=ctx._flex_masks,
                           compiled=self.options.flex_compiled, documents=ctx.documents)

    def path(self, ctx: AttnContext, observer: Observer | None = None, device_type: str | None = None) -> str:
        """The name of the :data:`ATTENTION_PATHS` entry that computes this layer's attention in a pass
        with ``ctx`` and ``observer`` on ``device_type`` ("cpu", "cuda", ...; None: the device of the layer's
        weights), under the current grad mode: the first registered path whose ``takes`` accepts it (the last
        one, ``chunked``, takes every pass).

        Raises:
            RuntimeError: no registered path takes the pass (``chunked`` was removed)."""
        device_type = self.q_proj.weight.device.type if device_type is None else device_type
        return _first_path(ATTENTION_PATHS.items(), self, ctx, observer, device_type)[0]

    def takes_tile(self, ctx: AttnContext) -> bool:
        """Whether the tile path (:class:`_TileAttention`) can compute this layer's pass: an operation with an
        analytic tile gradient (``op.has_tile_grad``), ``options.tile_autograd``, no virtual key or logit, and
        no learned positional bias while gradients are on (the tile gradient covers q, k, v only)."""
        return (self.options.tile_autograd and self.op.has_tile_grad and self.op.virtual_kv(self) is None
                and self.op.virtual_logit() is None and not (ctx.positional.learned_bias and torch.is_grad_enabled()))

    def _tile(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, compiled: bool = False) -> Tensor:
        """Tile path: :class:`_TileAttention` over query tiles of at most ``options.tile_elems`` logits.
        ``compiled``: the per-tile functions under ``torch.compile`` (``attention_backend = "compiled"``,
        :mod:`sinklab.nn.compiled`). Shapes as in :meth:`_fast`; only when :meth:`takes_tile`."""
        B, H, T, dh = q.shape
        k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, T, d_h)
        C = max(1, min(T, self.options.tile_elems // max(1, B * H * T)))
        phi = self.op.feature_map
        return _TileAttention.apply(phi(q), phi(k), v, self.op, self.scale, C, ctx.mask, ctx.positional, compiled,
                                    ctx.documents)

    def _compiled_tile(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        """``attention_backend = "compiled"``: the tile path with compiled per-tile functions.

        Raises:
            ConfigError: the pass cannot take the tile path (:meth:`takes_tile`)."""
        if not self.takes_tile(ctx):
            raise ConfigError(f"attention_backend='compiled' needs the tile path: attention={type(self.op).__name__} "
                              f"with positional={type(ctx.positional).__name__} and AttentionOptions.tile_autograd="
                              f"{self.options.tile_autograd} does not take it; use attention_backend='reference'")
        return self._tile(q, k, v, ctx, compiled=True)

    def _chunked(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext) -> Tensor:
        """Memory-frugal path: query chunks of at most ``options.chunk_elems`` logits (the reducer
        :class:`_ChunkOutput` on :func:`~sinklab.attention_masks.reduce_tiles`), each under checkpointing when
        gradients are on. Shapes as in :meth:`_fast`. Serves every operation."""
        B, H, T, dh = q.shape
        k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])  # (B, H, T, d_h)
        vk, vv, vlogit = self.virtual(q.dtype)
        if vk is not None:
            vk = repeat_kv(vk[None, :, None, :], H // vk.shape[0])  # (1, H, 1, d_h)
            vv = repeat_kv(vv[None, :, None, :], H // vv.shape[0])
        C = max(1, min(T, self.options.chunk_elems // max(1, B * H * T)))
        use_ckpt = self.options.checkpoint_chunks and torch.is_grad_enabled()
        chunks = _ChunkOutput(q, k, v, self.op, self.scale, ctx.mask, ctx.positional, ctx.documents, vk, vv, vlogit,
                              use_ckpt)
        return reduce_tiles(chunks, T, C, ctx.mask)  # (B, H, T, d_h)

    def _reference(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttnContext, observer: Observer) -> Tensor:
        """Full matmul-mask-normalise path; reports this layer's weights to the observer.

        The observer gets ``weights`` (B, H, T, T) over the T real keys. For operations
        whose rows do not sum to 1 (sigmoid or ReLU without normalisation, kernels,
        scaled or p-normalised softmax, softpick) the rows, virtual key included, are
        replaced by the paper's proxy scores ``|w_ij| / sum_j |w_ij|`` (virtual key included; all-zero
        rows stay 0) and ``renormalised=True``, as the paper's own code does. ``extra`` (B, H, T) is the weight on the virtual key
        (sink token, key bias, sink logit, off-by-one's implicit zero logit) or None.

        An observer with the attribute ``wants_query = True`` also gets ``query`` (B, H, T, d_h),
        after positions; one with ``wants_mask = True`` gets ``mask``, the bool (T, T) visibility of
        :func:`~sinklab.attention_masks.build_mask` ((B, 1, T, T) with documents; True = may attend). An observer that returns a tensor (B, H, T, T) replaces the weights on
        the real keys (same normalisation as it was given; used by :mod:`sinklab.analyze` for
        interventions): the output is recomputed as ``weights @ v`` (+ the virtual key's
        unchanged share of its value). Returning None (the usual case) changes nothing.
        """
        vk, vv, vlogit = self.virtual(q.dtype)
        out, w, w_extra = reference_attention(
            self.op, q, k, v, scale=self.scale, mask=ctx.mask,
            bias=ctx.full_bias(), vk=vk, vv=vv, vlogit=vlogit, documents=ctx.documents,
        )
        if self.op.differential:  # the 2H maps -> the H differential maps A1 - lambda A2 and their output
            H = self.n_heads
            w = w[:, :H] - self.op.lam().to(w.dtype) * w[:, H:]  # (B, H, T, T), signed
            v = v[:, : v.shape[1] // 2]  # (B, H_kv, T, d_h): the value both maps share
            out = torch.matmul(w.to(v.dtype), repeat_kv(v, H // v.shape[1]))  # (B, H, T, d_h)
            q, k = _merge_differential(q), _merge_differential(k)  # the heads' own (B, H[_kv], T, d_h)
        renorm = not self.op.normalised and not wants_raw_weights(observer)
        extra_out = w_extra  # (B, H, T, 1) or None: the virtual key's weight in the output, as computed (an edit
        # replaces the real keys' weights only, so the output keeps this one, sign included)
        if renorm:
            # the paper's proxy scores |w_ij| / sum_j |w_ij| (equal to w / sum w for non-negative weights;
            # the identity kernel's weights can be negative)
            sign = torch.where(w < 0, -1.0, 1.0).to(w.dtype)  # (B, H, T, T)
            w = w.abs()
            total = w.sum(dim=-1, keepdim=True)  # (B, H, T, 1)
            if w_extra is not None:
                w_extra = w_extra.abs()
                total = total + w_extra
            total = torch.where(total > 0, total, torch.ones_like(total))
            w = w / total
            w_extra = None if w_extra is None else w_extra / total
        more = {"query": q.detach()} if getattr(observer, "wants_query", False) else {}
        if getattr(observer, "wants_mask", False):  # (T_q, T_k), or (B, 1, T_q, T_k) with documents
            more["mask"] = build_mask(q.shape[2], k.shape[2], ctx.mask, device=q.device, documents=ctx.documents)
        # the weights keep their graph (as on the transformers seam): an observer that edits them gives an output
        # whose gradient reaches the queries and keys; a read-only one detaches what it keeps
        edited = observer(self.layer_idx, w, renormalised=renorm,
                          extra=None if w_extra is None else w_extra.squeeze(-1).detach(),
                          key=k.detach(), value=v.detach(), **more)
        if edited is not None:
            # the observer replaced the weights (an intervention, sinklab.analyze): recompute the output
            # from them, in the normalisation the observer saw (undo the renormalisation), virtual key kept
            w_new = edited * total * sign if renorm else edited  # (B, H, T, T)
            vr = repeat_kv(v, self.n_heads // v.shape[1])  # (B, H, T, d_h)
            out = torch.matmul(w_new.to(vr.dtype), vr)  # (B, H, T, d_h)
            if extra_out is not None and vv is not None:
                out = out + extra_out.to(vr.dtype) * repeat_kv(vv[None, :, None, :], self.n_heads // vv.shape[0])
        return self.op.normalise_heads(out) if self.op.differential else out


# ============================================================ the paths
@dataclass(frozen=True)
class AttentionPath:
    """One way :class:`Attention` computes ``softmax-like(q k^T) v`` for a pass: an entry of
    :data:`ATTENTION_PATHS`.

    Attributes:
        takes: ``takes(layer, ctx, observer, device_type) -> bool``: whether this path computes the pass
            of ``layer`` (an :class:`Attention`) with ``ctx`` (:class:`AttnContext`), ``observer`` (or None)
            on ``device_type`` ("cpu", "cuda", ...). Paths are tried in registration order.
        run: ``run(layer, q, k, v, ctx, observer) -> y``: q (B, H, T, d_h) after positions, k and v
            (B, H_kv, T, d_h); y (B, H, T, d_h). Differential attention (``layer.op.differential``) passes its two
            maps as 2H query and 2H_kv key / value heads, q and k zero-padded from d_h/2 to d_h: y is then
            (B, 2H, T, d_h), the two maps' outputs, which ``forward`` combines; except with an observer, where
            ``y`` is the combined (B, H, T, d_h) (the ``observed`` path combines the maps itself). Must agree
            with :func:`reference_attention` (the equality tests in ``tests/test_nn_attention.py`` and
            ``tests/test_nn_backends.py``).
        doc: one line for listings.
    """

    takes: Callable[..., bool]
    run: Callable[..., Tensor]
    doc: str = ""


def _learned_bias_training(ctx: AttnContext) -> bool:
    # SDPA's fused CPU kernels give no gradient to a learned attn_mask: it would fall back to
    # materialising T x T per layer, so learned biases train on the tile / chunked paths.
    return ctx.positional.learned_bias and torch.is_grad_enabled()


def _first_path(paths, layer: Attention, ctx: AttnContext, observer, device_type: str) -> tuple[str, AttentionPath]:
    """The first (name, path) of ``paths`` whose ``takes`` accepts the pass (what ``forward`` runs)."""
    for name, p in paths:
        if p.takes(layer, ctx, observer, device_type):
            return name, p
    raise RuntimeError("no attention path takes this pass (ATTENTION_PATHS lost its last entry, 'chunked')")


def _backend(layer: Attention, device_type: str) -> str:
    return resolve_backend(layer.options.attention_backend, layer.op, device_type)


#: The attention paths, in the order :meth:`Attention.path` tries them; ``Attention.forward`` is the
#: projections, positions and the first path that takes the pass. Register another kernel with
#: ``ATTENTION_PATHS.register(name, AttentionPath(takes, run), before="sdpa")`` (it must agree with the
#: reference formula; ``ATTENTION_PATHS.remove(name)`` undoes it). Names (public, listed by a test):
#:
#: * ``cached``: incremental decoding with a KV cache (``ctx.kv_cache``; streaming, SinkCache).
#: * ``observed``: :func:`reference_attention` over the full T x T, the weights reported to an observer
#:   (the sink metrics, hooks on ``attn.weights``).
#: * ``flex``: FlexAttention (``attention_backend`` "flex", or "auto" on CUDA for the softmax family).
#: * ``compiled``: the tile path with ``torch.compile``d per-tile functions (``attention_backend = "compiled"``).
#: * ``sdpa``: ``F.scaled_dot_product_attention`` for the operations it expresses exactly (``op.sdpa``).
#: * ``tile``: :class:`_TileAttention`, query tiles with the operation's analytic gradient.
#: * ``chunked``: checkpointed query chunks; every operation (the fallback, takes every pass).
ATTENTION_PATHS: Registry[AttentionPath] = Registry("attention path")
ATTENTION_PATHS.register("cached", AttentionPath(
    lambda layer, ctx, observer, device: ctx.kv_cache is not None,
    lambda layer, q, k, v, ctx, observer: layer._cached(q, k, v, ctx),
    "incremental decoding with a KV cache"))
ATTENTION_PATHS.register("observed", AttentionPath(
    lambda layer, ctx, observer, device: observer is not None,
    lambda layer, q, k, v, ctx, observer: layer._reference(q, k, v, ctx, observer),
    "the reference formula, weights reported to the observer"))
ATTENTION_PATHS.register("flex", AttentionPath(
    lambda layer, ctx, observer, device: _backend(layer, device) == "flex",
    lambda layer, q, k, v, ctx, observer: layer._flex(q, k, v, ctx),
    "FlexAttention"))
ATTENTION_PATHS.register("compiled", AttentionPath(
    lambda layer, ctx, observer, device: _backend(layer, device) == "compiled",
    lambda layer, q, k, v, ctx, observer: layer._compiled_tile(q, k, v, ctx),
    "tiles with torch.compile'd per-tile functions"))
ATTENTION_PATHS.register("sdpa", AttentionPath(
    lambda layer, ctx, observer, device: layer.op.sdpa and not _learned_bias_training(ctx),
    lambda layer, q, k, v, ctx, observer: layer._fast(q, k, v, ctx),
    "scaled_dot_product_attention (softmax family)"))
ATTENTION_PATHS.register("tile", AttentionPath(
    lambda layer, ctx, observer, device: layer.takes_tile(ctx),
    lambda layer, q, k, v, ctx, observer: layer._tile(q, k, v, ctx),
    "query tiles with the operation's analytic gradient"))
ATTENTION_PATHS.register("chunked", AttentionPath(
    lambda layer, ctx, observer, device: True,
    lambda layer, q, k, v, ctx, observer: layer._chunked(q, k, v, ctx),
    "checkpointed query chunks (every operation)"))


def paths_taken(model: nn.Module, input_ids: Tensor, **forward_kwargs) -> list[str]:
    """The :data:`ATTENTION_PATHS` entry each :class:`Attention` layer of ``model`` takes in
    ``model(input_ids, **forward_kwargs)`` (a :class:`sinklab.nn.SinkLM`; input_ids (B, T) int), one name per
    layer call in order, without computing any attention: a probe path registered in front takes every pass,
    names the path that would have taken it (:meth:`Attention.path`, at that moment: grad mode, context,
    device) and returns zeros of the shape that path returns (so nothing compiles; the model's output is
    discarded). Not thread-safe (the registry is global while the probe is in it).

    Raises:
        whatever ``model(input_ids, **forward_kwargs)`` raises; the registry is restored either way.
    """
    names: list[str] = []
    rest = ATTENTION_PATHS.items()

    def probe(layer, ctx, observer, device):
        names.append(_first_path(rest, layer, ctx, observer, device)[0])
        return True

    def zeros(layer, q, k, v, ctx, observer):
        B, H, T, _ = q.shape  # H = 2 x the layer's heads for differential attention's two maps
        if observer is not None and layer.op.differential:
            H = layer.n_heads  # the observed path returns the combined map
        return q.new_zeros(B, H, T, v.shape[-1])

    name = "_paths_taken_probe"
    first = ATTENTION_PATHS.names()[0] if len(ATTENTION_PATHS) else None
    ATTENTION_PATHS.register(name, AttentionPath(probe, zeros, "probe of paths_taken"), before=first)
    try:
        model(input_ids, **forward_kwargs)
    finally:
        ATTENTION_PATHS.remove(name)
    return names
