"""End to end: `sinklab train` on a small text folder writes config.toml, metrics.jsonl and final/."""

import json
import random
import tomllib
from pathlib import Path

import pytest

from typer.testing import CliRunner

from sinklab.cli.main import _load_commands, cli

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()


def test_train_cli_end_to_end(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    rng = random.Random(1)
    for i in range(12):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(300)))
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(f"""
[model]
d_model = 16
n_layers = 1
n_heads = 2
d_ff = 32
[data]
corpus = "{texts}"
vocab_size = 270
seq_len = 16
val_fraction = 0.25
cache_dir = "run"
[train]
steps = 4
batch_size = 2
log_every = 1
checkpoint_every = 2
[track]
every = 2
n_probe = 4
probe_len = 12
positions = 3
val_windows = 2
""")
    out = tmp_path / "run"
    _load_commands()
    argv = ["train", str(cfg), "--out", str(out), "--set", "optim.lr=0.002", "--steps", "4", "--no-progress"]
    # obj: the command as typed, as sinklab.cli.main.app hands it on
    res = CliRunner().invoke(cli, argv, catch_exceptions=False, obj={"argv": argv})
    assert res.exit_code == 0, res.output
    assert "Sink_1" in res.output
    lines = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    for r in lines:
        assert {"step", "loss", "tokens_per_s"} <= set(r)
    tracked = [r for r in lines if "val_loss" in r]
    assert [r["step"] for r in tracked] == [2, 4]
    for r in tracked:
        assert {"val_loss", "sink_rate", "attention_mass_first", "norm_ratio", "max_norm_ratio"} <= set(r)
        assert len(r["sink_rate"]) == 3 and all(0 <= v <= 100 for v in r["sink_rate"])
        # uniform causal attention over 12 tokens puts at least 1/12 on token 1 on average; weights are real
        assert 0 < r["attention_mass_first"] <= 1
    saved = tomllib.loads((out / "config.toml").read_text())
    assert saved["optim"]["lr"] == 0.002 and saved["train"]["steps"] == 4
    assert (out / "tb").is_dir() and any((out / "tb").iterdir())
    # final/ is what `sinklab measure --model DIR/final` loads
    from sinklab.models import load_model

    loaded = load_model(str(out / "final"))
    ids = loaded.tokenizer("the of and", add_special_tokens=True).input_ids
    assert loaded.tokenizer.decode(ids) == "the of and"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["weight_decay"]["applied_to"] == "matrices" and summary["steps"] == 4
    # the command as typed, in summary.json and in the run's Result (train_result.json)
    from sinklab.train import TrainResult

    typed = "sinklab " + " ".join(argv)
    assert summary["command"] == typed and TrainResult.load(out).command == typed


def test_train_cli_bad_key_exits_2(tmp_path, capsys):
    import pytest

    from sinklab.cli.main import app

    with pytest.raises(SystemExit) as e:
        app(["train", "tiny-cpu", "--out", str(tmp_path), "--set", "optim.weight_decy=0.5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'weight_decy'" in err and "'weight_decay'" in err


def test_list_presets():
    from sinklab.cli.main import LISTERS

    _load_commands()
    names = [n for n, _ in LISTERS.get("presets")()]
    assert {"tiny-cpu", "paper-60m", "paper-1b"} <= set(names)


def test_preset_descriptions_are_whole():
    """issue 21, item 9: emergence-cpu's three-line comment was listed up to its first line's end ("... lr 1e-2:
    the"). The description is the whole leading comment block, read here line by line from the file."""
    from sinklab.cli.main import LISTERS
    from sinklab.runs.config import presets

    _load_commands()
    listed = dict(LISTERS.get("presets")())
    for name, path in presets().items():
        block = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            block.append(line[1:].strip())
        assert listed[name] == " ".join(block), name
    assert listed["emergence-cpu"].endswith("(results/attention_operation). About 2-6 minutes per run on one core of a loaded machine.")
    assert "\n" not in "".join(listed.values())


# ---------------------------------------------------------------------------------------------------------------
# Issue 21, items 6 and 7: plain progress lines without a terminal, Ctrl-C says how to continue, --threads


def _src() -> str:
    import sinklab

    return str(Path(sinklab.__file__).resolve().parents[1])


@pytest.mark.integration
def test_train_without_a_terminal_prints_plain_progress_lines_and_takes_threads(tmp_path):
    """stderr to a pipe (as in `sinklab train ... 2> log`): one plain line per 10% of the steps, no carriage
    return or cursor code; --threads 1 sets train.threads (torch defaults to one thread per core)."""
    import os
    import subprocess
    import sys

    from helpers import synthetic_run_toml

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=10))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = _src()
    p = subprocess.run([sys.executable, "-m", "sinklab", "train", str(cfg), "--out", str(tmp_path / "run"),
                        "--threads", "1"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "\r" not in p.stderr and "\x1b" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("train: step ")]
    assert [ln.split()[2] for ln in lines] == [f"{k}/10" for k in range(1, 11)], p.stderr  # each step is 10%
    assert lines[4].startswith("train: step 5/10 (50%), ") and " left; loss " in lines[4]
    assert lines[-1].startswith("train: step 10/10 (100%), ") and "left" not in lines[-1]
    assert tomllib.loads((tmp_path / "run" / "config.toml").read_text())["train"]["threads"] == 1
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["threads"] == 1


def _interrupt_at(monkeypatch, step: int) -> None:
    """Ctrl-C as 1-based step ``step`` starts (the training loop's fault hook runs there)."""
    from sinklab.train import distributed

    def ctrl_c(d, s):
        if s == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "maybe_fault", ctrl_c)


