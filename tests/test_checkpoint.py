"""Checkpoints hold tensors and plain data only; a checkpoint carrying a pickled object is refused
without running it (issue 12, item 9)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from sinklab.errors import SinklabError
from sinklab.train.checkpoint import (
    CheckpointError, UnsafeCheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state,
)


class _Payload:
    """Unpickling this creates a file: stands for any code a shared checkpoint could run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gaussian in Python's state
    np.random.standard_normal()  # and in NumPy's
    save_checkpoint(tmp_path / "c.pt", {"step": 7, "rng": rng_state(), "config": {"a": {"b": [1, 2.5, "x", None]}}})
    expected = _draws()
    _draws()
    ck = load_checkpoint(tmp_path / "c.pt")
    set_rng_state(ck["rng"])
    assert _draws() == expected
    assert ck["step"] == 7 and ck["config"] == {"a": {"b": [1, 2.5, "x", None]}}


def test_checkpoint_with_pickled_object_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "model": {}, "extra": _Payload(str(marker))}, path)
    with pytest.raises(UnsafeCheckpointError) as e:
        load_checkpoint(path)
    assert isinstance(e.value, SinklabError)
    assert "refusing to load" in str(e.value) and "execute code" in str(e.value)
    assert not marker.exists()


def test_cli_resume_from_a_booby_trapped_checkpoint_exits_2(tmp_path, capsys):
    from sinklab.cli.main import app

    out = tmp_path / "run"
    out.mkdir()
    marker = tmp_path / "code-ran"
    torch.save({"step": 1, "config": {}, "rng": _Payload(str(marker))}, out / "checkpoint.pt")
    with pytest.raises(SystemExit) as e:
        app(["train", "emergence-cpu", "--out", str(out), "--resume", "--no-progress"])
    assert e.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err) == 1 and "refusing to load checkpoint" in err[0]
    assert not marker.exists()


def test_corrupt_checkpoint_is_a_checkpoint_error(tmp_path):
    (tmp_path / "c.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "c.pt")


def test_older_checkpoint_with_numpy_rng_state_still_loads(tmp_path):
    """Checkpoints written before RNG states became tensors hold a NumPy array: still resumable."""
    np.random.seed(5)
    legacy = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save({"step": 3, "rng": legacy}, tmp_path / "old.pt")
    expected = float(np.random.rand())
    ck = load_checkpoint(tmp_path / "old.pt")
    set_rng_state(ck["rng"])
    assert float(np.random.rand()) == expected
