"""Named hooks: read or edit a forward pass at documented sites, on any model sinklab runs.

One hook type, :class:`Hook` (a site of :data:`SITES`, a function, the layers), attached for a
``with`` block by :func:`hooked`::

    from sinklab.hooks import Hook, hooked

    def halve_first_key(w, ctx):          # w: (B, H, T_q, T_k) attention weights of layer ctx.layer
        w = w.clone()
        w[..., 0] *= 0.5
        return w / w.sum(-1, keepdim=True)  # a tensor replaces the site's value; None only reads

    with hooked(model, Hook("attn.weights", halve_first_key, layers=[2, 3, 4])):
        loss = model(ids, labels=ids).loss

The sites (names are public API; shapes as in :data:`SITES`; layers and positions 0-based):

==============  ============================================================  =====================
site            tensor                                                        edit
==============  ============================================================  =====================
resid.pre       (B, T, d) residual stream entering block l                    yes
attn.query      (B, H, T_q, D) queries after RoPE / query norm                HF yes, SinkLM read
attn.key        (B, H_kv, T_k, D) keys after RoPE / key norm                  HF yes, SinkLM read
attn.value      (B, H_kv, T_k, D) values                                      HF yes, SinkLM read
attn.weights    (B, H, T_q, T_k) float32 weights after the softmax            yes (output recomputed)
attn.gate       (B, H, T_q, G) output gate of a gated layer (G = 1 or D)      SinkLM yes, HF read
attn.out        (B, T, d) attention sublayer output, before the residual add  yes
                (BERT-style encoders: after their add and LayerNorm)
block.out       (B, T, d) output of block l                                   yes
==============  ============================================================  =====================

Works on ``transformers`` models whose attention goes through ``AttentionInterface`` (LLaMA, Qwen,
Gemma, GPT-2, BERT...; the attention sites need it, and a model that bypasses it raises
:class:`~sinklab.errors.CaptureError` at the first pass) and on sinklab's :class:`~sinklab.nn.SinkLM`,
through the model adapter (:func:`sinklab.capture.adapt`). Several hooks compose: hooks of one
:func:`hooked` call and of nested calls all run, those on one site in registration order (outer
blocks first), each seeing the previous one's result. Everything is removed on exit, also when the
block raises: the model then computes exactly what it computed before. With no hook attached
nothing is installed (no module hooks, no copies).

Cost while attached: a ``transformers`` model whose attention sites are hooked runs its attention through
sinklab's seam (SDPA for layers not hooked at ``attn.weights``, a float32 eager softmax for those
that are); a SinkLM layer hooked at an attention site runs its reference path (one T x T matrix).
The residual-stream and ``attn.out`` sites leave the model's own attention untouched.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from sinklab.capture.adapter import ModelAdapter, adapt
from sinklab.capture.sites import ATTENTION_SITES, SITES, Hook, HookContext, hookset_of


def hooked(model: nn.Module | ModelAdapter, *hooks: Hook | Iterable[Hook]):
    """Context manager: ``hooks`` attached to ``model`` for the ``with`` block.

    Args:
        model: a ``transformers`` model or a :class:`~sinklab.nn.SinkLM` (or its adapter).
        hooks: :class:`Hook` objects, or lists of them, run in the order given.

    Returns:
        A context manager yielding the model's :class:`~sinklab.capture.sites.HookSet`.

    Raises:
        InputError: not a Hook, an unknown site (the message lists them), a layer outside the model;
            at a pass: an edit of another shape, an edit of a SinkLM's ``attn.query``/``key``/``value``,
            attention sites of a SinkLM decoding with a KV cache.
        CaptureError: a ``transformers`` model whose attention bypasses ``AttentionInterface`` at a
            pass with a hook at an attention site.
    """
    flat: list = []
    for h in hooks:
        flat.extend(h if isinstance(h, (list, tuple)) else [h])
    return adapt(model).hooked(flat)


def active_hooks(model: nn.Module) -> list[Hook]:
    """The hooks attached to ``model`` now, in the order they run (empty outside :func:`hooked`)."""
    state = hookset_of(model.model if isinstance(model, ModelAdapter) else model)
    return [] if state is None else list(state.hooks)


__all__ = ["SITES", "ATTENTION_SITES", "Hook", "HookContext", "hooked", "active_hooks"]


def __dir__() -> list[str]:
    """The public API only (``dir(sinklab.hooks)``, tab completion): not the names this module imports."""
    return sorted(__all__)
