"""The seam into sinklab's own :class:`sinklab.nn.SinkLM`: its per-layer observer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinklab.attention_masks import MaskSpec, repeat_kv
from sinklab.capture.recorder import BatchRecorder
from sinklab.metrics.entropy import attention_entropy


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
    ``hidden_edit`` (:data:`sinklab.capture.hf.HiddenEdit`) may replace each block's output.
    ``logits`` keeps ``recorder.logits`` (B, T, V); ``keep_hidden`` keeps every block's output;
    ``entropy`` records each head's mean attention entropy of the (possibly edited) weights the
    observer sees, the virtual key's weight counted as one more entry
    (:func:`sinklab.metrics.attention_entropy`). ``renormalise=False`` records the raw weights of
    operations whose rows do not sum to 1 (the observer's ``raw_weights``, see
    :func:`sinklab.nn.attention.wants_raw_weights`).
    """
    L = model.config.n_layers
    causal = getattr(model.config, "causal", True)
    if not causal:
        prefix_len = 0  # a bidirectional model: no prefix, every query sees every key
    recorder = BatchRecorder(L, "observer", keep_hidden=keep_hidden, entropy=entropy)
    spec = MaskSpec(causal=causal, prefix_len=prefix_len if prefix_len > 1 else 0,
                    window=getattr(model.config, "sliding_window", None))
    H = model.config.n_heads

    def observer(layer: int, weights: Tensor, *, renormalised: bool, extra=None, key=None, value=None, query=None):
        recorder.attn_calls += 1
        edited = None
        if edit is not None:
            rep = H // key.shape[1]
            edited = edit(layer, weights, query=query, key=repeat_kv(key, rep), value=repeat_kv(value, rep))
            weights = weights if edited is None else edited
        recorder.add_attention(
            layer,
            weights.sum(dim=-2, dtype=torch.float64),
            spec,
            causal_column_sums=weights.tril().sum(dim=-2, dtype=torch.float64) if prefix_len > 1 else None,
            key=key,
            value=value,
            extra=extra,
            renormalised=renormalised,
            entropy=attention_entropy(weights, extra) if entropy else None,
        )
        return edited

    observer.wants_query = edit is not None
    observer.raw_weights = not renormalise
    handles = []
    if hidden_edit is not None:
        for i, block in enumerate(model.layers):
            handles.append(block.register_forward_hook(lambda _m, _i, o, i=i: hidden_edit(i, o)))
    try:
        with torch.no_grad():
            out = model(input_ids, observer=observer, output_hidden_states=True, prefix_len=prefix_len)
    finally:
        for h in handles:
            h.remove()
    for i, h in enumerate(out.hidden_states[1:]):
        recorder.add_hidden(i, h)
    if logits:
        recorder.logits = out.logits
    return recorder
