"""No sinklab command ends in a traceback on user input: every command and option, given a bad value,
exits with status 2 and a one-line message (issue 12, items 2 and 6)."""

from __future__ import annotations

import pytest

from conftest import synthetic_run_toml
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
    (["measure", "--model", MODEL, "--model", MODEL], "twice"),
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
    (["dynamics", "softmax=" + TMP + "/no-run", "--out", TMP + "/d.png"], "does not exist"),
    (["dynamics", "softmax=" + TMP + "/no-run", "--out", TMP + "/d.png", "--level", "high"], "valid number"),
    # stream
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--window", "0", "--out", TMP + "/s"], "--window must be >= 1"),
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--sinks", "-2", "--out", TMP + "/s"], "--sinks must be >= 0"),
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--window", "200", "--out", TMP + "/s"], "exceeds the model's context"),
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--tokens", "100000", "--window", "8", "--out", TMP + "/s"],
     "fewer than --tokens 100000"),
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--sinks", "0", "x", "--out", TMP + "/s"], "valid integer"),
    (["stream", "--model", MODEL, "--corpus", CORPUS, "--sinks", "0", "-2", "--out", TMP + "/s"], "--sinks must be >= 0"),
    (["stream", "9000", "--model", MODEL, "--corpus", CORPUS, "--out", TMP + "/s"], "unexpected extra argument"),
    (["stream", "--model", MODEL, "--mode", "fast", "--corpus", CORPUS, "--window", "8", "--tokens", "20",
      "--out", TMP + "/s"], "unknown mode"),
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

    from sinklab.zoo import models

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
