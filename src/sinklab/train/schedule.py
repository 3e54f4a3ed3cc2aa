"""Learning-rate schedule: linear warm-up, then constant or cosine decay."""

from __future__ import annotations

import math

from sinklab.runs.config import OptimConfig


def lr_at(step: int, optim: OptimConfig, total_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total_steps``.

    Warm-up: ``lr * (step + 1) / warmup_steps`` for ``step < warmup_steps``. Then ``constant``
    keeps ``lr``; ``cosine`` follows ``lr_min + (lr - lr_min) * (1 + cos(pi * s)) / 2`` with
    ``s = (step - warmup) / (total - 1 - warmup)`` (at least 1 in the denominator) going from 0 at the
    first step after the warm-up to 1 at the last step (0-based ``total - 1``), and
    ``lr_min = min_lr_ratio * lr``. The peak ``lr`` is thus used twice: at the last warm-up step and the
    first cosine step.
    """
    lr, warm = optim.lr, optim.warmup_steps
    if step < warm:
        return lr * (step + 1) / warm
    if optim.schedule == "constant":
        return lr
    lr_min = optim.min_lr_ratio * lr
    span = max(1, total_steps - 1 - warm)
    s = min(1.0, (step - warm) / span)
    return lr_min + (lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * s))
