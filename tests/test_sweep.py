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
from sinklab.sweep.verdict import seed_stats, verdict

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


TWO_POINTS = """
seeds = 1
[sweep]
"optim.weight_decay" = [0.0, 0.5]
"""


@pytest.fixture(scope="module")
def local_two_points(tmp_path_factory) -> Path:
    """The two-point study TWO_POINTS (weight decay 0 and 0.5, seed 0) trained once by the local launcher (2 jobs
    on 2 cores, nothing reused): ``<root>/loc``, beside ``tiny.toml``. The reference of the submitit launcher test,
    and the finished sibling sweep whose runs the skip/resume and dynamics tests copy instead of training their
    seed 0 again (the same resolved configs, threads and code)."""
    root = tmp_path_factory.mktemp("two_points")
    study = load_study(_study(root, TWO_POINTS))
    status = run_sweep(study, root / "loc", jobs=2, cores=2, progress=False, poll_s=0.2, reuse=False)
    assert status == {"0/seed0": "done", "0.5/seed0": "done"}, status
    return root


def _sibling(local_two_points: Path, tmp_path: Path) -> Path:
    """A copy of the fixture's finished local sweep as ``tmp_path/loc``: a sibling that a sweep under
    ``tmp_path`` copies finished runs from."""
    import shutil

    return Path(shutil.copytree(local_two_points / "loc", tmp_path / "loc"))


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
    assert pts.points[0].slug == "k_bias_v_0" and pts.points[0].paper == 0.04
    # grid labels "key=value, key=value" give folder names without "=" (`sinklab dynamics` reads LABEL=RUN)
    assert [p.slug for p in s.points][0] == "optim.weight_decay_0_optim.lr_0.001"
    assert all("=" not in p.slug for p in s.points)


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
    """Exact tests need 6 seeds for a one-sample claim (min p 2/2^6) and 3 + 3 cannot decide a
    two-sample claim (min p 2/20); 4 + 4 can (2/70)."""
    lvl = 10.0
    # absolute claims: the sign-flip test of the seeds against the level
    assert verdict("reference", [18.0, 20.0, 16.0, 17.0, 19.0, 21.0], level=lvl) == "agrees"
    assert verdict("sink", [2.0, 1.0, 3.0, 0.0, 4.0, 2.5], level=lvl) == "disagrees"
    assert verdict("sink", [4.0, 12.0, 14.0, 6.0, 11.0, 13.0], level=lvl) == "inconclusive"  # straddles 10
    assert verdict("no_sink", [0.0] * 6, level=lvl) == "agrees"
    assert verdict("no_sink", [0.0] * 5, level=lvl) == "inconclusive"  # 2/2^5 = 0.0625: n too small
    assert verdict("no_sink", [40.0, 35.0, 45.0, 50.0, 38.0, 42.0], level=lvl) == "disagrees"
    assert verdict("no_sink", [0.0, 0.0, 30.0, 0.0, 0.0, 30.0], level=lvl) == "inconclusive"  # mean 10
    # relative claims: the two-sample permutation test against the reference's seeds
    ref = dict(ref_values=[18.0, 20.0, 16.0, 17.0], level=lvl)
    assert verdict("higher", [41.0, 39.0, 43.0, 40.0], **ref) == "agrees"
    assert verdict("higher", [41.0, 39.0, 43.0], **ref) == "agrees"  # unequal sizes: 1/C(7,3) = 0.029
    assert verdict("higher", [41.0, 39.0, 43.0], ref_values=[18.0, 20.0, 16.0]) == "inconclusive"  # 2/C(6,3)
    assert verdict("higher", [5.0, 6.0, 4.0, 7.0], **ref) == "disagrees"
    assert verdict("higher", [20.0, 30.0, 10.0, 15.0], **ref) == "inconclusive"
    assert verdict("lower", [5.0, 6.0, 4.0, 7.0], **ref) == "agrees"
    assert verdict("lower", [29.5] * 4, ref_values=[100.0] * 4) == "agrees"  # separated: 2/70
    # normalised sigmoid: the paper's claim is "higher than softmax"; 29.5 vs 100 is a reversal
    assert verdict("higher", [29.5, 29.0, 30.0, 29.0], ref_values=[100.0, 99.0, 100.0, 98.0]) == "disagrees"
    # similar: equivalence within 10 points
    assert verdict("similar", [19.0, 18.0, 20.0, 17.0], **ref) == "agrees"
    assert verdict("similar", [50.0, 52.0, 48.0, 49.0], **ref) == "disagrees"
    assert verdict("similar", [10.0, 30.0, 20.0, 5.0], **ref) == "inconclusive"
    # identical seeds on both sides: no difference, no direction
    assert verdict("higher", [0.0] * 4, ref_values=[0.0] * 4) == "inconclusive"
    # one seed: no test
    assert verdict("sink", [99.0], level=lvl) == "inconclusive"
    # degenerate runs get no verdict; a degenerate reference gives no direction
    assert verdict("no_sink", [0.0, 0.0, 0.0], degenerate=True) == "degenerate"
    assert verdict("lower", [0.0, 0.0, 0.0], ref_values=[50.0, 50.0, 50.0], ref_degenerate=True) == "inconclusive"
    assert verdict("sink", None, level=lvl) == "inconclusive"
    assert verdict("", [5.0, 6.0]) == ""
    with pytest.raises(ValueError, match="bigger"):
        verdict("bigger", [1.0, 2.0])


