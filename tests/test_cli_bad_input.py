"""No sinklab command ends in a traceback on user input: every command and option, given a bad value,
exits with status 2 and a one-line message (issue 12, items 2 and 6); an output location that cannot be
written is refused before any work, and a damaged file sinklab reads is named in that line (issue 21,
items 1 and 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import synthetic_run_toml
from sinklab.cli.main import _load_commands, app, cli

MODEL = "{model}"  # placeholders filled per test: a tiny HF model folder, a text corpus folder, a file...
CORPUS = "{corpus}"
FILE = "{file}"
TMP = "{tmp}"
CFG = "{cfg}"

#: (argv, text expected in the message); every entry must exit 2 with one line on stderr
BAD = [
    # list
    (["list"], "Missing argument"),
    (["list", "modles"], "did you mean 'models'"),
    (["list", "models", "--extra"], "No such option"),
    # fetch
    (["fetch"], "Missing argument"),
    (["fetch", "smolm2-135m"], "unknown model or corpus"),
    (["fetch", "sotu", "--accept-license=maybe"], "does not take a value"),
    # measure: each option with a value that makes no sense
    (["measure", "--model", "no/such/model/dir"], "does not exist"),
    (["measure", "--model", "smolm2-135m"], "did you mean"),
    (["measure", "--model", FILE], "is a file"),
    (["measure", "--model", TMP], "no config.json"),
    (["measure", "--model", MODEL, "--corpus", "sotuu"], "did you mean 'sotu'"),
    (["measure", "--model", MODEL, "--corpus", "no/such/corpus.txt"], "corpus"),
    (["measure", "--model", MODEL, "--input", "poetry"], "natural"),
    (["measure", "--model", MODEL, "--input", "run"], "--input run needs"),
    (["measure", "--model", MODEL, "--num-samples", "0"], "--num-samples"),
    (["measure", "--model", MODEL, "--num-samples", "many"], "valid integer"),
    (["measure", "--model", MODEL, "--corpus", CORPUS, "--num-samples", "100000"], "--num-samples"),
    (["measure", "--model", MODEL, "--seq-len", "1"], "--seq-len"),
    (["measure", "--model", MODEL, "--corpus", CORPUS, "--seq-len", "4096"], "context"),
    (["measure", "--model", MODEL, "--eps", "1.5"], "--eps"),
    (["measure", "--model", MODEL, "--eps", "high"], "valid number"),
    (["measure", "--model", MODEL, "--positions", "0"], "--positions"),
    (["measure", "--model", MODEL, "--bos", "sometimes"], "--bos"),
    (["measure", "--model", MODEL, "--seed", "-1"], "--seed"),
    (["measure", "--model", MODEL, "--dtype", "float16x"], "--dtype"),
    (["measure", "--model", MODEL, "--out", FILE], "is a file"),
    (["measure", "--model", MODEL, "--batch-size", "0"], "--batch-size"),
    (["measure", "--model", MODEL, "--collector", "magic"], "--collector"),
    (["measure", "--model", MODEL, "--input", "repeated", "--token", "-3"], "--token"),
    (["measure", "--model", MODEL, "--input", "repeated", "--token", "100000", "-t", "8"], "outside the vocabulary"),
    (["measure", "--model", MODEL, "--input", "text"], "--text"),
    (["measure", "--model", MODEL, "--input", "text", "--text", "the sink", "-t", "16"], "tokens"),
    (["measure", "--model", MODEL, "--accept-license=yes"], "does not take a value"),
    (["measure", "--model", MODEL, "--allow-long-context=1"], "does not take a value"),
    (["measure", "--no-such-option"], "No such option"),
    (["measure", "--model", MODEL, "--device", "tpu"], "--device"),
    (["measure", "--model", MODEL, "--device-map", "balanced"], "--device-map"),
    (["measure", "--model", MODEL + "," + MODEL], "twice"),
    (["measure", "--model", MODEL, "--model", MODEL], "twice"),  # a repeated list option adds to the list
    # compare
    (["compare"], "Missing argument"),
    (["compare", TMP], "at least two"),
    (["compare", TMP, TMP + "/x"], "no results.json"),
    # train
    (["train"], "Missing argument"),
    (["train", "tiny-cpuu", "--out", TMP + "/r"], "tiny-cpu"),
    (["train", "tiny-cpu"], "Missing option '--out'"),
    (["train", CFG, "--out", FILE], "is a file"),
    (["train", CFG, "--out", TMP + "/r", "--set", "optim.lr"], "key=value"),
    (["train", CFG, "--out", TMP + "/r", "--set", "optim.lrr=1"], "'lr'"),
    (["train", CFG, "--out", TMP + "/r", "--set", "optim.lr=-1"], "optim.lr"),
    (["train", CFG, "--out", TMP + "/r", "--steps", "0"], "train.steps"),
    (["train", CFG, "--out", TMP + "/r", "--steps", "ten"], "valid integer"),
    (["train", CFG, "--out", TMP + "/r", "--resume"], "no checkpoint"),
    (["train", CFG, "--out", TMP + "/r", "--no-progress=1"], "does not take a value"),
    (["train", CFG, "--out", TMP + "/r", "--nproc", "0"], "--nproc"),
    (["train", CFG, "--out", TMP + "/r", "--set", "train.parallel=zero3"], "train.parallel"),
    (["train", CFG, "--out", TMP + "/r", "--set", "data.num_proc=0"], "data.num_proc"),
    # sweep, report, dynamics
    (["sweep", TMP + "/no-study.toml"], "does not exist"),
    (["sweep", TMP + "/no-study.toml", "--jobs", "two"], "valid integer"),
    (["sweep", TMP + "/no-study.toml", "--dry-run=1"], "does not take a value"),
    (["report", TMP + "/no-results"], "no sweep folders"),
    (["dynamics", "softmax=" + TMP + "/no-run", "--out", TMP + "/d"], "does not exist"),
    (["dynamics", "softmax=" + TMP + "/no-run", "--out", TMP + "/d", "--level", "high"], "valid number"),
    # stream
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--window", "0", "--out", TMP + "/s"], "--window must be >= 1"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--sinks", "-2", "--out", TMP + "/s"], "--sinks must be >= 0"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--window", "200", "--out", TMP + "/s"], "exceeds the model's context"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--tokens", "100000", "--window", "8", "--out", TMP + "/s"],
     "fewer than --tokens 100000"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--sinks", "0,x", "--out", TMP + "/s"], "--sinks takes comma-separated integers"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--sinks", "0,-2", "--out", TMP + "/s"], "--sinks must be >= 0"),
    (["stream", "perplexity", "9000", "--model", MODEL, "--corpus", CORPUS, "--out", TMP + "/s"], "unexpected extra argument"),
    (["stream", "perplexity", "--model", MODEL, "--mode", "fast", "--corpus", CORPUS, "--window", "8", "--tokens", "20",
      "--out", TMP + "/s"], "unknown mode"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--policy", "sinks", "--kv-bits", "16",
      "--sinks-full-precision", "4", "--out", TMP + "/s"], "--sinks-full-precision 4 set(s) quantised storage"),
    (["stream", "perplexity", "--model", MODEL, "--corpus", CORPUS, "--policy", "sinks", "--budget", "8", "--kv-bits", "4",
      "--sinks-full-precision", "9", "--out", TMP + "/s"], "--sinks-full-precision 9 exceeds the --budget 8"),
    (["stream", "retrieval"], "unknown stream task"),
    (["stream", "--model", MODEL, "--out", TMP + "/s"], "takes a task first: sinklab stream perplexity"),
    # analyze (more in tests/test_analyze.py)
    (["analyze", "nonsense"], "unknown analysis"),
    (["analyze", "massive", "--model", MODEL, "--corpus", CORPUS, "--num-samples", "0"], "--num-samples"),
    (["analyze", "intervene", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--layers", "x"],
     "comma-separated"),
    (["analyze", "intervene", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--only", "magic"],
     "unknown intervention"),
    (["analyze", "repeat", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--prompt-len", "99"],
     "--prompt-len"),
    (["analyze", "overmix", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--directions", "0"],
     "--directions"),
    (["analyze", "denoise", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8"], "masked diffusion model"),
    (["analyze", "denoise", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--steps", "x"], "valid integer"),
    (["analyze", "massive", "--model", MODEL, "--corpus", CORPUS, "-n", "2", "-t", "8", "--steps", "4"],
     "does not apply"),
    (["train", CFG, "--out", TMP + "/r", "--set", "train.objective=diffusion"], "train.objective"),
    (["train", CFG, "--out", TMP + "/r", "--set", "train.objective=masked_diffusion", "--set", "train.prefix_len=4"],
     "prefix_len"),
    (["nosuchcommand"], "No such command"),
]


@pytest.fixture
def places(tmp_path, tiny_model_dir, text_corpus_dir):
    f = tmp_path / "a-file.txt"
    f.write_text("not a folder")
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=2))
    (tmp_path / "empty").mkdir()
    return {"model": str(tiny_model_dir), "corpus": str(text_corpus_dir), "file": str(f),
            "tmp": str(tmp_path / "empty"), "cfg": str(cfg)}


@pytest.mark.parametrize("argv, expect", BAD, ids=[" ".join(a)[:60] for a, _ in BAD])
def test_bad_values_exit_2_with_one_line(argv, expect, places, capsys):
    argv = [a.format(**places) for a in argv]
    with pytest.raises(SystemExit) as e:
        app(argv)
    cap = capsys.readouterr()
    lines = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert e.value.code == 2, (e.value.code, cap.err)
    assert len(lines) == 1 and lines[0].startswith("error: "), cap.err
    assert "Traceback" not in cap.err and expect in lines[0], lines[0]


def test_every_command_is_covered():
    import typer.main

    _load_commands()
    commands = set(typer.main.get_command(cli).commands)
    covered = {argv[0] for argv, _ in BAD}
    assert commands <= covered, commands - covered


@pytest.mark.parametrize("command", ["list", "measure", "fetch", "train", "sweep", "report", "dynamics", "compare",
                                     "analyze", "stream"])
def test_help_shows_no_placeholder_on_flags(command, capsys):
    try:
        app([command, "--help"])
    except SystemExit as e:
        assert e.code in (0, None)
    out = capsys.readouterr().out
    assert "Usage: sinklab " + command in out
    assert "<bool>" not in out
    for flag in ("--help", "--accept-license", "--resume", "--no-progress", "--dry-run"):
        for line in out.splitlines():
            if line.strip().startswith(flag + " "):
                assert "<" not in line.split(flag, 1)[1].split("  ")[0], line


def test_hub_id_without_a_hub_fails_fast_in_one_line(monkeypatch, text_corpus_dir, capsys):
    """No 25 s of retries: one short metadata request decides, and the weights are never requested."""
    import time

    import huggingface_hub
    import huggingface_hub.constants as hub_constants

    from sinklab.models import load as models

    def unreachable(repo_id, **kw):
        assert kw.get("timeout") is not None and kw["timeout"] <= 10
        raise ConnectionError("[Errno -2] Name or service not known")

    real = models._from_pretrained
    online = []

    def from_pretrained(where, **kw):
        if not kw.get("local_files_only"):
            online.append(where)
        return real(where, **kw)

    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", unreachable)
    monkeypatch.setattr(models, "_from_pretrained", from_pretrained)
    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        app(["measure", "--model", "some-org/no-such-model", "--corpus", str(text_corpus_dir)])
    elapsed = time.perf_counter() - t0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(lines) == 1 and "no model hub reachable" in lines[0], lines
    assert online == [] and elapsed < 10


# ---------------------------------------------------------------------------------------------------------------
# Issue 21, item 1: every output location is checked before any model or data work (exit 2, one line, at once)

ANALYZE_KINDS = ["massive", "keybias", "intervene", "overmix", "repeat", "denoise", "attention", "depth", "frames"]
UNWRITABLE_AT = "{bad}"

#: commands run with an output location that cannot be written; the default model needs fetching and loading
UNWRITABLE = [
    ["measure", "-n", "2", "--out", UNWRITABLE_AT],
    ["measure", "--model", "smollm2-135m,minilm-l6", "--out", UNWRITABLE_AT],
    ["stream", "perplexity", "--out", UNWRITABLE_AT],
    *[["analyze", kind, "--out", UNWRITABLE_AT] for kind in ANALYZE_KINDS],
    ["train", CFG, "--out", UNWRITABLE_AT],
    ["train", CFG, "--out", UNWRITABLE_AT, "--resume"],
    ["sweep", "{study}", "--out", UNWRITABLE_AT],
    ["report", TMP, "--out", UNWRITABLE_AT],
    ["dynamics", TMP, "--out", UNWRITABLE_AT],
    ["compare", TMP, TMP, "--out", UNWRITABLE_AT],
]

#: commands that fetch, cache or tokenize, run with SINKLAB_HOME unwritable
UNWRITABLE_HOME = [
    ["measure", "-n", "2", "--out", TMP + "/m"],
    ["stream", "perplexity", "--out", TMP + "/s"],
    ["analyze", "massive", "--out", TMP + "/a"],
    ["train", CFG, "--out", TMP + "/r"],
    ["fetch", "sotu"],
    ["sweep", "{study}", "--out", TMP + "/sw"],
    ["report", TMP, "--out", TMP + "/rep"],
]


def _bad_location(kind: str, tmp_path) -> str:
    """A path nothing can be created at: under /proc, under a file, or under a read-only folder."""
    if kind == "proc":
        if not os.path.isdir("/proc"):
            pytest.skip("no /proc here")
        return "/proc/sinklab-no-such-dir/out"
    if kind == "under-a-file":
        f = tmp_path / "plain-file"
        f.write_text("x")
        return str(f / "out")
    if os.geteuid() == 0:  # root writes into a folder without write permission; not into sysfs (EACCES, EROFS)
        return _root_read_only_folder() + "/sinklab-no-such-dir/out"
    ro = tmp_path / "read-only"
    ro.mkdir(mode=0o500)
    return str(ro / "out")


def _root_read_only_folder() -> str:
    """An existing folder that not even root can create a file in: /sys (sysfs refuses new files)."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        return "/sys"
    os.close(fd)
    os.unlink(probe)
    raise AssertionError("root can create files in /sys here: no read-only folder for the read-only case")


