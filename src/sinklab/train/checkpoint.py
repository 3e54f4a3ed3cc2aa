"""Atomic checkpoints: model, optimizer, RNG states, data position, config.

A checkpoint is written to a temporary file in the run folder and renamed over the old one
(:func:`sinklab.fileio.atomic_write`, atomic on POSIX, with the mode the umask gives), so a crash or a
full disk during the write leaves the previous checkpoint intact.

A checkpoint holds only tensors and plain data (dicts, lists, tuples, strings, numbers, booleans,
None): the RNG states are stored as tensors and integers, not as pickled Python or NumPy objects.
It is read with ``torch.load(..., weights_only=True)``, so a checkpoint from someone else's run
folder cannot execute code when it is loaded; one that carries any other pickled object is
refused (:class:`UnsafeCheckpointError`). A file that is not a checkpoint at all (garbage,
truncated, another program's) is reported as corrupt or not a sinklab checkpoint; the message never
suggests an unsafe load.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab.errors import InputError, SinklabError, param
from sinklab.fileio import atomic_write

CHECKPOINT_NAME = "checkpoint.pt"


class CheckpointError(SinklabError):
    """A checkpoint could not be written or read."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holds pickled objects other than tensors and plain data (loading it could run code)."""


def _write(state: dict[str, Any], path: Path) -> None:
    """Serialise ``state`` to ``path`` and flush it to disk (separate so tests can make it fail)."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (:func:`sinklab.fileio.atomic_write`).

    ``state`` must hold only tensors and plain data (see the module docstring), else it could not
    be loaded back by :func:`load_checkpoint`.

    Temporary files a process killed mid-write left beside ``path`` are removed first.

    Raises:
        CheckpointError: the write failed (e.g. no space left); the temp file is removed and any
            previous checkpoint at ``path`` is untouched.
    """
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a process killed mid-write: a checkpoint's size each
        stale.unlink(missing_ok=True)
    try:
        atomic_write(path, lambda tmp: _write(state, tmp))
    except OSError as e:
        prev = f"the previous checkpoint {path} is intact" if path.exists() else "no earlier checkpoint exists"
        raise CheckpointError(
            f"could not write checkpoint at step {state.get('step')}: {e.strerror or e}; {prev}"
        ) from e


#: globals found in checkpoints written before RNG states were stored as tensors: NumPy's
#: array reconstruction only (a NumPy RNG state). Allowed for those files, nothing else.
_LEGACY_NUMPY_GLOBALS = {"numpy.dtype", "numpy.ndarray", "numpy._core.multiarray._reconstruct",
                         "numpy.core.multiarray._reconstruct", "numpy.dtypes.UInt32DType"}


def _legacy_numpy_safe_globals() -> list[Any]:
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


#: keys every checkpoint written by sinklab's training loop holds
RUN_CHECKPOINT_KEYS = ("step", "model", "optimizer", "rng", "config")


def _not_a_checkpoint(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"cannot read checkpoint {path}: it is corrupt or not a sinklab checkpoint ({why}); "
                           f"start the run again without {param('resume', True)} in a new {param('out')}, or restore the file")


def _why(e: BaseException) -> str:
    """The first line of torch's message, unless it is torch's advice to load unsafely."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return "it cannot be unpickled as tensors and plain data" if "weights_only" in text else text[:200]


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors mapped to CPU), without
    unpickling anything but tensors and plain data.

    Raises:
        InputError: no checkpoint at ``path``.
        UnsafeCheckpointError: the file carries other pickled objects (it is not loaded).
        CheckpointError: the file is unreadable, truncated, garbage or not a PyTorch checkpoint (the
            message says it is corrupt or not a sinklab checkpoint; it never suggests loading it
            with ``weights_only=False``).
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"no checkpoint at {path}; nothing to resume (run without {param('resume', True)})")
    try:
        if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; anything else is not ours
            raise _not_a_checkpoint(path, "not a PyTorch checkpoint archive")
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror or e}") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        try:
            unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # noqa: BLE001 - not a torch zip file at all
            unsafe = None
        if unsafe is None or not unsafe:
            raise _not_a_checkpoint(path, _why(e)) from None
        if unsafe <= _LEGACY_NUMPY_GLOBALS:  # an older sinklab checkpoint: NumPy RNG state as an array
            with torch.serialization.safe_globals(_legacy_numpy_safe_globals()):
                try:
                    return torch.load(path, map_location="cpu", weights_only=True)
                except Exception as e2:  # noqa: BLE001
                    raise _not_a_checkpoint(path, _why(e2)) from None
        names = ", ".join(sorted(unsafe)[:5]) + (" ..." if len(unsafe) > 5 else "")
        raise UnsafeCheckpointError(
            f"refusing to load checkpoint {path}: it carries pickled Python objects ({names}) besides tensors "
            "and plain data, and unpickling them could execute code; sinklab writes no such objects, so this "
            "file was not written by sinklab or was altered"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated or corrupt file
        raise _not_a_checkpoint(path, _why(e)) from None


def load_run_checkpoint(path: str | Path) -> dict[str, Any]:
    """:func:`load_checkpoint` of a training run's ``checkpoint.pt``, checked to hold what the training
    loop writes (:data:`RUN_CHECKPOINT_KEYS`).

    Raises:
        what :func:`load_checkpoint` raises; CheckpointError: a readable file without those keys.
    """
    state = load_checkpoint(path)
    missing = [k for k in RUN_CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise _not_a_checkpoint(Path(path), f"no {', '.join(missing)}")
    return state


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA RNG states, as tensors and plain data."""
    version, internal, gauss_next = random.getstate()
    _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": int(version), "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        "numpy": {"key": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state` (also the tuple format of older checkpoints)."""
    py = state["python"]
    if isinstance(py, dict):
        py = (py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"])
    random.setstate(py)
    npy = state["numpy"]
    if isinstance(npy, dict):
        npy = ("MT19937", npy["key"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    np.random.set_state(npy)
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