def test_seed_stats_hand_worked():
    m, s, sem = seed_stats([1.0, 2.0, 6.0])
    assert m == pytest.approx(3.0)
    assert s == pytest.approx(((4 + 1 + 9) / 2) ** 0.5)  # ddof = 1
    assert sem == pytest.approx(s / 3 ** 0.5)


def _fake_run(d: Path, sinks: list[float], *, steps: int = 10, val_loss: float = 2.0, unigram: float = 3.0,
              commit: str = "a" * 40) -> None:
    """A finished run folder with tracker lines every step (Sink_1 values ``sinks`` at steps 1..n)."""
    d.mkdir(parents=True)
    lines = [{"step": i + 1, "loss": 1.0, "sink_rate": [v, 0.0], "sink_rate_visible": [v + 1.0, 0.0],
              "attention_mass_first": v / 100, "attention_mass_first_visible": v / 100, "val_loss": val_loss}
             for i, v in enumerate(sinks)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (d / "summary.json").write_text(json.dumps({"steps": steps, "tokens": 100, "final": lines[-1],
                                                "unigram_loss": unigram, "emerge_level": 10.0,
                                                "code": {"commit": commit, "dirty": False}}))


@pytest.mark.integration
def test_summary_aggregates_seeds_last_fifth_and_flags(tmp_path, monkeypatch):
    out = tmp_path / "sw"
    study = {"name": "t", "title": "t", "base": "emergence-cpu", "seeds": 3, "sweep_keys": [], "metric": "paper",
             "points": [{"label": "ref", "slug": "ref", "expect": "reference", "paper": 18.0, "x": None},
                        {"label": "wd", "slug": "wd", "expect": "higher", "paper": 41.0, "x": None},
                        {"label": "tiny data", "slug": "tiny", "expect": "no_sink", "paper": None, "x": None}]}
    out.mkdir()
    (out / "study.json").write_text(json.dumps(study))
    # steps 9 and 10 are the last 20% of 10 steps: the Sink_1 of a seed is the mean of those two
    for k, tail in enumerate([(20, 30), (24, 26), (18, 22)]):
        _fake_run(out / "runs/ref" / f"seed{k}", [0] * 8 + list(tail))
    for k, tail in enumerate([(50, 50), (60, 60), (55, 55)]):
        _fake_run(out / "runs/wd" / f"seed{k}", [0] * 8 + list(tail), commit="b" * 40 if k == 2 else "a" * 40)
    for k in range(3):
        _fake_run(out / "runs/tiny" / f"seed{k}", [0] * 10, val_loss=11.0, unigram=4.19)
    from sinklab.sweep import summary as sm

    def no_model(run):  # tracker only; the error names the run's model file by its full path
        raise RuntimeError(f"{run}/final/sinklab_model.json not found" if "tiny" in str(run) else "no model")

    monkeypatch.setattr(sm, "final_ci", no_model)
    rows = summarize_sweep(out, plot=True)
    ref, wd, tiny = rows
    assert ref["n_seeds"] == 3 and ref["sink1_seeds"] == "25;25;20"
    assert ref["sink1_mean"] == pytest.approx(70 / 3, abs=1e-5)
    assert ref["sink1_std"] == pytest.approx(seed_stats([25, 25, 20])[1], abs=1e-5)
    assert ref["sink1_visible_mean"] == pytest.approx(70 / 3 + 1, abs=1e-5)
    assert ref["sink1_final_seeds"] == "30;26;22" and ref["sink1_move"] == 10
    # 3 seeds: the sign-flip test's smallest p is 2/2^3, the two-sample test's 2/C(6, 3): no verdict possible
    assert ref["verdict"] == "inconclusive" and ref["p_min"] == pytest.approx(0.25)
    assert wd["verdict"] == "inconclusive" and wd["p_min"] == pytest.approx(0.1) and wd["p_holm_min"] >= 0.05
    assert wd["code_mixed"] is True and ref["code_mixed"] is False
    # the paper's effect of wd: 41 - 18 points, scaled to our reference level 70/3
    assert wd["paper_effect"] == pytest.approx(23.0) and wd["paper_effect_scaled"] == pytest.approx(23 * 70 / 3 / 18, abs=1e-3)
    assert wd["mass1_effect"] == pytest.approx(0.55 - 0.7 / 3, abs=1e-4)
    assert tiny["degenerate"] is True and tiny["verdict"] == "degenerate"
    # every run failed its final re-measure: said once per row, with how many and why (not once per run)
    assert ref["status"] == "done (no final re-measure for 3 of 3 runs: RuntimeError: no model)"
    # ... with paths relative to the sweep folder (where it lies on this machine is no part of a summary)
    assert f"runs: RuntimeError: tiny/seed0/final/sinklab_model.json not found)" in tiny["status"]
    assert str(out) not in tiny["status"]
    with open(out / "summary.csv") as f:
        assert next(csv.reader(f)) == COLUMNS
    md = (out / "summary.md").read_text()
    assert "23.3 ± 2.9" in md and "degenerate" in md and "inconclusive (n too small)" in md
    text = build_report(tmp_path, tmp_path / "REPORT.md", check=False)
    from sinklab.sweep.verdict import t_interval

    _, lo, hi = t_interval([50.0, 60.0, 55.0])  # 55 +- t(0.975, 2) 5 / sqrt(3)
    # (the headline names the row's caveat: its final re-measure failed here, see no_model above)
    assert (f"| t | wd (no final re-measure for 3 of 3 runs; see summary.csv) | 3 | 55.0 ± 5.0 [{lo:.1f}, {hi:.1f}] | "
            "50.0, 60.0, 55.0 | – | 41; effect +23.0, scaled +29.8 |" in text) and "mixed code" in text
    assert "higher (paper)" in text and "no_sink (ours)" in text


@pytest.mark.integration
def test_sweep_skips_finished_resumes_interrupted_and_summarises(local_two_points, tmp_path):
    """Seed 0 of both points is copied from a finished sibling sweep (the fixture's), seed 1 is trained: point 0's
    from scratch, point 0.5's resumed from a run stopped after 2 of 4 steps; then a second run skips everything,
    the summary and report, and a second study reuses the finished runs."""
    import shutil

    path = _study(tmp_path, """
seeds = 2
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
    assert study.seeds == 2
    out = tmp_path / "res"
    # interrupt point 0.5, seed 1 after 2 of 4 steps (as a killed run: checkpoint, no summary)
    from sinklab.sweep.spec import point_config
    from sinklab.train.loop import train

    p05 = study.points[1]
    d05 = run_dir(out, p05, 1)
    cfg = point_config(study, p05)
    cfg.train.seed = 1
    train(cfg, d05, progress=False, stop_after=2)
    assert (d05 / "checkpoint.pt").exists() and not is_finished(d05)
    cmd = train_command(study, p05, d05, 1)
    assert "--resume" in cmd and "train.seed=1" in cmd

    sibling = _sibling(local_two_points, tmp_path)
    status = run_sweep(study, out, jobs=2, cores=2, progress=False, poll_s=0.2)
    assert status == {f"{s}/seed{k}": "copied" if k == 0 else "done" for s in ("0", "0.5") for k in (0, 1)}
    shutil.rmtree(sibling)  # the report below reads the sweeps under tmp_path: this one only
    steps = [json.loads(x)["step"] for x in (d05 / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # resumed at step 3, not restarted
    assert "--resume" in (d05 / "train.log").read_text()
    rec = json.loads((d05 / "sweep.json").read_text())  # the conditions of the last start: 2 jobs on 2 cores
    assert rec["starts"] == 1 and (rec["jobs"], rec["threads"]) == (2, 1) and len(rec["load_at_end"]) == 3
    # the seeds differ: seed k trained with train.seed = k
    s0 = json.loads((run_dir(out, p05, 0) / "summary.json").read_text())
    s1 = json.loads((d05 / "summary.json").read_text())
    assert (s0["seed"], s1["seed"]) == (0, 1) and s0["final_loss"] != s1["final_loss"]
    assert s0["unigram_loss"] > 0 and "commit" in s0["code"]

    # a second run skips everything
    assert set(run_sweep(study, out, jobs=1, progress=False, poll_s=0.2).values()) == {"skipped"}

    rows = summarize_sweep(out)
    assert (out / "summary.md").exists() and (out / "sink_rate.png").stat().st_size > 0
    for r in rows:
        assert r["status"] == "done" and r["steps"] == 4 and r["n_seeds"] == 2
        assert r["wall_s"] > 0
        # with every-2-steps tracking, the last 20% of 4 steps is step 4 only: the seed values are the final ones
        assert r["sink1_seeds"] == r["sink1_final_seeds"]
    text = build_report(tmp_path, tmp_path / "REPORT.md")
    assert "| tiny | 0.5 | 2 |" in text and "res/sink_rate.png" in text

    # a second study whose point resolves to the same config reuses the finished runs instead of training
    other = tmp_path / "other.toml"
    other.write_text('name = "other"\nbase = "tiny.toml"\nseeds = 2\n[[points]]\nlabel = "same"\n'
                     'set = { "optim.weight_decay" = 0.5 }\n[[points]]\nlabel = "new"\n'
                     'set = { "optim.weight_decay" = 0.25 }\n')
    st = run_sweep(load_study(other), tmp_path / "other", jobs=1, progress=False, poll_s=0.2, only=["same"])
    assert st == {"same/seed0": "copied", "same/seed1": "copied"}
    copied = tmp_path / "other/runs/same/seed1"
    rel = json.loads((copied / "sweep.json").read_text())["copied_from"]
    assert (copied / rel).resolve() == d05.resolve()
    # study.json names the study file relative to the sweep folder (a clone elsewhere finds its own copy)
    sj = json.loads((out / "study.json").read_text())
    assert not Path(sj["path"]).is_absolute() and (out / sj["path"]).resolve() == path.resolve()
    assert (copied / "metrics.jsonl").read_text() == (d05 / "metrics.jsonl").read_text()


def test_report_needs_sweeps(tmp_path):
    with pytest.raises(InputError, match="no sweep folders"):
        build_report(tmp_path, tmp_path / "R.md")


def test_raw_weights_observer_gives_unrenormalised_rows():
    import torch

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
            raw = lambda *a, **k: obs(*a, **k, _k="raw")  # noqa: E731
            raw.raw_weights = True
            m(x, observer=raw)
        (wn, fn), (wr, fr) = got["renorm"], got["raw"]
        if op == "softmax":
            assert not fn and not fr
            torch.testing.assert_close(wn, wr)
        else:
            assert fn and not fr
            assert (wr.sum(-1) - 1).abs().max() > 0.1  # raw sigmoid rows do not sum to 1
            torch.testing.assert_close(wn, wr / wr.sum(-1, keepdim=True))


@pytest.mark.integration
def test_study_dynamics_table_follows_the_tracker(local_two_points, tmp_path):
    """dynamics.csv holds every tracker line of every seed, at the row's own sink position. (Seed 0 is copied
    from the fixture's finished sweep, the same config; seed 1 is trained.)"""
    import csv as _csv

    from sinklab.sweep.dynamics import study_dynamics, tracker_records

    p = _study(tmp_path, 'seeds = 2\n[[points]]\nlabel = "a"\ntoken = 2\nset = { "optim.weight_decay" = 0.0 }\n')
    s = load_study(p)
    out = tmp_path / "sw"
    _sibling(local_two_points, tmp_path)
    assert run_sweep(s, out, jobs=2, cores=2, progress=False, poll_s=0.05) == {"a/seed0": "copied", "a/seed1": "done"}
    study = json.loads((out / "study.json").read_text())
    assert study_dynamics(out, study) == out / "dynamics.png"
    rows = list(_csv.DictReader(open(out / "dynamics.csv")))
    want = [(str(k), r["step"], r["sink_rate"][1], r["attention_mass_first"])
            for k in (0, 1) for r in tracker_records(out / "runs" / "a" / f"seed{k}")]
    got = [(r["seed"], int(r["step"]), float(r["sink"]), float(r["mass1"])) for r in rows]
    assert got == want and len(got) == 4  # tracker at steps 2 and 4, two seeds


def _tracked_run(d: Path) -> Path:
    """A run folder whose metrics.jsonl holds two tracker lines (what `sinklab dynamics` plots)."""
    d.mkdir(parents=True)
    recs = [{"step": s, "loss": 3.0 - s / 10, "sink_rate": [s * 10.0, 1.0], "attention_mass_first": s / 10,
             "val_loss": 3.1 - s / 10} for s in (2, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_dynamics_takes_an_existing_folder_with_equals_in_its_name_as_a_folder(tmp_path, capsys):
    """Sweeps made before issue 21 have folders such as runs/k_bias_v_=_0/seed0: an existing path wins over
    LABEL=RUN; LABEL=RUN still labels a run."""
    from sinklab.cli.main import app
    from sinklab.cli.sweep_cmd import run_pairs

    old = _tracked_run(tmp_path / "runs" / "k_bias_v_=_0" / "seed0")
    other = _tracked_run(tmp_path / "runs" / "softmax" / "seed0")
    assert run_pairs([str(old), f"softmax={other}"]) == {"seed0": str(old), "softmax": str(other)}
    assert run_pairs([f"k=v={old}"]) == {"k": f"v={old}"}  # the first "=" splits when the whole is no path
    with pytest.raises(SystemExit) as e:
        app(["dynamics", str(old), f"softmax={other}", "--out", str(tmp_path / "x")])
    assert e.value.code in (0, None), capsys.readouterr().err
    assert capsys.readouterr().out.strip() == f"dynamics: {tmp_path / 'x' / 'dynamics.png'}"
    assert (tmp_path / "x" / "dynamics.png").stat().st_size > 1000


@pytest.mark.parametrize("given, written", [("plots/", "plots/dynamics.png"), ("existing", "existing/dynamics.png"),
                                            ("noext", "noext/dynamics.png"), ("b.pdf", "b.pdf/dynamics.png")])
def test_dynamics_prints_the_file_it_wrote(tmp_path, capsys, monkeypatch, given, written):
    """--out is a folder (issue 20, item 7): dynamics.png is written inside it, and the path printed."""
    from sinklab.cli.main import app

    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    run = _tracked_run(tmp_path / "run")
    with pytest.raises(SystemExit) as e:
        app(["dynamics", str(run), "--out", given])
    out = capsys.readouterr().out.strip()
    assert e.value.code in (0, None)
    assert out == f"dynamics: {written}" and (tmp_path / written).is_file()
    assert sorted(p.name for p in tmp_path.rglob("*.p[dn][gf]") if p.is_file()) == ["dynamics.png"]


def test_dynamics_out_naming_a_png_is_refused_in_one_line(tmp_path, capsys):
    from helpers import run_cli_captured

    run = _tracked_run(tmp_path / "run")
    code, _, err = run_cli_captured(["dynamics", str(run), "--out", str(tmp_path / "a.png")], capsys)
    assert code == 2 and "is a folder: dynamics.png is written inside it" in err, err
    assert not (tmp_path / "a.png").exists()


def test_seed_placeholder_gives_each_seed_its_own_value(tmp_path):
    """A string override may name the training seed as {seed} (a fine-tuning study's init_from)."""
    from sinklab.sweep.run import shell_command
    from sinklab.sweep.spec import point_config

    study = load_study(_study(tmp_path, '''
[[points]]
label = "ft"
set = { "train.init_from" = "base/runs/softmax/seed{seed}", "optim.lr" = 1e-3 }
'''))
    p = study.points[0]
    cmd = train_command(study, p, tmp_path / "d", 7)
    assert 'train.init_from="base/runs/softmax/seed7"' in cmd and "train.seed=7" in cmd
    assert 'seed7' in shell_command(study, p, tmp_path / "d", 7, 1)
    cfg = point_config(study, p, 3)
    assert cfg.train.init_from == "base/runs/softmax/seed3" and cfg.train.seed == 3
    assert point_config(study, p).train.init_from == "base/runs/softmax/seed{seed}"


def test_spike_counts_hand_worked(tmp_path):
    """count_spikes against a hand-worked curve; training_stability reads metrics.jsonl."""
    from sinklab.sweep.dynamics import count_spikes, training_stability

    flat = [1.0] * 10
    # index 10: 1.3 > 1.2 * median(1.0 x 10) -> spike; index 11: 1.1 is not; index 12: 1.25 vs the
    # median of [1.0 x 8, 1.3, 1.1] = 1.0 -> spike
    assert count_spikes(flat + [1.3, 1.1, 1.25], ratio=1.2) == 2
    assert count_spikes(flat + [1.2], ratio=1.2) == 0  # strictly above
    assert count_spikes([5.0] * 5, ratio=1.2) == 0  # shorter than the window + 1
    lines = [{"step": i + 1, "loss": v, "grad_norm": g} for i, (v, g) in
             enumerate(zip(flat + [1.5], [0.5] * 10 + [2.0]))]
    lines.insert(0, {"step": 0, "sink_rate": [0.0]})  # a tracker-only line (fine-tuning step 0) is skipped
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    st = training_stability(tmp_path)
    assert st == {"loss_spikes": 1, "grad_spikes": 1, "max_grad_norm": 2.0}
    with pytest.raises(InputError):
        training_stability(tmp_path / "missing")


def test_code_mixed_follows_fingerprints_not_commits():
    """Rows trained by two commits with the same numerics are not mixed; a row whose seeds carry two
    fingerprints is; rows without fingerprints fall back to commits."""
    from sinklab.sweep.summary import add_verdicts

    def row(label, fp, commits, expect=""):
        return {"label": label, "expect": expect, "sink1_seeds": "20;21;22", "n_seeds": 3, "code_fingerprint": fp,
                "commits": commits, "metric": "sink1"}

    rows = add_verdicts([row("ref", "aaaa", "c1", "reference"), row("new op", "bbbb", "c2"),
                         row("two codes", "cccc;dddd", "c1"), row("old", None, "c3"), row("old2", None, "c1")], 10.0)
    assert [r["code_mixed"] for r in rows] == [False, False, True, True, False]


@pytest.mark.parametrize("given, written", [("plots/", "plots/REPORT.md"), ("existing", "existing/REPORT.md"),
                                            ("noext", "noext/REPORT.md"), (None, "res/REPORT.md")])
def test_report_out_follows_the_dynamics_rule(tmp_path, capsys, monkeypatch, given, written):
    """One rule for report and dynamics (sinklab.fileio.output_in_folder): --out is a folder and the fixed
    file name is written inside it (issue 20, item 7); without --out the report goes into ROOT."""
    from sinklab.cli.main import app
    from sinklab.sweep import report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    (tmp_path / "res").mkdir()
    seen = []
    def build(root, out):  # the real one writes the report the same way, after the sweeps' summaries
        seen.append(Path(out))
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("r")

    monkeypatch.setattr(report, "build_report", build)
    monkeypatch.setattr(report, "stale_rows", lambda root: [])
    with pytest.raises(SystemExit) as e:
        app(["report", "res", *(["--out", given] if given else [])])
    out = capsys.readouterr().out.splitlines()
    assert e.value.code in (0, None)
    assert seen == [Path(written)] and out[0] == f"report: {written}" and (tmp_path / written).is_file()


# ----------------------------------------------------------------------------- launchers (submitit)

#: summary.csv columns that depend on when and how fast the runs went, not on what they computed
TIMING_COLUMNS = {"wall_s", "load_1min"}


def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.integration
def test_submitit_launcher_gives_the_local_launchers_files_and_summary(local_two_points, tmp_path):
    """A two-point study through submitit's local executor (one job per point and seed; one run stopped
    after 2 of 4 steps beforehand, so its job resumes it) gives the summary.csv of the local launcher
    in every column but the timing ones, the same run files, and the same skip and copy rules."""
    from sinklab.sweep.run import SlurmOptions
    from sinklab.sweep.spec import point_config
    from sinklab.train.loop import train

    study = load_study(_study(tmp_path, TWO_POINTS))
    sub, loc = tmp_path / "sub", tmp_path / "loc"
    p05 = study.points[1]
    d05 = run_dir(sub, p05, 0)
    train(point_config(study, p05), d05, progress=False, stop_after=2)
    opts = SlurmOptions(time_min=20)
    events = []
    status = run_sweep(study, sub, launcher="submitit-local", slurm=opts, progress=False, poll_s=0.5,
                       on_event=lambda e, p: events.append((e, p.label)))
    assert status == {"0/seed0": "done", "0.5/seed0": "done"}, status
    assert sorted(events) == [("done", "0"), ("done", "0.5"), ("start", "0"), ("start", "0.5")]
    assert [json.loads(x)["step"] for x in (d05 / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    assert "--resume" in (d05 / "train.log").read_text()
    rec = json.loads((d05 / "sweep.json").read_text())
    assert rec["launcher"] == "submitit" and rec["job_id"] and rec["returncode"] == 0 and rec["threads"] == 1
    assert list((sub / "submitit").glob("*_log.out"))  # submitit's own logs beside the runs

    _sibling(local_two_points, tmp_path)  # the local launcher's sweep of the same study (2 jobs, 2 cores, trained)
    for p in study.points:
        a, b = run_dir(sub, p, 0), run_dir(loc, p, 0)
        assert sorted(x.name for x in a.iterdir()) == sorted(x.name for x in b.iterdir())
        assert (a / "config.toml").read_text() == (b / "config.toml").read_text()
        la = [{k: v for k, v in json.loads(x).items() if k not in ("tokens_per_s", "elapsed_s")}
              for x in (a / "metrics.jsonl").read_text().splitlines()]
        lb = [{k: v for k, v in json.loads(x).items() if k not in ("tokens_per_s", "elapsed_s")}
              for x in (b / "metrics.jsonl").read_text().splitlines()]
        assert la == lb  # resumed or not, launched by submitit or not: the same numbers
    summarize_sweep(sub)
    summarize_sweep(loc)
    rows_sub, rows_loc = _csv_rows(sub / "summary.csv"), _csv_rows(loc / "summary.csv")
    assert len(rows_sub) == 2 and set(rows_sub[0]) == set(COLUMNS)
    for rs, rl in zip(rows_sub, rows_loc):
        assert {k: v for k, v in rs.items() if k not in TIMING_COLUMNS} == \
               {k: v for k, v in rl.items() if k not in TIMING_COLUMNS}
        assert float(rs["wall_s"]) > 0
    # skip: nothing left to submit; copy: a sibling sweep of the same configs copies the finished runs
    assert set(run_sweep(study, sub, launcher="submitit-local", slurm=opts, progress=False).values()) == {"skipped"}
    st = run_sweep(study, tmp_path / "third", launcher="submitit-local", slurm=opts, progress=False)
    assert set(st.values()) == {"copied"} and not (tmp_path / "third" / "submitit").exists()


def test_slurm_executor_writes_the_jobs_resources_into_sbatch(tmp_path, monkeypatch):
    """--partition / --gpus / --cpus / --time / --slurm-opt / --jobs become #SBATCH lines (submitit's
    own sbatch text, with a stand-in srun so that submitit takes the machine for a Slurm login node);
    no srun: a one-line InputError."""
    from sinklab.sweep.run import SlurmOptions, make_executor

    opts = SlurmOptions(partition="gpu", gpus=2, cpus=8, time_min=90, extra={"account": "lab"})
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(InputError, match="no Slurm here"):
        make_executor("slurm", tmp_path / "jobs", opts)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_ / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_))
    ex = make_executor("slurm", tmp_path / "jobs", opts, name="sinklab-wd", jobs=4)
    text = ex._make_submission_file_text("python -m submitit.core._submit x", "uid")
    for line in ("--partition=gpu", "--gpus-per-node=2", "--cpus-per-task=8", "--time=90", "--account=lab",
                 "--job-name=sinklab-wd", "--signal=USR2@90"):
        assert f"#SBATCH {line}\n" in text, (line, text)
    assert ex.parameters["array_parallelism"] == 4
    with pytest.raises(InputError, match="^gpus must be >= 0"):
        SlurmOptions(gpus=-1)


def test_train_job_adds_nproc_for_several_gpus(tmp_path):
    study = load_study(_study(tmp_path, TWO_POINTS))
    cmd = train_command(study, study.points[0], tmp_path / "r", 0, nproc=4)
    assert cmd[cmd.index("--nproc") + 1] == "4" and "--resume" not in cmd
    assert "--nproc" not in train_command(study, study.points[0], tmp_path / "r", 0)


@pytest.mark.parametrize("args,message", [
    (["--partition", "gpu"], "--partition: options of the submitted jobs; add --launcher slurm"),
    (["--launcher", "pbs"], "--launcher must be one of local, slurm, submitit-local"),
    (["--launcher", "slurm", "--slurm-opt", "account"], "expected KEY=VALUE"),
])
def test_sweep_launcher_bad_options_exit_2(tmp_path, capsys, args, message):
    from helpers import run_cli_captured

    code, _, err = run_cli_captured(["sweep", str(_study(tmp_path, TWO_POINTS)), "--out", str(tmp_path / "o"), *args],
                                    capsys)
    assert code == 2 and message in err, err


def test_seeds_from_two_cpus_are_not_mixed_code_but_two_fingerprints_on_one_cpu_are():
    """Fingerprints differ across CPUs for the same code (rounding), so they are compared within one
    training environment (CPU model, torch, threads): two CPUs with one fingerprint each are not
    mixed; two fingerprints on one CPU are, and so is a row whose seeds all agree but one resumed
    under other code ("mixed:" fingerprint)."""
    from sinklab.sweep.summary import add_verdicts, fingerprints_mixed

    def seed(fp, cpu, torch="2.13.0", threads=1):
        return {"code_fingerprint": fp, "cpu_model": cpu, "torch_version": torch, "threads": threads}

    assert fingerprints_mixed([seed("aaaa", "AMD"), seed("aaaa", "AMD"), seed("bbbb", "Intel")]) is False
    assert fingerprints_mixed([seed("aaaa", "AMD"), seed("bbbb", "AMD"), seed("cccc", "Intel")]) is True
    assert fingerprints_mixed([seed("aaaa", "AMD", threads=1), seed("bbbb", "AMD", threads=2)]) is False
    rows = [{"label": "two cpus", "expect": "", "sink1_seeds": "20;21", "n_seeds": 2, "metric": "sink1",
             "code_fingerprint": "aaaa;bbbb", "commits": "c1", "code_mixed": False},
            {"label": "resumed", "expect": "", "sink1_seeds": "20;21", "n_seeds": 2, "metric": "sink1",
             "code_fingerprint": "mixed:aaaa+cccc", "commits": "c1", "code_mixed": False}]
    assert [r["code_mixed"] for r in add_verdicts(rows, 10.0)] == [False, True]


def test_point_folder_keeps_runs_under_a_new_label(tmp_path):
    """``folder`` names a point's run folder, so a relabelled point keeps its runs; the report picks up
    the new label and shows a point added to the study file since the sweep as not started."""
    from sinklab.sweep.report import refresh_study_json

    s = parse_study({"base": "emergence-cpu", "points": [
        {"label": "elu+1 kernel (no norm)", "folder": "elu_1_no_norm", "set": {"model.attention": "elu1"}}]})
    assert s.points[0].slug == "elu_1_no_norm"
    for bad in ("a/b", "", "x y"):
        with pytest.raises(ConfigError, match="folder"):
            parse_study({"base": "emergence-cpu", "points": [{"label": "x", "folder": bad}]})
    sw = tmp_path / "sw"
    sw.mkdir()
    (tmp_path / "s.toml").write_text('name = "s"\nbase = "emergence-cpu"\n[[points]]\nlabel = "new name"\n'
                                     'folder = "old_name"\n[[points]]\nlabel = "added"\n')
    (sw / "study.json").write_text(json.dumps({"name": "s", "base": "emergence-cpu", "path": "../s.toml", "points": [
        {"label": "old name", "slug": "old_name", "overrides": {}, "x": None, "paper": None, "expect": ""}]}))
    study = refresh_study_json(sw)
    assert [(p["label"], p["slug"]) for p in study["points"]] == [("new name", "old_name"), ("added", "added")]


def test_report_header_gives_the_most_seeds_of_any_row(tmp_path):
    """The report's "up to N seeds each" is the largest seed count in the study's table, not the
    ``seeds`` of the last sweep in ``study.json`` (weight_decay: the last sweep ran 5 seeds, three
    rows have 10; the outside audit of 2026-12-07 found "up to 5")."""
    import shutil

    from sinklab.sweep.report import _sweep_section

    src = Path(__file__).resolve().parents[1] / "results" / "weight_decay"
    sw = tmp_path / "weight_decay"
    sw.mkdir()
    for name in ("study.json", "summary.csv"):
        shutil.copy(src / name, sw / name)
    counts = [int(r["n_seeds"]) for r in _csv_rows(sw / "summary.csv")]
    assert json.loads((sw / "study.json").read_text())["seeds"] == 5 and max(counts) == 10
    parts, _ = _sweep_section(sw, tmp_path, resummarize=False, check=False)
    assert f"up to {max(counts)} seeds each" in parts[1]


def test_a_mask_aware_study_plots_the_mask_aware_dynamics(tmp_path):
    """The sliding-window study's verdicts use the mask-aware Sink_1; its dynamics.csv / .png showed the plain one
    (0% for windows 8 and 16, whose mask-aware Sink_1 is 90% and 55%; outside audit, 2026-12-07). Now the
    dynamics follow the study's metric: recomputed from the packed tracker lines of the committed study."""
    import pandas as pd

    from sinklab.sweep.dynamics import study_dynamics

    src = Path(__file__).resolve().parents[1] / "results" / "sliding_window"
    study = json.loads((src / "study.json").read_text())
    assert study["metric"] == "visible"
    lines = pd.read_json(src / "runs.jsonl.gz", lines=True)
    tracker = [(r.point, r.seed, json.loads(r.text)) for r in lines[lines.file == "metrics.jsonl"].itertuples()]
    tracker = [(p, s, t) for p, s, t in tracker if "sink_rate" in t]
    import shutil

    out = tmp_path / "sliding_window"
    shutil.copytree(src, out)
    study_dynamics(out, study)
    got = pd.read_csv(out / "dynamics.csv")
    label = {p["slug"]: p["label"] for p in study["points"]}
    want = {(str(label[p]), int(t["step"])): [] for p, s, t in tracker}
    for p, s, t in tracker:
        want[(str(label[p]), int(t["step"]))].append(t["sink_rate_visible"][0])
    mean = got.groupby([got["label"].astype(str), "step"]).sink.mean()
    assert len(mean) == len(want)
    for key, values in want.items():
        assert mean[key] == pytest.approx(sum(values) / len(values), abs=1e-9)
    assert mean[("8", int(got.step.max()))] > 50  # the window-8 row's mask-aware rate, not the plain 0


def test_per_seed_columns_read_back_exactly_so_the_statistics_use_the_raw_values():
    """The ``X_seeds`` columns are what every interval and test reads (``seed_values``): written at full
    precision (the outside audit of 2026-12-07: a mass of 0.1000145 was stored as "0.1", the test's level,
    and p moved from 2.098e-05 to 2.289e-05); whole numbers stay short."""
    from sinklab.sweep.summary import _join, seed_values

    vals = [0.1000145, 1 / 3, 25.0, 11.71875, 1e-05]
    s = _join(vals)
    assert seed_values({"x_seeds": s}, "x") == vals
    assert s.split(";")[2] == "25" and _join([100, 101]) == "100;101"


def test_the_table_shows_every_status_but_a_plain_done():
    """Unfinished seeds and a failed final re-measure are shown in the report's table (a status starting
    with "done" was hidden), the failure's message left to summary.csv."""
    from sinklab.sweep.summary import table_status

    failed = ("done (no final re-measure for 5 of 5 runs: InputError: x/seed100/final/sinklab_model.json not found: "
              "not a sinklab model folder (expected sinklab_model.json and model.safetensors))")
    assert table_status(failed) == "no final re-measure for 5 of 5 runs; see summary.csv"
    assert table_status("done (3 of 5 seeds)") == "3 of 5 seeds"
    assert table_status("diverged: every seed (2), at steps 7, 9") == "diverged: every seed (2), at steps 7, 9"
    both = "done (3 of 5 seeds) (no final re-measure for 1 of 3 runs: E: x (y))"
    assert table_status(both) == "done (3 of 5 seeds) (no final re-measure for 1 of 3 runs; see summary.csv)"
    from sinklab.sweep.summary import COLUMNS, markdown_table

    def row(label, status):
        return {**{c: None for c in COLUMNS}, "label": label, "status": status, "n_seeds": 3, "sink1_seeds": "1;2;3"}

    rows = [row("a", "done (3 of 5 seeds)"), row("b", "done")]

    table = markdown_table(rows)
    assert "| a (3 of 5 seeds) |" in table and "| b |" in table
    from sinklab.sweep.report import _headline

    for r in rows:
        r.update(expect="sink", metric="sink1")
    head = "\n".join(_headline([("study", r) for r in rows]))
    assert "| study | a (3 of 5 seeds) |" in head and "| study | b |" in head  # the headline table too


def test_a_study_row_names_its_1_based_token_and_older_records_read_the_same(tmp_path):
    """A study row that reports Sink_k says `token = k` (1-based, as the paper); `position`, which every other
    sinklab name counts from 0, is refused with the rename (no silent shift by one). A study.json written before the
    rename (its points' `position`) and a final_ci.json cache with `top_sink_position` (the same 1-based numbers)
    are read under the new names; the summary's columns are `sink_token` and `top_sink_token`."""
    from sinklab.sweep.spec import point_token
    from sinklab.sweep.summary import final_ci

    s = load_study(_study(tmp_path, '[[points]]\nlabel = "a"\ntoken = 3\n'))
    assert s.points[0].token == 3
    with pytest.raises(ConfigError, match=r"'position' is now 'token'.*write token = 2 for the same row"):
        load_study(_study(tmp_path, '[[points]]\nlabel = "a"\nposition = 2\n'))
    assert [point_token(p) for p in ({"token": 3}, {"position": 2}, {})] == [3, 2, 1]
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"steps": 10}))
    (run / "final_ci.json").write_text(json.dumps({"top_sink_position": 2, "top_sink_rate": 5.0, "run_steps": 10}))
    ci = final_ci(run)  # the cache, not a re-measure (the run has no final model)
    assert ci["top_sink_token"] == 2 and "top_sink_position" not in ci
    assert "sink_token" in COLUMNS and "top_sink_token" in COLUMNS
    assert not any("position" in c for c in COLUMNS)
    from sinklab.sweep.summary import current_names  # an older summary.csv row reads under today's names

    assert current_names({"label": "a", "sink_position": "2", "top_sink_position": "3"}) == {
        "label": "a", "sink_token": "2", "top_sink_token": "3"}
    assert current_names({"sink_token": "2", "sink_position": "9"}) == {"sink_token": "2"}