@pytest.fixture
def no_work(monkeypatch):
    """Loading a model or corpus, fetching, or training fails the test: the output check comes first."""
    from sinklab.train import loop
    import sinklab.models as loading
    from sinklab.zoo import corpora, models

    def refuse(*a, **k):
        raise AssertionError("model or data work started before the output locations were checked")

    for mod, name in [(loading, "load_model"), (models, "fetch_model"), (corpora, "load_corpus"),
                      (corpora, "fetch_corpus"), (loop, "train")]:
        monkeypatch.setattr(mod, name, refuse)


def _run_fast(argv, capsys) -> tuple[int, list[str]]:
    import time

    t0 = time.perf_counter()
    with pytest.raises(SystemExit) as e:
        app(argv)
    elapsed = time.perf_counter() - t0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert elapsed < 5, f"took {elapsed:.1f} s"
    return e.value.code, lines


@pytest.fixture
def study_file(places, tmp_path):
    s = tmp_path / "study.toml"
    s.write_text(f'name = "t"\nbase = "{places["cfg"]}"\n[sweep]\n"optim.weight_decay" = [0.1]\n')
    return str(s)


def test_every_analysis_kind_is_covered():
    from sinklab import analyze

    assert ANALYZE_KINDS == analyze.ANALYSES.names()


