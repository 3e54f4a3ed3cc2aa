"""Sweep: grid expansion, skip-finished, resume after interruption, summary columns, verdicts, report."""

import csv
import json
from pathlib import Path

import pytest

from sinklab.errors import ConfigError, InputError
from sinklab.sweep.report import build_report
from sinklab.sweep.run import is_finished, run_dir, run_sweep, train_command
from sinklab.sweep.spec import load_study, parse_study
from sinklab.sweep.summary import COLUMNS, summarize_sweep
from sinklab.sweep.verdict import verdict

TINY = """
preset = "emergence-cpu"
[model]
d_model = 16
n_layers = 1
n_heads = 1
d_ff = 32
[data]
seq_len = 16
synthetic = { vocab = 8, n_triggers = 1, n_train_docs = 64, n_val_docs = 16 }
[optim]
warmup_steps = 1
[train]
steps = 4
batch_size = 4
log_every = 1
checkpoint_every = 2
[track]
every = 2
n_probe = 8
probe_len = 16
val_windows = 4
positions = 2
"""


def _study(tmp_path: Path, body: str) -> Path:
    (tmp_path / "tiny.toml").write_text(TINY)
    p = tmp_path / "study.toml"
    p.write_text('name = "tiny"\nbase = "tiny.toml"\nsection = "loss"\n' + body)
    return p


def test_grid_expansion_labels_overrides_paper():
    s = parse_study({"base": "emergence-cpu", "set": {"train.steps": 7},
                     "sweep": {"optim.weight_decay": [0.0, 0.5], "optim.lr": [1e-3, 3e-3]},
                     "paper": {"optim.weight_decay=0.5, optim.lr=0.001": {"sink": 41.0, "expect": "higher"}}})
    assert len(s.points) == 4  # cartesian product
    labels = [p.label for p in s.points]
    assert labels[0] == "optim.weight_decay=0, optim.lr=0.001"
    p = s.points[2]
    assert p.overrides == {"train.steps": 7, "optim.weight_decay": 0.5, "optim.lr": 1e-3}
    assert (p.paper, p.expect) == (41.0, "higher")
    assert p.set_args() == ["train.steps=7", "optim.weight_decay=0.5", "optim.lr=0.001"]
    one = parse_study({"base": "x", "sweep": {"optim.weight_decay": [0.1, 2]}})
    assert [p.label for p in one.points] == ["0.1", "2"] and one.x_key == "optim.weight_decay"
    pts = parse_study({"base": "x", "points": [{"label": "k bias (v = 0)", "set": {"model.attention": "k_bias"},
                                                "paper": 0.04, "expect": "no_sink"}]})
    assert pts.points[0].slug == "k_bias_v_=_0" and pts.points[0].paper == 0.04


def test_study_errors():
    with pytest.raises(ConfigError, match="swep"):
        parse_study({"base": "x", "swep": {}})
    with pytest.raises(ConfigError, match="matches no grid point"):
        parse_study({"base": "x", "sweep": {"a.b": [1]}, "paper": {"2": 3.0}})
    with pytest.raises(ConfigError, match="expect"):
        parse_study({"base": "x", "points": [{"label": "a", "expect": "bigger"}]})
    with pytest.raises(ConfigError, match="no \\[sweep\\]"):
        parse_study({"base": "x"})


def test_verdict_logic():
    lvl = 10.0
    assert verdict("reference", 18.0, (15.0, 21.0), level=lvl) == "agrees"
    assert verdict("sink", 2.0, (0.0, 4.0), level=lvl) == "disagrees"
    assert verdict("sink", 8.0, (5.0, 12.0), level=lvl) == "inconclusive"
    assert verdict("no_sink", 0.4, (0.0, 1.0), level=lvl) == "agrees"
    assert verdict("no_sink", 40.0, (30.0, 50.0), level=lvl) == "disagrees"
    assert verdict("no_sink", 9.0, (6.0, 12.0), level=lvl) == "inconclusive"
    ref = dict(ref_sink=18.0, ref_ci=(15.0, 21.0), level=lvl)
    assert verdict("higher", 41.0, (35.0, 47.0), **ref) == "agrees"
    assert verdict("higher", 5.0, (3.0, 7.0), **ref) == "disagrees"
    assert verdict("higher", 20.0, (16.0, 24.0), **ref) == "inconclusive"
    assert verdict("lower", 5.0, (3.0, 7.0), **ref) == "agrees"
    assert verdict("similar", 20.0, (16.0, 24.0), **ref) == "agrees"
    assert verdict("similar", 50.0, (45.0, 55.0), **ref) == "disagrees"
    # a direction cannot be read when the reference has no sink
    assert verdict("higher", 5.0, (3.0, 7.0), ref_sink=0.0, ref_ci=(0.0, 0.0), level=lvl) == "inconclusive"
    assert verdict("sink", None, None, level=lvl) == "inconclusive"
    assert verdict("", 5.0, None) == ""


