"""Run a probe set through a model and gather :class:`ProbeStats`."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from sinklab.capture.adapter import adapt
from sinklab.capture.collectors import COLLECTORS
from sinklab.capture.stats import ProbeStats
from sinklab.errors import InputError
from sinklab.models import input_device  # re-exported: where the input ids go (one owner)
from sinklab.progress import progress as show_progress


def collect(
    model: nn.Module,
    input_ids: Tensor,
    *,
    batch_size: int = 16,
    collector: str = "auto",
    progress: bool = False,
    prefix_len: int = 0,
    entropy: bool = False,
    renormalise: bool = True,
) -> ProbeStats:
    """Attention mass, hidden-state norms and key/value norms of every probe sequence.

    Works for ``transformers`` models whose attention goes through
    ``AttentionInterface`` (LLaMA, Gemma 3, GPT-2, GPT-NeoX, BERT, ...; others fall back
    to ``output_attentions``) and for sinklab's :class:`~sinklab.nn.SinkLM`. The model
    is left exactly as it was.

    Args:
        model: the model, in eval mode.
        input_ids: (N, T) int64 token ids, no padding; position 0 is the first token.
        batch_size: sequences per forward pass.
        collector: name in :data:`sinklab.capture.COLLECTORS` (HF models only), or
            ``auto`` (see :func:`resolve_collector`).
        progress: show progress over batches (:func:`sinklab.progress.progress`: a bar on a
            terminal, plain lines in a log file).
        prefix_len: run a sinklab model with a bidirectional prefix of this many tokens
            (the prefix-LM mask it was trained with); 0 = its plain causal mask. A sinklab
            model's sliding window (``config.sliding_window``) is always applied.
        entropy: also record each head's attention entropy (mean over queries, in nats:
            :attr:`ProbeStats.attention_entropy`); costs one ``xlogy`` over every attention tile.
        renormalise: a sinklab model's operations whose rows do not sum to 1 (sigmoid/ReLU without
            normalisation, kernels, ...) are recorded with rows renormalised to sum to 1 (True, the
            paper's proxy scores) or raw (False, ``ProbeStats.renormalised`` False); softmax rows
            and ``transformers`` models are unaffected.

    Returns:
        :class:`ProbeStats` with ``N`` samples.

    Raises:
        InputError: ``input_ids`` is not a non-empty 2-D integer tensor, or ``prefix_len``
            is set for a ``transformers`` model or lies outside [0, T].
        CaptureError: the model exposes no attention weights.
    """
    if input_ids.dim() != 2 or input_ids.numel() == 0 or input_ids.dtype not in (torch.int64, torch.int32):
        raise InputError(f"input_ids must be a non-empty (N, T) integer tensor, got {tuple(input_ids.shape)} {input_ids.dtype}")
    adapter = adapt(model)
    if prefix_len and not adapter.accepts_prefix:
        raise InputError("prefix_len applies to sinklab models trained as prefix LMs, not to transformers models")
    if not 0 <= prefix_len <= input_ids.shape[1]:
        raise InputError(f"prefix_len must lie in [0, T={input_ids.shape[1]}], got {prefix_len}")
    collector = resolve_collector(collector)
    device = input_device(model)
    parts = []
    starts = range(0, input_ids.shape[0], batch_size)
    for s in show_progress(starts, desc="probe", unit="batch", enabled=progress):
        batch = input_ids[s : s + batch_size].to(device)
        rec = adapter.capture(batch, collector=collector, prefix_len=prefix_len, entropy=entropy,
                              renormalise=renormalise)
        parts.append(rec.finish())
    return ProbeStats.concat(parts)


def resolve_collector(name: str) -> str:
    """``auto`` -> ``blockwise`` when registered (never builds T x T), else ``eager``; other names are checked.

    Raises:
        UnknownNameError: unknown collector.
    """
    if name == "auto":
        return "blockwise" if "blockwise" in COLLECTORS else "eager"
    COLLECTORS.get(name)
    return name
