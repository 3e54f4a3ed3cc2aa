"""The seam into sinklab's own :class:`sinklab.nn.SinkLM`: its per-layer observer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinklab.capture.recorder import BatchRecorder


def is_native(model: nn.Module) -> bool:
    """True for a sinklab-trained :class:`~sinklab.nn.SinkLM`, also one wrapped in place by FSDP2
    ``fully_shard`` (whose class is a generated subclass ``FSDPSinkLM``)."""
    return any(c.__name__ == "SinkLM" and c.__module__.startswith("sinklab.") for c in type(model).__mro__)


def forward_native(model: nn.Module, input_ids: Tensor, prefix_len: int = 0) -> BatchRecorder:
    """One forward pass of a SinkLM on ``input_ids`` (B, T) with statistics recorded.

    The model's observer hands over each layer's (possibly renormalised) attention
    weights (B, H, T, T), which are reduced to column sums at once. The model runs with
    the mask it was trained with: its own sliding window (``config.sliding_window``) and
    the bidirectional prefix ``prefix_len`` (prefix LM; 0 = causal).
    """
    L = model.config.n_layers
    recorder = BatchRecorder(L, "observer")
    window = getattr(model.config, "sliding_window", None)

    def observer(layer: int, weights: Tensor, *, renormalised: bool, extra=None, key=None, value=None) -> None:
        recorder.attn_calls += 1
        recorder.add_attention(
            layer,
            weights.sum(dim=-2, dtype=torch.float64),
            causal_column_sums=weights.tril().sum(dim=-2, dtype=torch.float64) if prefix_len > 1 else None,
            prefix_len=prefix_len if prefix_len > 1 else 0,
            window=window,
            causal=True,
            key=key,
            value=value,
            extra=extra,
            renormalised=renormalised,
        )

    with torch.no_grad():
        out = model(input_ids, observer=observer, output_hidden_states=True, prefix_len=prefix_len)
    for i, h in enumerate(out.hidden_states[1:]):
        recorder.add_hidden(i, h)
    return recorder
