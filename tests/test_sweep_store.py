"""A study's runs as one table (sinklab.sweep.store): the table restores every run file byte for byte, a
packed study summarises to the same summary.csv as its folders, and a sweep over a packed study trains
nothing again."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from sinklab.errors import InputError
from sinklab.sweep.store import PACKED_FILES, TABLE, pack, runs_dir, unpack, unpack_in_place

STUDY = Path(__file__).resolve().parents[1] / "results" / "norm_position"  # a small committed study


@pytest.fixture
def study(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    dst = tmp_path / "norm_position"
    shutil.copytree(STUDY, dst)
    unpack_in_place(dst)  # the committed study may be packed already: start from its run folders
    assert (dst / "runs" / "pre" / "seed100" / "metrics.jsonl").is_file()
    return dst


def _files(runs: Path) -> dict[str, bytes]:
    return {str(p.relative_to(runs)): p.read_bytes() for p in sorted(runs.rglob("*")) if p.is_file()}


def test_pack_restores_every_file_byte_for_byte(study, tmp_path):
    before = _files(study / "runs")
    table = pack(study)
    assert not (study / "runs").exists() and table == study / TABLE
    assert _files(unpack(study, tmp_path / "back")) == before
    # one table of every run's lines: metrics.jsonl line by line, with point / seed columns
    rows = [json.loads(x) for x in gzip.decompress(table.read_bytes()).decode().splitlines()]
    metrics = [r for r in rows if r["file"] == "metrics.jsonl" and r["point"] == "pre" and r["seed"] == 100]
    assert "".join(r["text"] for r in metrics) == before["pre/seed100/metrics.jsonl"].decode()
    assert [r["line"] for r in metrics] == list(range(len(metrics)))


def test_packed_study_summarises_as_its_folders(study):
    from sinklab.sweep.summary import summarize_sweep

    summarize_sweep(study, plot=False)
    folders = (study / "summary.csv").read_text()
    pack(study)
    (study / "summary.csv").unlink()
    summarize_sweep(study, plot=False)
    assert (study / "summary.csv").read_text() == folders
    assert runs_dir(study).name != "runs" and (runs_dir(study) / ".complete").exists()


def test_unpack_in_place_before_training(study):
    before = _files(study / "runs")
    pack(study)
    assert unpack_in_place(study) and not (study / TABLE).exists()
    assert _files(study / "runs") == before
    assert not unpack_in_place(study)  # folders there: nothing to do


def test_pack_refuses_to_lose_files(study):
    extra = next((study / "runs").glob("*/seed*")) / "notes.txt"
    extra.write_text("keep me")
    with pytest.raises(InputError, match="would lose"):
        pack(study)
    assert extra.exists() and not (study / TABLE).exists()
    with pytest.raises(InputError, match="no run folders"):
        pack(study / "runs" / "pre")


def test_one_run_point_folders_round_trip(tmp_path):
    """Sweeps made before seed folders (results/archive: runs/<point>/ holds one run's files) pack too,
    and unpack to the same layout byte for byte."""
    out = tmp_path / "old_sweep"
    files = {"a/metrics.jsonl": '{"step": 0, "loss": 3.5}\n{"step": 10, "loss": 2.25}\n',
             "a/config.toml": "[model]\nlayers = 2\n", "b.c/metrics.jsonl": '{"step": 0}\n',
             "b.c/summary.json": '{"sink1": 0.5}'}
    for rel, text in files.items():
        (out / "runs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "runs" / rel).write_text(text, encoding="utf-8")
    pack(out)
    assert not (out / "runs").exists()
    rows = [json.loads(x) for x in gzip.decompress((out / TABLE).read_bytes()).decode().splitlines()]
    assert {(r["point"], r["seed"]) for r in rows} == {("a", ""), ("b.c", "")}
    back = unpack(out, tmp_path / "back")
    assert {k: v.decode() for k, v in _files(back).items()} == files


def test_odd_run_files_round_trip_byte_for_byte(tmp_path):
    """A run stopped before its first log line (empty metrics.jsonl), a progress bar's carriage returns and CRLF
    line ends in train.log, and a raw U+2028 inside a JSON string survive pack / unpack exactly: the table was
    read with universal newlines (the '\\r' dropped) and an empty metrics.jsonl came back missing, which made
    pack(remove=True) crash after writing the table."""
    out = tmp_path / "odd"
    files = {"a/seed1/metrics.jsonl": b"",
             "a/seed1/train.log": b"step 1/6\rstep 6/6\r\nwindows\r\n",
             "a/seed2/metrics.jsonl": '{"step": 0, "note": "x\u2028y\u0085z"}\r\n{"step": 1}'.encode(),
             "a/seed2/summary.json": '{"text": "a\u2029b"}'.encode()}
    for rel, data in files.items():
        (out / "runs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "runs" / rel).write_bytes(data)
    pack(out)  # remove=True: checks the table restores every file before deleting the folders
    assert not (out / "runs").exists()
    assert _files(unpack(out, tmp_path / "back")) == files
    rows = [json.loads(x) for x in gzip.decompress((out / TABLE).read_bytes()).decode().split("\n") if x]
    metrics = [r for r in rows if r["file"] == "metrics.jsonl" and r["seed"] == 2]
    assert [r["line"] for r in metrics] == [0, 1]  # lines are cut at '\\n' only


def test_a_run_trained_now_packs_whole(tmp_path, monkeypatch):
    """Every file a run folder of today's train() holds is packed or deliberately left out (weights): a study
    swept at HEAD packs without refusing (train_result.json was once refused)."""
    from sinklab.runs.config import load_config
    from sinklab.train.loop import train
    from test_sweep import TINY

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    (tmp_path / "tiny.toml").write_text(TINY)
    out = tmp_path / "study"
    run = out / "runs" / "p" / "seed0"
    train(load_config(tmp_path / "tiny.toml"), run, progress=False)
    names = {p.name for p in run.iterdir()}
    assert names - set(PACKED_FILES) <= {"checkpoint.pt", "final"}, names
    before = _files(out / "runs")
    pack(out, remove=False)
    back = _files(unpack(out, tmp_path / "back"))
    assert {k: v for k, v in before.items() if k.split("/")[2] in PACKED_FILES} == back


def test_a_packed_study_is_unpacked_by_one_reader_at_a_time(study, tmp_path):
    """Two readers of one packed table shared one '<digest>.tmp' folder and deleted each other's work: a cache
    entry marked complete with 24 of 1,006 files (an audit's race). The unpack now holds the entry's lock: while
    another holder has it, nothing is published; after, the entry is whole."""
    import threading
    import time

    from sinklab.fileio import exclusive

    before = _files(study / "runs")
    pack(study)
    digest = __import__("hashlib").sha256((study / TABLE).read_bytes()).hexdigest()[:16]
    home = tmp_path / "home" / "unpacked"
    got = {}
    with exclusive(home / f".{digest}.lock"):
        t = threading.Thread(target=lambda: got.setdefault("d", runs_dir(study)))
        t.start()
        time.sleep(0.5)
        assert not (home / digest).exists()
    t.join(60)
    assert got["d"] == home / digest and _files(got["d"]) == {**before, ".complete": (got["d"] / ".complete").read_bytes()}


def test_final_metrics_are_computed_again_for_a_run_extended_since(tmp_path):
    """final_ci.json cached a run's final-model metrics for good: a finished run extended by more steps kept the
    old model's numbers. The cache records the run's steps; another step count computes them again."""
    import json

    from helpers import synthetic_run_toml, train_run
    from sinklab.sweep.summary import final_ci

    run = train_run(tmp_path, "r", synthetic_run_toml(steps=4))
    first = final_ci(run)
    assert first["run_steps"] == 4
    cache = run / "final_ci.json"
    marked = {**first, "sink_rate": [-1.0] * len(first["sink_rate"])}
    cache.write_text(json.dumps(marked))
    assert final_ci(run)["sink_rate"][0] == -1.0  # the same run: the cache is used
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "steps": 8}))  # as after an extension
    again = final_ci(run)
    assert again["sink_rate"] == first["sink_rate"] and again["run_steps"] == 8
    legacy = {k: v for k, v in marked.items() if k != "run_steps"}  # a cache written before run_steps: kept
    cache.write_text(json.dumps(legacy))
    assert final_ci(run)["sink_rate"][0] == -1.0
