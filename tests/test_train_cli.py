"""End to end: `sinklab train` on a small text folder writes config.toml, metrics.jsonl and final/."""

import json
import random
import tomllib

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
    res = CliRunner().invoke(cli, ["train", str(cfg), "--out", str(out), "--set", "optim.lr=0.002",
                                   "--steps", "4", "--no-progress"], catch_exceptions=False)
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
    from sinklab.zoo.models import load_model

    loaded = load_model(str(out / "final"))
    ids = loaded.tokenizer("the of and", add_special_tokens=True).input_ids
    assert loaded.tokenizer.decode(ids) == "the of and"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["weight_decay"]["applied_to"] == "matrices" and summary["steps"] == 4


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