def _train(argv, capsys) -> tuple[int, list[str]]:
    from sinklab.cli.main import app

    try:
        app(argv)
        code = 0
    except SystemExit as e:
        code = e.code or 0
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_ctrl_c_says_which_checkpoint_is_kept_and_the_command_that_continues(tmp_path, monkeypatch, capsys):
    import shlex

    from helpers import synthetic_run_toml

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=6))  # a checkpoint every 2 steps
    out = tmp_path / "run"
    _interrupt_at(monkeypatch, 4)
    code, err = _train(["train", str(cfg), "--out", str(out), "--steps", "6", "--no-progress"], capsys)
    command = f"sinklab train {cfg} --out {out} --set train.steps=6 --resume --no-progress"
    assert code == 130
    assert err[-1] == (f"interrupted at step 3 of 6; kept the checkpoint of step 2 in {out / 'checkpoint.pt'} "
                       f"(steps after it are trained again); continue with: {command}"), err
    monkeypatch.undo()
    code, err = _train(shlex.split(command)[1:], capsys)
    assert code == 0 and f"resuming {out} from its checkpoint at step 2 (of 6)" in err, err
    code, _ = _train(["train", str(cfg), "--out", str(tmp_path / "whole"), "--steps", "6", "--no-progress"], capsys)
    assert code == 0

    def losses(run):
        return [(r["step"], r["loss"]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())]

    assert losses(out) == losses(tmp_path / "whole") and len(losses(out)) == 6


def test_ctrl_c_before_the_first_checkpoint_says_nothing_was_kept(tmp_path, monkeypatch, capsys):
    import shlex

    from helpers import synthetic_run_toml
    from sinklab.train import loop

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=4))
    out = tmp_path / "run"
    _interrupt_at(monkeypatch, 2)
    code, err = _train(["train", str(cfg), "--out", str(out), "--no-progress"], capsys)
    command = f"sinklab train {cfg} --out {out} --no-progress"
    assert code == 130 and err[-1] == ("interrupted at step 1 of 4, before the first checkpoint: nothing was kept; "
                                       f"start it again with: {command}"), err
    monkeypatch.setattr(loop.distributed, "maybe_fault", lambda d, s: None)
    code, err = _train(shlex.split(command)[1:], capsys)
    assert code == 0 and (out / "summary.json").exists(), err


def test_every_command_that_runs_a_model_has_the_one_threads_option():
    import inspect

    from sinklab.cli import analyze_cmd, measure_cmd, stream_cmd, train_cmd
    from sinklab.cli.common import THREADS

    streams = list(stream_cmd.commands().values())
    assert {"perplexity", "passkey", "needle", "ruler"} <= set(stream_cmd.commands())
    for fn in (measure_cmd.measure_cmd, *analyze_cmd.commands().values(), *streams, train_cmd.train_cmd):
        assert inspect.signature(fn).parameters["threads"].default is THREADS, fn.__name__
    assert len(analyze_cmd.commands()) == 9  # one `sinklab analyze KIND` per registered analysis


@pytest.mark.parametrize("command", ["measure", "analyze"])
def test_threads_option_sets_torch_threads_before_the_model_runs(command, monkeypatch, capsys, tiny_model_dir):
    import sys

    import torch

    import sinklab.analyze
    import sinklab.measure
    from sinklab.errors import InputError

    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    seen = []

    def fake(*a, **kw):
        seen.append(torch.get_num_threads())
        raise InputError("stop here")

    monkeypatch.setattr(sys.modules["sinklab.measure"], "measure", fake)  # the subpackage: sinklab.measure is the function
    from sinklab.cli.analyze_cmd import commands

    commands()  # the analyze subcommands are built from the real entry points first (order-independent under xdist)
    monkeypatch.setattr(sinklab.analyze.ANALYSES, "get", lambda name: fake)
    argv = ["measure", "--model", str(tiny_model_dir)] if command == "measure" else ["analyze", "massive"]
    try:
        code, err = _train([*argv, "--threads", str(want)], capsys)
    finally:
        torch.set_num_threads(before)
    assert code == 2 and seen == [want], err