def test_sweep_skips_finished_resumes_interrupted_and_summarises(tmp_path):
    path = _study(tmp_path, """
[sweep]
"optim.weight_decay" = [0.0, 0.5]
[paper."0"]
sink = 10.0
expect = "reference"
[paper."0.5"]
sink = 41.0
expect = "higher"
""")
    study = load_study(path)
    out = tmp_path / "res"
    # interrupt point 0.5 after 2 of 4 steps (as a killed run: checkpoint, no summary)
    from sinklab.sweep.spec import point_config
    from sinklab.train.loop import train

    p05 = study.points[1]
    d05 = run_dir(out, p05)
    train(point_config(study, p05), d05, progress=False, stop_after=2)
    assert (d05 / "checkpoint.pt").exists() and not is_finished(d05)
    assert "--resume" in train_command(study, p05, d05)

    events = []
    status = run_sweep(study, out, jobs=2, cores=2, progress=False, poll_s=0.2,
                       on_event=lambda e, p: events.append((e, p.label)))
    assert status == {"0": "done", "0.5": "done"}
    steps = [json.loads(x)["step"] for x in (d05 / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # resumed at step 3, not restarted
    assert "--resume" in (d05 / "train.log").read_text()

    # a second run skips both
    events.clear()
    assert run_sweep(study, out, jobs=1, progress=False, poll_s=0.2) == {"0": "skipped", "0.5": "skipped"}

    rows = summarize_sweep(out)
    with open(out / "summary.csv") as f:
        header = next(csv.reader(f))
    assert header == COLUMNS
    assert (out / "summary.md").exists() and (out / "sink_rate.png").stat().st_size > 0
    for r in rows:
        assert r["status"] == "done" and r["steps"] == 4
        assert r["sink1_lo"] <= r["sink1"] <= r["sink1_hi"]
        assert r["wall_s"] > 0
        # Sink_1 at the end equals the tracker's final value (same probe, same metric)
        fin = json.loads((run_dir(out, study.points[0] if r["label"] == "0" else p05) / "summary.json").read_text())
        assert r["sink1"] == pytest.approx(fin["final"]["sink_rate"][0], abs=1e-6)
    assert rows[1]["paper"] == 41.0 and rows[1]["expect"] == "higher" and rows[1]["verdict"] in ("agrees", "disagrees", "inconclusive")

    text = build_report(tmp_path, tmp_path / "REPORT.md")
    assert "| tiny | 0.5 |" in text and "res/sink_rate.png" in text


def test_report_needs_sweeps(tmp_path):
    with pytest.raises(InputError, match="no sweep folders"):
        build_report(tmp_path, tmp_path / "R.md")


def test_raw_attention_weights_switch_gives_unrenormalised_rows():
    import torch

    from sinklab.nn.attention import raw_attention_weights
    from sinklab.nn.config import ModelConfig
    from sinklab.nn.model import SinkLM

    torch.manual_seed(0)
    for op in ("sigmoid", "softmax"):
        m = SinkLM(ModelConfig(vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8, attention=op)).eval()
        x = torch.randint(0, 11, (2, 8))
        got = {}

        def obs(layer, w, *, renormalised, extra=None, key=None, value=None, _k=None):
            got[_k] = (w.double(), renormalised)

        with torch.no_grad():
            m(x, observer=lambda *a, **k: obs(*a, **k, _k="renorm"))
            with raw_attention_weights():
                m(x, observer=lambda *a, **k: obs(*a, **k, _k="raw"))
        (wn, fn), (wr, fr) = got["renorm"], got["raw"]
        if op == "softmax":
            assert not fn and not fr
            torch.testing.assert_close(wn, wr)
        else:
            assert fn and not fr
            assert (wr.sum(-1) - 1).abs().max() > 0.1  # raw sigmoid rows do not sum to 1
            torch.testing.assert_close(wn, wr / wr.sum(-1, keepdim=True))
