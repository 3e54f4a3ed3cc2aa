"""Pre-training: learning-rate schedule, checkpoints, sink tracker and the training loop.

The run's config (TOML <-> dataclasses, presets) is :mod:`sinklab.runs.config`; a run folder's data,
probe and model are rebuilt by :class:`sinklab.runs.Run`.

* :mod:`sinklab.train.schedule` -- warm-up + constant/cosine learning rate.
* :mod:`sinklab.train.checkpoint` -- atomic checkpoints (model, optimizer, RNG, data position).
* :mod:`sinklab.train.tracker` -- sink metrics on a fixed probe set during training.
* :mod:`sinklab.train.loop` -- :func:`train`, the loop itself.

The names in ``__all__`` are importable from the package itself (``from sinklab.train import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (imported on first use, so importing the package stays cheap)
_EXPORTS = {
    "train": "sinklab.train.loop",
    "TrainResult": "sinklab.train.loop",
    "TrainingInterrupted": "sinklab.train.loop",
    "TrainingDiverged": "sinklab.train.loop",
    "save_checkpoint": "sinklab.train.checkpoint",
    "load_checkpoint": "sinklab.train.checkpoint",
    "SinkTracker": "sinklab.train.tracker",
    "lr_at": "sinklab.train.schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
