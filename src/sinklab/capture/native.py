"""The seam into sinklab's own :class:`sinklab.nn.SinkLM`: the hook sites of its blocks and its per-layer
observer.

:class:`SinkLMSeam` installs forward pre-hooks / hooks on every block (``resid.pre``, ``block.out``, the
recorder's hidden states) and on each block's attention (``attn.out``); for a layer with a hook at an
attention site (or while a recorder runs) the block pre-hook hands the block the observer that
:meth:`sinklab.nn.attention.Attention._reference` calls with the layer's weights, queries, keys and values
(that layer then runs the reference path: one T x T matrix at a time). Other layers keep their fast path.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn

from sinklab.attention_masks import MaskSpec
from sinklab.capture.recorder import BatchRecorder
from sinklab.capture.sites import ATTENTION_SITES, HookSet, attached, legacy_hooks
from sinklab.errors import InputError
from sinklab.metrics.entropy import attention_entropy
from sinklab.metrics.sink import gate_weighted_column_sums


class SinkLMSeam:
    """The hook sites of a :class:`~sinklab.nn.SinkLM` while a :class:`~sinklab.capture.sites.HookSet` is
    attached (see the module docstring). ``attn.query`` / ``attn.key`` / ``attn.value`` are read-only here:
    the observer sees them after the weights are computed (an edit raises InputError)."""

    def __init__(self, model: nn.Module, state: HookSet) -> None:
        self.model, self.state = model, state
        #: recorder settings of :func:`forward_native`: the pass's mask, its prefix, raw weights wanted
        self.spec = MaskSpec(causal=getattr(model.config, "causal", True))
        self.prefix_len = 0
        self.raw_weights = False
        self.handles = []
        try:
            for i, block in enumerate(model.layers):
                self.handles.append(block.register_forward_pre_hook(self._pre(i)))
                self.handles.append(block.register_forward_hook(self._post(i)))
                self.handles.append(block.attn.register_forward_hook(self._attn_out(i)))
                if getattr(block.attn, "gate_act", None) is not None:  # a gated operation: the gate's sigmoid
                    self.handles.append(block.attn.gate_act.register_forward_hook(self._gate(i, block.attn.n_heads)))
        except BaseException:
            self.remove()
            raise

    def _pre(self, i: int):
        state = self.state

        def fn(_mod, args):
            x, ctx, *rest = args
            given = rest[0] if rest else None
            wants_attention = state.recorder is not None or state.wants(ATTENTION_SITES, i)
            if wants_attention and ctx.kv_cache is not None:
                raise InputError("hooks at the attention sites of a sinklab model cannot run while decoding with a "
                                 "KV cache (its cached path reports no weights); run the sequence without the cache")
            if wants_attention and given is not None:
                raise InputError("a sinklab model's forward was given its own observer while hooks at attention "
                                 "sites are attached: use one or the other")
            x, edited = state.apply("resid.pre", i, x)
            if not (edited or wants_attention):
                return None
            return (x, ctx, self._observer() if wants_attention else given)

        return fn

    def _post(self, i: int):
        state = self.state

        def fn(_mod, _inp, out):
            h, edited = state.apply("block.out", i, out)
            if state.recorder is not None:
                state.recorder.add_hidden(i, h)
            return h if edited else None

        return fn

    def _attn_out(self, i: int):
        state = self.state

        def fn(_mod, _inp, out):
            h, edited = state.apply("attn.out", i, out)
            return h if edited else None

        return fn

    def _gate(self, i: int, n_heads: int):
        """The ``attn.gate`` site: the gate (B, T, H G) the attention computes before attending, seen as
        (B, H, T, G); hooks may replace it, the recorder gets the result (:meth:`BatchRecorder.add_gate`)."""
        state = self.state

        def fn(_mod, _inp, out):
            if state.recorder is None and not state.at("attn.gate", i):
                return None
            B, T, _ = out.shape
            g = out.view(B, T, n_heads, -1).transpose(1, 2)  # (B, H, T, G)
            g, edited = state.apply("attn.gate", i, g)
            if state.recorder is not None:
                state.recorder.add_gate(i, g)
            return g.transpose(1, 2).reshape(B, T, -1) if edited else None

        return fn

    def _observer(self):
        state, rec, spec, prefix_len = self.state, self.state.recorder, self.spec, self.prefix_len

        def observer(layer: int, weights: Tensor, *, renormalised: bool, extra=None, key=None, value=None,
                     query=None, mask=None):
            for site, x in (("attn.query", query), ("attn.key", key), ("attn.value", value)):
                if x is not None and state.apply(site, layer, x)[1]:
                    raise InputError(f"a hook edited {site!r} of a sinklab model: that site is read-only there "
                                     "(edit attn.weights, attn.out or the residual stream instead)")
            weights, edited = state.apply("attn.weights", layer, weights, query=query, key=key, value=value,
                                          renormalised=renormalised, mask=mask)
            if rec is not None:
                rec.attn_calls += 1
                # the paper's mass counts the queries i >= j; a prefix lets earlier queries see j too
                causal = weights.tril() if prefix_len > 1 else weights
                rec.add_attention(
                    layer,
                    weights.sum(dim=-2, dtype=torch.float64),
                    spec,
                    causal_column_sums=causal.sum(dim=-2, dtype=torch.float64) if prefix_len > 1 else None,
                    key=key,
                    value=value,
                    extra=extra,
                    renormalised=renormalised,
                    entropy=attention_entropy(weights, extra) if rec.wants_entropy else None,
                    gated_column_sums=(None if (gate := rec.gate_of(layer)) is None
                                       else gate_weighted_column_sums(causal, gate)),
                    gated_visible_sums=(None if gate is None or prefix_len <= 1
                                        else gate_weighted_column_sums(weights, gate)),  # every query that sees j
                )
            return weights if edited else None

        observer.wants_query = True
        observer.wants_mask = True
        observer.raw_weights = self.raw_weights
        return observer

    def refresh(self) -> None:
        """Nothing to switch: the observer is handed over per block."""

    def remove(self) -> None:
        """Remove every module hook."""
        for h in self.handles:
            h.remove()
        self.handles = []


@contextlib.contextmanager
def native_hooks(model: nn.Module, hooks=(), *, recorder: BatchRecorder | None = None, prefix_len: int = 0,
                 renormalise: bool = True) -> Iterator[HookSet]:
    """Context manager: ``hooks`` (:class:`~sinklab.capture.sites.Hook`) and ``recorder`` attached to the
    SinkLM ``model`` (see :class:`SinkLMSeam`); everything removed on exit, also on errors. ``prefix_len``
    and ``renormalise``: the recorder's pass (see :func:`forward_native`).

    Raises:
        InputError: bad hooks. CaptureError: a second recorder.
    """
    with attached(model, model.config.n_layers, "sinklab", hooks, lambda state: SinkLMSeam(model, state),
                  recorder=recorder) as state:
        if recorder is not None:
            seam = state.seam
            causal = getattr(model.config, "causal", True)
            seam.prefix_len = prefix_len
            seam.spec = MaskSpec(causal=causal, prefix_len=prefix_len if prefix_len > 1 else 0,
                                 window=getattr(model.config, "sliding_window", None))
            seam.raw_weights = not renormalise
        yield state


def forward_native(
    model: nn.Module,
    input_ids: Tensor,
    prefix_len: int = 0,
    *,
    edit=None,
    hidden_edit=None,
    logits: bool = False,
    keep_hidden: bool = False,
    entropy: bool = False,
    renormalise: bool = True,
) -> BatchRecorder:
    """One forward pass of a SinkLM on ``input_ids`` (B, T) with statistics recorded.

    The model's observer hands over each layer's (possibly renormalised) attention
    weights (B, H, T, T), which are reduced to column sums at once. The model runs with
    the mask it was trained with: its own sliding window (``config.sliding_window``) and
    the bidirectional prefix ``prefix_len`` (prefix LM; 0 = causal); a model with
    ``config.causal = False`` (masked diffusion LM) is recorded as bidirectional, like an encoder.

    ``edit`` (:data:`sinklab.capture.hf.AttentionEdit`) inspects or replaces each layer's
    weights through the observer (the model recomputes the output from the replacement);
    ``hidden_edit`` (:data:`sinklab.capture.hf.HiddenEdit`) may replace each block's output; both run
    as hooks (:func:`~sinklab.capture.sites.legacy_hooks`) after any hooks attached to the model.
    ``logits`` keeps ``recorder.logits`` (B, T, V); ``keep_hidden`` keeps every block's output;
    ``entropy`` records each head's mean attention entropy of the (possibly edited) weights the
    observer sees, the virtual key's weight counted as one more entry
    (:func:`sinklab.metrics.attention_entropy`). ``renormalise=False`` records the raw weights of
    operations whose rows do not sum to 1 (the observer's ``raw_weights``, see
    :func:`sinklab.nn.attention.wants_raw_weights`).
    """
    L = model.config.n_layers
    if not getattr(model.config, "causal", True):
        prefix_len = 0  # a bidirectional model: no prefix, every query sees every key
    recorder = BatchRecorder(L, "observer", keep_hidden=keep_hidden, entropy=entropy)
    with native_hooks(model, legacy_hooks(edit, hidden_edit), recorder=recorder, prefix_len=prefix_len,
                      renormalise=renormalise), torch.no_grad():
        out = model(input_ids, prefix_len=prefix_len)
    if logits:
        recorder.logits = out.logits
    return recorder
