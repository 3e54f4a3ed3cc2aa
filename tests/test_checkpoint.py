"""Checkpoints hold tensors and plain data only; a checkpoint carrying a pickled object is refused
without running it (issue 12, item 9)."""

from __future__ import annotations

import random
from pathlib import Path

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


def test_a_checkpoint_write_removes_the_temporary_files_of_killed_writes(tmp_path):
    """A process killed mid-write leaves its '.checkpoint.pt.*.tmp' (a checkpoint's size each; an audit's kill loop
    piled up five); the next write removes them, and the checkpoint itself is the new one."""
    from sinklab.train.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    stale = [tmp_path / ".checkpoint.pt.k1ll3d.tmp", tmp_path / ".checkpoint.pt.x.tmp"]
    for p in stale:
        p.write_bytes(b"\0" * 1000)
    other = tmp_path / ".summary.json.y.tmp"  # another file's: not ours to remove
    other.write_text("{}")
    save_checkpoint(path, {"step": 3, "w": torch.ones(2)})
    assert not any(p.exists() for p in stale) and other.exists()
    assert load_checkpoint(path)["step"] == 3


def test_a_killed_truncation_of_the_training_log_keeps_it_whole(tmp_path, monkeypatch):
    """On resume the log is cut back to the checkpoint's step; it was rewritten in place, so a kill during the
    rewrite lost every line (a resumed run then had steps 31-60 only). The rewrite is atomic now: a failure in it
    leaves the old log as it was."""
    import json

    from sinklab.train import loop

    log = loop._MetricsLog(tmp_path, tensorboard=False)
    for step in range(1, 6):
        log.write({"step": step, "loss": 1.0 / step})
    before = (tmp_path / "metrics.jsonl").read_bytes()

    real_write = Path.write_text

    def killed(self, text, *a, **k):  # the file opened (emptied), half written, then a Ctrl-C
        real_write(self, text[: len(text) // 2], *a, **k)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        log.truncate_after(3)
    assert (tmp_path / "metrics.jsonl").read_bytes() == before
    monkeypatch.undo()
    log.truncate_after(3)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
