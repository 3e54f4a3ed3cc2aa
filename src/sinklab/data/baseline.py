"""Reference losses a trained model must beat to count as having learned anything."""

from __future__ import annotations

import numpy as np
import torch

from sinklab.data.packing import IGNORE_INDEX


def unigram_logprobs(train_stream: np.ndarray, vocab_size: int, *, smoothing: float = 0.5) -> np.ndarray:
    """(V,) float64 natural-log probabilities of the smoothed training unigram distribution
    ``p(v) = (count_train(v) + s) / (n_train + s V)`` (see :func:`unigram_loss`).

    Raises:
        ValueError: ``smoothing <= 0`` or an id outside [0, V).
    """
    if smoothing <= 0:
        raise ValueError(f"smoothing must be > 0, got {smoothing}")
    counts = np.bincount(np.asarray(train_stream, dtype=np.int64), minlength=vocab_size).astype(np.float64)
    if counts.shape[0] > vocab_size:
        raise ValueError(f"training ids reach {counts.shape[0] - 1}, outside the vocabulary of {vocab_size}")
    return np.log(counts + smoothing) - np.log(counts.sum() + smoothing * vocab_size)


def unigram_loss(train_stream: np.ndarray, targets: torch.Tensor, vocab_size: int, *, smoothing: float = 0.5) -> float:
    """Cross-entropy (nats/token) of predicting every target from the training unigram distribution.

    ``p(v) = (count_train(v) + s) / (n_train + s V)`` (additive smoothing ``s`` so that a token
    unseen in training has a finite loss), evaluated on the unmasked ``targets``. A language model
    whose validation loss is above this has learned less than token frequencies: the sweep marks
    such a run ``degenerate`` and gives it no verdict (issue: a memorising model with val loss
    11 nats over a 66-token vocabulary supports no claim about sinks).

    The distribution counts every token of ``train_stream``, BOS included. Under packing ``bos`` a BOS is a
    target only where a window crosses from one document into the next (it follows the EOS: 1.5% of the targets
    with 64-token documents and T = 128); where every window is one whole document (``emergence-cpu``) no target
    is a BOS, the distribution gives the targets a little less probability than their own frequencies, and the
    baseline is higher by about ``-log(1 - share of BOS in the stream)`` (0.015 nats for 64-token documents).

    This is the causal objective's baseline. A training run records the baseline under its own objective and
    validation (:meth:`sinklab.train.tracker.SinkTracker.baseline_loss`: for masked diffusion, the masked diffusion
    loss of these log-probabilities on the tracker's fixed masks), which for the causal objective equals this.

    Args:
        train_stream: (n,) training token ids the model was trained on (after any cap).
        targets: (M, T) int64 validation targets, ``-100`` where masked.
        vocab_size: V, the model's vocabulary size (ids in [0, V)).
        smoothing: s > 0.

    Returns:
        Loss in nats per target token (``nan`` when no target is unmasked).

    Raises:
        ValueError: ``smoothing <= 0`` or an id outside [0, V).
    """
    logp = unigram_logprobs(train_stream, vocab_size, smoothing=smoothing)
    y = targets[targets != IGNORE_INDEX].numpy()
    if y.size == 0:
        return float("nan")
    if y.max() >= vocab_size or y.min() < 0:
        raise ValueError("a target id lies outside the vocabulary")
    return float(-logp[y].mean())
