"""One CLI grammar: comma lists, the same short option for the same long one
everywhere, --device/--dtype/--threads on the commands that run a model, --out a folder, one default
model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from helpers import run_cli_captured

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "sinklab"

#: commands that load and run a model (and every ``analyze KIND``, added where used)
MODEL_COMMANDS = ["measure", "stream perplexity", "stream passkey", "train"]


def _commands() -> dict[str, object]:
    """Every leaf command of the typer app by its path ("measure", "analyze massive", ...)."""
    import typer.main

    from sinklab.cli.main import _load_commands, cli

    _load_commands()
    root = typer.main.get_command(cli)
    out = {}

    def walk(cmd, path):
        if hasattr(cmd, "list_commands"):  # a group (analyze makes its subcommands on first use)
            for name in cmd.list_commands(None):
                walk(cmd.get_command(None, name), [*path, name])
        else:
            out[" ".join(path)] = cmd

    walk(root, [])
    return out


def _options(cmd) -> list:
    return [p for p in cmd.params if p.param_type_name == "option"]


def test_split_list_parses_comma_lists_and_repeats():
    from sinklab.cli.common import split_list
    from sinklab.errors import InputError

    assert split_list("0,1, 2", int) == [0, 1, 2]
    assert split_list(["0,1", "4"], int) == [0, 1, 4]  # a repeated list option adds to the list
    assert split_list("0,0.25,1", float) == [0.0, 0.25, 1.0]
    assert split_list(None) is None and split_list("") is None and split_list([" , "]) is None
    assert split_list("sinks,h2o") == ["sinks", "h2o"]
    with pytest.raises(InputError, match=r"--layers takes comma-separated integers, e\.g\. 0,1,2; got '1\.5'"):
        split_list("0,1.5", int, "--layers")


def test_each_short_option_means_one_long_option_everywhere():
    seen: dict[str, set[str]] = {}
    for name, cmd in _commands().items():
        for p in _options(cmd):
            longs = [o for o in p.opts if o.startswith("--")]
            for short in (o for o in p.opts + p.secondary_opts if re.fullmatch(r"-[A-Za-z]", o)):
                seen.setdefault(short, set()).update(longs)
    assert seen.get("-n") == {"--num-samples"}, seen
    assert {k: v for k, v in seen.items() if len(v) != 1} == {}


def test_stream_token_count_is_tokens_without_n():
    stream = _commands()["stream perplexity"]
    tokens = next(p for p in _options(stream) if "--tokens" in p.opts)
    assert tokens.opts == ["--tokens"]


def test_model_commands_take_device_dtype_threads():
    commands = _commands()
    analyses = [name for name in commands if name.startswith("analyze ")]
    assert len(analyses) == 9, analyses
    for command in [*MODEL_COMMANDS, *analyses]:
        flags = {o for p in _options(commands[command]) for o in p.opts}
        assert {"--device", "--dtype", "--threads"} <= flags, command
        if command == "measure" or command.startswith(("analyze ", "stream ")):  # the Subject's placement, as measure's
            assert "--device-map" in flags, command


def test_list_options_are_comma_lists():
    """Every option that takes several values is a comma list (metavar A,B,...), except --set, whose
    KEY=VALUE takes a TOML value that may itself hold commas."""
    multi = {(name, p.opts[0]) for name, cmd in _commands().items() for p in _options(cmd)
             if p.multiple and p.metavar != "A,B,..."}
    assert multi <= {("train", "--set")}, multi


def test_no_argv_rewriter():
    import sinklab.cli.main as main

    assert not hasattr(main, "_expand_multi_value") and not hasattr(main, "MULTI_VALUE_OPTIONS")


def test_the_default_model_is_one_constant():
    """The zoo's DEFAULT_MODEL is the one place the default model is spelled out; every command and
    analysis with a default model uses it."""
    import inspect

    from sinklab.analyze import ANALYSES
    from sinklab.cli.common import DEFAULT_MODEL
    from sinklab.streaming import stream
    from sinklab.zoo.models import DEFAULT_MODEL as ZOO_DEFAULT

    assert DEFAULT_MODEL is ZOO_DEFAULT
    spelled = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*.py")
                     if re.search(r'=\s*\[?"smollm2-135m"', p.read_text()))
    assert spelled == ["zoo/models.py"]
    assert inspect.signature(stream).parameters["model"].default is DEFAULT_MODEL
    defaults = {kind: inspect.signature(ANALYSES.get(kind)).parameters["model"].default for kind in ANALYSES}
    assert {k: d for k, d in defaults.items() if d is not inspect.Parameter.empty} == {
        k: DEFAULT_MODEL for k in ANALYSES if k != "denoise"}  # denoise needs a masked diffusion model
    commands = _commands()
    for name in ("measure", "stream perplexity", "stream passkey", *(n for n in commands if n.startswith("analyze "))):
        model = next(p for p in _options(commands[name]) if "--model" in p.opts)
        assert DEFAULT_MODEL in (model.help or "") or model.default == DEFAULT_MODEL, name


@pytest.mark.slow
def test_stream_comma_lists(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    """--sinks 0,2 gives those caches, as the repeated form --sinks 0 --sinks 2 does; --device cpu and
    --dtype float32 are taken and change nothing."""
    out = tmp_path / "st"
    base = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
            "--window", "8", "--no-recompute"]
    code, _, err = run_cli_captured([*base, "--sinks", "0,2", "--out", str(out)], capsys)
    assert code == 0, err
    comma = json.loads((out / "stream.json").read_text())
    assert [c["name"] for c in comma["configs"]] == ["full", "window", "sinks_2"]
    code, _, err = run_cli_captured([*base, "--sinks", "0", "--sinks", "2", "--device", "cpu", "--dtype", "float32",
                                     "--out", str(tmp_path / "rep")], capsys)
    assert code == 0, err
    repeated = json.loads((tmp_path / "rep" / "stream.json").read_text())
    assert [c["ppl"] for c in repeated["configs"]] == [c["ppl"] for c in comma["configs"]]


@pytest.mark.parametrize("extra,msg", [
    (["--dtype", "float8"], "--dtype must be one of float32, bfloat16, float16, float64, got 'float8'"),
    (["--device", "tpu"], "--device must be cpu, cuda, cuda:N or auto, got 'tpu'"),
    (["--device-map", "balanced"], "--device-map must be auto"),
    (["-n", "40"], "No such option: -n"),
    (["--sinks", "0,two"], "--sinks takes comma-separated integers"),
])
def test_stream_bad_grammar_exits_2(tiny_model_dir, text_corpus_dir, tmp_path, capsys, extra, msg):
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
            "--window", "8", "--out", str(tmp_path / "o"), *extra]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 2 and msg in err, err


@pytest.mark.parametrize("extra,msg", [
    (["--dtype", "fp16"], "--dtype must be one of float32, bfloat16, float16, float64, got 'fp16'"),
    (["--device", "gpu"], "--device must be cpu, cuda, cuda:N or auto, got 'gpu'"),
    (["--device-map", "balanced"], "--device-map must be auto"),
    (["--layers", "0,1"], "--layers does not apply to `analyze massive`"),  # an option of other analyses
    (["-t", "8,16"], "Invalid value for '--seq-len' / '-t'"),
])
def test_analyze_bad_grammar_exits_2(tiny_model_dir, tmp_path, capsys, extra, msg):
    code, _, err = run_cli_captured(["analyze", "massive", "--model", str(tiny_model_dir), "--out",
                                     str(tmp_path / "a"), *extra], capsys)
    assert code == 2 and msg in err, err


def test_analyze_list_options_are_comma_lists(tiny_model_dir, tmp_path, capsys):
    """An analysis' list option takes a comma list (and the repeated form); a bad item is named."""
    from sinklab.cli.analyze_cmd import commands

    code, _, err = run_cli_captured(["analyze", "attention", "--model", str(tiny_model_dir), "--out",
                                     str(tmp_path / "a"), "--layers", "0,x"], capsys)
    assert code == 2 and "--layers takes comma-separated integers, e.g. 0,1,2; got 'x'" in err, err
    import typer.main

    from sinklab.cli.main import _load_commands, cli

    _load_commands()
    group = typer.main.get_command(cli).commands["analyze"]
    layers = next(p for p in group.get_command(None, "intervene").params if "--layers" in p.opts)
    assert layers.multiple and layers.metavar == "A,B,..." and len(commands()) == 9


