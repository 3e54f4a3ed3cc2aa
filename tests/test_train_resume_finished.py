"""`sinklab train --resume` on a finished run (issue 12, item 3) and the throughput the last line
reports (item 4)."""

from __future__ import annotations

import json

import pytest

from helpers import run_cli_captured, synthetic_run_toml
from sinklab.cli.main import app
from sinklab.train import loop
from sinklab.runs.config import load_config


_run = run_cli_captured


@pytest.fixture
def cfg_file(tmp_path):
    f = tmp_path / "tiny.toml"
    f.write_text(synthetic_run_toml(steps=4))
    return f


def test_resume_of_a_finished_run_says_so_and_exits_0(cfg_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", str(cfg_file), "--out", str(out), "--no-progress"]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    files = {p.name: p.read_bytes() for p in (out / "summary.json", out / "metrics.jsonl", out / "checkpoint.pt")}
    code, stdout, err = _run(argv + ["--resume"], capsys)
    assert code == 0, err
    assert "is finished: 4 of 4 steps done" in stdout and "Traceback" not in err
    assert {p: (out / p).read_bytes() for p in files} == files  # nothing rewritten


def test_resume_of_a_finished_run_returns_the_runs_own_result(cfg_file, tmp_path):
    """train(resume=True) on a finished run returned a result with no emergence step, 0 tokens/s, wall 0 s and
    no losses (saving it would have overwritten train_result.json with them). It returns the run's own result,
    as train_result.json holds it, marked already_finished; and a run without that file gets summary.json's
    figures."""
    cfg = load_config(str(cfg_file))
    out = tmp_path / "run"
    first = loop.train(cfg, out, progress=False)
    again = loop.train(cfg, out, resume=True, progress=False)
    assert again.already_finished and "is finished: 4 of 4 steps done" in again.note
    assert first.losses and again.losses == first.losses and again.history == first.history
    assert (again.emergence_step, again.tokens_per_s, again.wall_s) == (first.emergence_step, first.tokens_per_s,
                                                                       first.wall_s)
    summary = json.loads((out / "summary.json").read_text())
    (out / "train_result.json").unlink()
    older = loop.train(cfg, out, resume=True, progress=False)
    assert older.already_finished and older.history == first.history
    assert (older.emergence_step, older.tokens_per_s, older.wall_s) == (summary["emergence_step"],
                                                                       summary["tokens_per_s"], summary["wall_s"])


def test_resume_of_a_finished_run_with_more_steps_continues_and_states_the_schedule(cfg_file, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", str(cfg_file), "--out", str(out), "--no-progress"]
    assert _run(argv, capsys)[0] == 0
    code, stdout, err = _run(argv + ["--resume", "--steps", "6"], capsys)
    assert code == 0, err
    assert "continuing to 6 steps" in err and "cosine schedule was fitted to 4 steps" in err
    assert "differs from 6 steps trained in one go" in err
    assert json.loads((out / "summary.json").read_text())["steps"] == 6
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    assert "done: 6 steps" in stdout


def test_constant_schedule_extension_equals_the_longer_run(cfg_file, tmp_path):
    base = load_config(cfg_file, ["optim.schedule=\"constant\""])
    longer = load_config(cfg_file, ["optim.schedule=\"constant\"", "train.steps=6"])
    straight = loop.train(longer, tmp_path / "a", progress=False)
    first = loop.train(base, tmp_path / "b", progress=False)
    notes = []
    rest = loop.train(longer, tmp_path / "b", resume=True, progress=False, notify=notes.append)
    assert {**first.losses, **rest.losses} == straight.losses
    assert len(notes) == 1 and "losses are those of 6 steps trained in one go" in notes[0] and rest.note == notes[0]


def test_last_line_reports_the_average_over_wall_time(cfg_file, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = _run(["train", str(cfg_file), "--out", str(out), "--no-progress"], capsys)
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    assert s["wall_s"] > 0
    # the reported rate is tokens / wall time of the whole run, not a median step's
    assert s["tokens_per_s"] == pytest.approx(s["tokens"] / s["wall_s"], rel=0.02)
    assert s["median_step_tokens_per_s"] == pytest.approx(s["tokens"] / s["steps"] / s["seconds_per_step"], rel=0.02)
    line = stdout.strip().splitlines()[-1]
    assert f"{s['tokens_per_s']:,.0f} tokens/s on average" in line
    assert f"optimizer steps alone: {s['median_step_tokens_per_s']:,.0f} tokens/s, median step" in line


def test_resumed_run_average_counts_every_start(cfg_file, tmp_path):
    cfg = load_config(cfg_file)
    import time

    loop.train(cfg, tmp_path / "r", progress=False, stop_after=2)
    t0 = time.perf_counter()
    res = loop.train(cfg, tmp_path / "r", resume=True, progress=False)
    assert res.wall_s > time.perf_counter() - t0  # the first start's wall time is included
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["wall_s"] == pytest.approx(res.wall_s, abs=0.01)
    assert res.tokens_per_s == pytest.approx(4 * cfg.tokens_per_step / res.wall_s)


def test_a_run_whose_corpus_changed_is_not_resumed_or_measured_on_other_data(tmp_path):
    """A run re-derived its data from whatever its corpus folder held: an edited file between a stop and --resume
    trained the rest of the run on other windows (with BPE, other token ids), and measuring a finished run after a
    file was added took training documents as held-out ones. The run records its tokenized data's digest
    (checkpoint and summary.json); a resume and a measurement on changed data are refused in one line."""
    from helpers import text_run_toml, train_run, word_texts
    from sinklab.errors import InputError
    from sinklab.measure import measure

    texts = word_texts(tmp_path / "texts")
    toml = text_run_toml(texts, steps=4)
    stopped = train_run(tmp_path, "stopped", toml, stop_after=2)
    (texts / "d3.txt").write_text((texts / "d3.txt").read_text() + " and the rest")
    with pytest.raises(InputError, match="its training data changed since the checkpoint at step 2"):
        loop.train(load_config(tmp_path / "stopped.toml"), stopped, resume=True, progress=False)
    done = train_run(tmp_path, "done", toml)  # on the edited corpus
    assert json.loads((done / "summary.json").read_text())["data_key"]
    m = measure(model=str(done), num_samples=2, progress=False)  # unchanged data: measured as before
    assert m.probe.input_ids.shape[0] == 2
    (texts / "d99.txt").write_text("the of and to " * 50)
    with pytest.raises(InputError, match="was trained on other data than its corpus holds now"):
        measure(model=str(done), num_samples=2, progress=False)
