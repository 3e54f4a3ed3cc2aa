"""Atomic checkpoints: model, optimizer, RNG states, data position, config.

A checkpoint is written to ``<name>.tmp`` and renamed over the old one with ``os.replace``
(atomic on POSIX), so a crash or a full disk during the write leaves the previous checkpoint
intact.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab.errors import InputError, SinklabError

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(SinklabError):
    """A checkpoint could not be written or read."""


def _write(state: dict[str, Any], path: Path) -> None:
    """Serialise ``state`` to ``path`` and flush it to disk (separate so tests can make it fail)."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temp file + ``os.replace``).

    Raises:
        CheckpointError: the write failed (e.g. no space left); the temp file is removed and any
            previous checkpoint at ``path`` is untouched.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write(state, tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        prev = f"the previous checkpoint {path} is intact" if path.exists() else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write checkpoint at step {state.get('step')}: {e.strerror or e}; {prev}"
        ) from e


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors mapped to CPU).

    Raises:
        InputError: no checkpoint at ``path``.
        CheckpointError: the file is unreadable.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"no checkpoint at {path}; nothing to resume (run without --resume)")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure
        raise CheckpointError(f"cannot read checkpoint {path}: {e}") from e


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA RNG states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