def test_train_device_dtype_threads_set_the_config(tmp_path, capsys, monkeypatch):
    from sinklab.train import loop

    seen = []

    class Stop(Exception):
        pass

    def fake_train(cfg, out, **kw):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(loop, "train", fake_train)
    with pytest.raises(Stop):
        run_cli_captured(["train", "emergence-cpu", "--out", str(tmp_path / "r"), "--device", "cpu", "--dtype",
                          "float32", "--threads", "1", "--no-progress"], capsys)
    cfg = seen[0].train
    assert (cfg.device, cfg.precision, cfg.threads) == ("cpu", "fp32", 1)
    with pytest.raises(Stop):
        run_cli_captured(["train", "emergence-cpu", "--out", str(tmp_path / "r2"), "--dtype", "bfloat16"], capsys)
    assert seen[1].train.precision == "bf16" and seen[1].train.device == "auto"  # the preset's device kept
    code, _, err = run_cli_captured(["train", "emergence-cpu", "--out", str(tmp_path / "r3"), "--dtype", "fp16"],
                                    capsys)
    assert code == 2 and "--dtype must be one of float32, bfloat16" in err


THREE_POINTS = """
seeds = 1
[sweep]
"optim.weight_decay" = [0.0, 0.5, 1.0]
"""


def test_sweep_only_takes_a_comma_list(tmp_path, capsys):
    from test_sweep import _study

    study = _study(tmp_path, THREE_POINTS)
    code, out, err = run_cli_captured(["sweep", str(study), "--dry-run", "--out", str(tmp_path / "o"),
                                       "--only", "0,1"], capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("[new] 0 (seed") and lines[1].startswith("[new] 1 (seed"), lines
    assert "optim.weight_decay=0.5" not in out and "optim.weight_decay=1" in lines[1]
    code, _, err = run_cli_captured(["sweep", str(study), "--dry-run", "--only", "nope,1"], capsys)
    assert code == 2 and "no point labelled 'nope'" in err


def test_only_keeps_a_label_that_holds_a_comma_whole():
    from sinklab.cli.sweep_cmd import only_names

    label = "optim.weight_decay=0, optim.lr=0.001"
    assert only_names([label], {label}) == [label]
    assert only_names(["a,b", "c"], {label}) == ["a", "b", "c"]
    assert only_names(None, {label}) is None


def test_slurm_opt_splits_only_where_a_new_key_starts():
    from sinklab.cli.sweep_cmd import slurm_pairs

    assert slurm_pairs(["account=lab,qos=high", "mem=64G"]) == ["account=lab", "qos=high", "mem=64G"]
    assert slurm_pairs(["exclude=n1,n2,qos=high"]) == ["exclude=n1,n2", "qos=high"]
    assert slurm_pairs(None) == []


def test_report_out_naming_a_md_file_is_refused(tmp_path, capsys):
    code, _, err = run_cli_captured(["report", str(tmp_path), "--out", str(tmp_path / "r.md")], capsys)
    assert code == 2 and "is a folder: REPORT.md is written inside it" in err, err
    assert not (tmp_path / "r.md").exists()


@pytest.mark.slow
def test_stream_sinks_full_precision_takes_n_or_detected_in_one_list(tiny_model_dir, text_corpus_dir, tmp_path,
                                                                     capsys):
    """--sinks-full-precision 0,detected: one comma list mixing a count and 'detected' (main's streaming option)."""
    out = tmp_path / "fp"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
            "--window", "8", "--policy", "sinks", "--budget", "16", "--n-sink", "2", "--kv-bits", "4",
            "--sinks-full-precision", "0,detected", "--no-full", "--no-recompute", "--out", str(out)]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    names = [c["name"] for c in json.loads((out / "stream.json").read_text())["configs"]]
    assert names == ["sinks@16:kv4-token-fp0", "sinks@16:kv4-token-fpdetected"]
    code, _, err = run_cli_captured([*argv[:-1], str(tmp_path / "bad"), "--sinks-full-precision", "x"], capsys)
    assert code == 2 and "sinks_full_precision must be an integer >= 0 or 'detected'" in err, err


