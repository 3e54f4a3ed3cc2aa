"""The seam into sinklab's own :class:`sinklab.nn.SinkLM`: its per-layer observer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinklab.capture.recorder import BatchRecorder


def is_native(model: nn.Module) -> bool:
    """True for a sinklab-trained :class:`~sinklab.nn.SinkLM`."""
    return type(model).__name__ == "SinkLM" and type(model).__module__.startswith("sinklab.")


def forward_native(model: nn.Module, input_ids: Tensor) -> BatchRecorder:
    """One forward pass of a SinkLM on ``input_ids`` (B, T) with statistics recorded.

    The model's observer hands over each layer's (possibly renormalised) attention
    weights (B, H, T, T), which are reduced to column sums at once.
    """
    L = model.config.n_layers
    recorder = BatchRecorder(L, "observer")

    def observer(layer: int, weights: Tensor, *, renormalised: bool, extra=None, key=None, value=None) -> None:
        recorder.attn_calls += 1
        recorder.add_attention(
            layer,
            weights.sum(dim=-2, dtype=torch.float64),
            causal=True,
            key=key,
            value=value,
            extra=extra,
            renormalised=renormalised,
        )

    with torch.no_grad():
        out = model(input_ids, observer=observer, output_hidden_states=True)
    for i, h in enumerate(out.hidden_states[1:]):
        recorder.add_hidden(i, h)
    return recorder