@pytest.mark.parametrize("where", ["proc", "under-a-file", "read-only"])
@pytest.mark.parametrize("argv", UNWRITABLE, ids=[" ".join(a[:2]) + ("".join(a[2:]).count("--model") * " x2")
                                                  + (" --resume" if "--resume" in a else "") for a in UNWRITABLE])
def test_unwritable_output_fails_at_once_in_one_line(argv, where, places, study_file, tmp_path, no_work, capsys):
    bad = _bad_location(where, tmp_path)
    argv = [a.format(**places, bad=bad, study=study_file) for a in argv]
    code, lines = _run_fast(argv, capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --out "), lines
    assert bad in lines[0] and ("not writable" in lines[0] or "cannot be created" in lines[0]), lines[0]


@pytest.mark.parametrize("argv", UNWRITABLE_HOME, ids=[" ".join(a[:2]) for a in UNWRITABLE_HOME])
def test_unwritable_sinklab_home_fails_at_once_in_one_line(argv, places, study_file, tmp_path, no_work, monkeypatch,
                                                          capsys):
    bad = _bad_location("under-a-file", tmp_path)
    monkeypatch.setenv("SINKLAB_HOME", bad)
    argv = [a.format(**places, study=study_file) for a in argv]
    code, lines = _run_fast(argv, capsys)
    assert code == 2 and lines == [f"error: SINKLAB_HOME={bad} cannot be created: {Path(bad).parent} is a file, "
                                   "not a folder"], lines


def test_existing_file_as_output_folder_and_folder_as_report(places, tmp_path, no_work, capsys):
    code, lines = _run_fast(["train", places["cfg"], "--out", places["file"]], capsys)
    assert code == 2 and lines == [f"error: --out {places['file']} is a file; give a folder"]
    # a folder as the report is FOLDER/REPORT.md (sinklab.fileio.output_file, the rule of dynamics --out too):
    # accepted, so the next error is the empty results folder's
    code, lines = _run_fast(["report", places["tmp"], "--out", places["tmp"]], capsys)
    assert code == 2 and len(lines) == 1 and "no sweep folders" in lines[0], lines


def test_the_check_creates_nothing(tmp_path):
    from sinklab.fileio import check_writable

    check_writable(tmp_path / "a" / "b" / "c", "--out")
    check_writable(tmp_path / "report.md", "--out", folder=False)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------------------
# Issue 21, item 2: a damaged file sinklab reads is named in one line (exit 2), never a parser's traceback


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished 2-step synthetic run: config.toml, checkpoint.pt, metrics.jsonl, summary.json, final/."""
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    tmp = tmp_path_factory.mktemp("trained")
    (tmp / "tiny.toml").write_text(synthetic_run_toml(steps=2))
    loop.train(load_config(tmp / "tiny.toml"), tmp / "run", progress=False)
    return tmp / "run"


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "garbage":
        path.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(700)))  # not UTF-8, not any format
    elif how == "text":
        path.write_text("hello, this is not what you think {\n")
    else:  # truncated
        path.write_bytes(data[: max(1, len(data) // 3)])


def _one_error_line(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        app(argv)
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error")]
    assert e.value.code == 2, err
    assert "Traceback" not in err and len(errors) == 1, err
    return errors[0]


@pytest.mark.parametrize("how", ["garbage", "text", "truncated"])
@pytest.mark.parametrize("name", ["final/model.safetensors", "final/sinklab_model.json", "final/tokenizer.json",
                                  "final/tokenizer_config.json", "config.toml"])
def test_damaged_file_of_a_trained_model_is_named(trained_run, name, how, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    _damage(run / name, how)
    line = _one_error_line(["measure", "--model", str(run / "final"), "--out", str(tmp_path / "m")], capsys)
    assert str(run / name) in line, line


@pytest.mark.parametrize("how", ["garbage", "text", "truncated"])
@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json"])
def test_damaged_file_of_a_hugging_face_folder_is_named(tiny_model_dir, text_corpus_dir, name, how, tmp_path, capsys):
    _damage(tiny_model_dir / name, how)
    line = _one_error_line(["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-n", "2",
                            "-t", "8", "--out", str(tmp_path / "m")], capsys)
    assert str(tiny_model_dir / name) in line, line


@pytest.mark.parametrize("how", ["garbage", "text", "truncated", "a tensor", "a dict without the run state"])
def test_resume_from_a_damaged_checkpoint_says_so_without_unsafe_advice(trained_run, how, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    ck = run / "checkpoint.pt"
    if how == "a tensor":
        torch.save(torch.ones(3), ck)
    elif how == "a dict without the run state":
        torch.save({"step": 2, "weights": torch.ones(3)}, ck)
    else:
        _damage(ck, how)
    line = _one_error_line(["train", str(trained_run.parent / "tiny.toml"), "--out", str(run), "--resume",
                            "--steps", "4"], capsys)
    assert f"cannot read checkpoint {ck}: it is corrupt or not a sinklab checkpoint" in line, line
    assert "weights_only" not in line and "weights only" not in line.lower()


def test_damaged_config_results_and_training_log_are_named(trained_run, tmp_path, capsys):
    bad_cfg = tmp_path / "bad.toml"
    bad_cfg.write_text("x")
    _damage(bad_cfg, "garbage")
    line = _one_error_line(["train", str(bad_cfg), "--out", str(tmp_path / "r")], capsys)
    assert f"cannot read config file {bad_cfg}: not UTF-8 text" in line, line

    study = tmp_path / "study.toml"
    study.write_text("name = [unclosed\n")
    line = _one_error_line(["sweep", str(study), "--dry-run"], capsys)
    assert f"cannot read study file {study}" in line and "not valid TOML" in line, line

    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "results.json").write_text('{"sink_rate": [1.0, ')
    line = _one_error_line(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c")], capsys)
    assert f"cannot read measurement results {tmp_path / 'a' / 'results.json'}" in line, line

    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": \n')
    n = len((run / "metrics.jsonl").read_text().splitlines())
    line = _one_error_line(["dynamics", str(run), "--out", str(tmp_path / "d")], capsys)
    assert f"cannot read training log {run / 'metrics.jsonl'} (line {n})" in line, line