def test_streams_own_command_line_is_in_the_one_grammar():
    """The options object writes the command that reproduces a call (what stream.json records): its lists
    are comma lists that the CLI parses back to the same options object."""
    import shlex

    from sinklab.cli.stream_cmd import _options as options_of
    from sinklab.streaming.options import NeedleOptions, PasskeyOptions, PerplexityOptions, RulerOptions
    from sinklab.streaming.task_registry import TASKS

    commands = _commands()
    for opts in (PerplexityOptions(tokens=64, window=16, chunk=16, mode="decode", policies=("sinks", "h2o"),
                                   budgets=(64, 128), kv_bits=(16, 4), key_quant=("token", "channel"),
                                   sinks_full_precision=(0, "detected"), full=False, streams=2, corpus="sotu,austen"),
                 PasskeyOptions(tokens=64, keys=2, depths=(0.0, 0.5), batch=2, policies=("sinks",), budgets=(32,)),
                 NeedleOptions(lengths=(64, 128), depths=(0.0, 0.25), items=2, seed=3, policies=("sinks", "snapkv"),
                               budgets=(32, 48), kv_bits=(16, 4), key_quant=("channel",), full=False,
                               query_aware=False, max_new_tokens=5, chunk=8, corpus="sotu"),
                 RulerOptions(tasks=("niah_multikey", "variable_tracking"), lengths=(64,)),
                 PerplexityOptions(), NeedleOptions()):
        words = shlex.split(opts.command_line("m", out="o"))
        task = TASKS.get(opts.TASK)
        assert words[:3] == ["sinklab", "stream", task.name]
        ctx = commands[f"stream {task.name}"].make_context(f"sinklab stream {task.name}", words[3:])
        p = dict(ctx.params)
        assert (p.pop("model"), str(p.pop("out"))) == ("m", "o")
        back = options_of(task, task.options.flags(), p)
        assert back == opts, opts
    assert PerplexityOptions().command_line("m") == "sinklab stream perplexity --model m"
    assert NeedleOptions().command_line("m") == "sinklab stream needle --model m"


def test_sweep_and_report_default_to_runs_not_results(tmp_path, capsys, monkeypatch):
    """sweep writes into runs/NAME unless --out says results/NAME; report reads runs/ by default (issue 38)."""
    from test_sweep import _study

    study = _study(tmp_path, THREE_POINTS)
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli_captured(["sweep", str(study), "--dry-run", "--only", "0"], capsys)
    assert code == 0, err
    assert "--out runs/tiny/runs/0/seed" in out and "results/" not in out, out
    code, _, err = run_cli_captured(["report"], capsys)
    assert code == 2 and "runs" in err and "results" not in err, err


def test_policy_help_names_every_registered_policy():
    from sinklab.streaming.options import PerplexityOptions
    from sinklab.streaming.policies import POLICIES

    help_text = next(f.metadata["help"] for f in __import__("dataclasses").fields(PerplexityOptions)
                     if f.name == "policies")
    assert all(name in help_text for name in POLICIES.names()), help_text
