"""The reproducibility contract (issue 19): pinned threads, the training-code fingerprint, the sweep's
copy rule and ``sinklab report --check``."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinklab.sweep.run import run_sweep
from sinklab.sweep.spec import load_study
from sinklab.sweep.summary import summarize_sweep
from sinklab.train import loop
from sinklab.runs.config import load_config

from helpers import run_cli_captured, synthetic_run_toml

#: a run that trains in about a second (Bigram-Backcopy, 1 layer, T 16), threads pinned as in the CPU presets
TINY = synthetic_run_toml(8, extra="threads = 1\nprecision = \"fp32\"")


@pytest.fixture
def tiny(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text(TINY)
    return p


def _losses(run: Path) -> list[float]:
    return [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.integration
def test_thread_count_from_the_environment_cannot_change_a_run(tmp_path):
    """4 steps of the emergence-cpu model with OMP_NUM_THREADS 1 and 2 (the two processes side by side):
    identical losses at every step, because sinklab train pins train.threads (1 in the preset) itself; the
    summary records 1 thread (what the environment cannot change is read from summary.json, not only from the
    losses: on a 2-core EPYC an unpinned 2-thread run gave the 1-thread losses bit for bit over 12 steps, so
    the losses alone could not see a lost pin, and more steps would not help them)."""
    runs, procs = {}, []
    for n in (1, 2):
        out = tmp_path / f"t{n}"
        env = {**os.environ, "OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}
        procs.append(subprocess.Popen([sys.executable, "-c", "from sinklab.cli.main import app; app()", "train",
                                       "emergence-cpu", "--out", str(out), "--steps", "4", "--no-progress",
                                       "--set", "track.every=2", "--set", "train.log_every=1"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        runs[n] = out
    for p in procs:
        _, err = p.communicate(timeout=280)
        assert p.returncode == 0, err.decode()[-2000:]
    a, b = _losses(runs[1]), _losses(runs[2])
    assert len(a) == 4 and a == b
    s1, s2 = (json.loads((runs[n] / "summary.json").read_text()) for n in (1, 2))
    assert s1["threads"] == s2["threads"] == 1
    # a training records its environment and code; the fingerprint is the study tool's (sinklab.sweep.fingerprints)
    assert s1["code"] == s2["code"] and s1["code_starts"] == [s1["code"]] and len(s1["code"]["source"]) == 64
    assert "code_fingerprint" not in s1
    assert s1["torch_version"] and s1["cpu_model"]
    assert 'threads = 1' in (runs[1] / "config.toml").read_text()


def test_threads_are_restored_after_train(tiny, tmp_path):
    import torch

    before = torch.get_num_threads()
    loop.train(load_config(tiny, ["train.threads=3"]), tmp_path / "r", progress=False)
    assert torch.get_num_threads() == before
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["threads"] == 3


def test_the_global_random_states_are_restored_after_train(tiny, tmp_path, monkeypatch):
    """train seeds torch's and NumPy's global generators for its model and data, and a resume sets Python's too from
    its checkpoint; a caller's own streams go on after the call as if train had not run (the next draws equal those
    of untouched generators): after a run, after a resume, and after a run that fails once it has seeded them."""
    import random

    import numpy as np
    import torch

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    def seed():
        torch.manual_seed(123)
        np.random.seed(5)
        random.seed(7)

    seed()
    draws()
    want = draws()
    seed()
    draws()
    loop.train(load_config(tiny), tmp_path / "r", progress=False, stop_after=4)
    assert draws() == want
    seed()
    draws()
    loop.train(load_config(tiny), tmp_path / "r", progress=False, resume=True)  # sets all three from the checkpoint
    assert draws() == want

    def fail(*a, **k):  # after the model's seeded init: the generators have been moved when this raises
        raise RuntimeError("optimizer refused")

    monkeypatch.setattr(loop, "build_optimizer", fail)
    seed()
    draws()
    with pytest.raises(RuntimeError, match="optimizer refused"):
        loop.train(load_config(tiny), tmp_path / "s", progress=False)
    assert draws() == want


def test_train_takes_a_preset_name_or_a_toml_path_and_refuses_anything_else(tiny, tmp_path):
    """train(cfg) as `sinklab train NAME`: a TOML path (str or Path) loads as load_config would (the same config
    in the run folder); an unknown preset is a ConfigError that lists the presets; another type an InputError
    naming cfg; neither refusal leaves a folder behind."""
    import sinklab
    from sinklab.errors import ConfigError, InputError
    from sinklab.runs.config import to_toml

    r = sinklab.train(str(tiny), tmp_path / "a", progress=False)
    assert (tmp_path / "a" / "config.toml").read_text() == to_toml(load_config(tiny))
    assert r.losses == loop.train(load_config(tiny), tmp_path / "b", progress=False).losses
    with pytest.raises(ConfigError, match="unknown preset 'nope-preset'; presets: .*emergence-cpu"):
        sinklab.train("nope-preset", tmp_path / "c")
    with pytest.raises(InputError, match="cfg must be a RunConfig, a preset name or a TOML file, got int"):
        sinklab.train(42, tmp_path / "d")
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_fingerprint_ignores_seed_and_equivalent_refactors(tiny, monkeypatch):
    base = loop.code_fingerprint(load_config(tiny))
    assert loop.code_fingerprint(load_config(tiny)) == base  # deterministic
    assert loop.code_fingerprint(load_config(tiny, ["train.seed=7"])) == base  # the seed is not code
    # a refactor of the optimizer's parameter grouping: other code, the same groups, the same numbers
    real = loop.param_groups

    def rewritten(model, weight_decay, decay):
        named = list(model.named_parameters())
        if decay == "all":
            return real(model, weight_decay, decay)
        groups = {True: [], False: []}
        for n, p in named:
            if p.requires_grad:
                groups[p.ndim > 1].append((n, p))
        return [{"params": [p for _, p in groups[k]], "weight_decay": w, "names": [n for n, _ in groups[k]]}
                for k, w in ((True, weight_decay), (False, 0.0))]

    monkeypatch.setattr(loop, "param_groups", rewritten)
    assert loop.code_fingerprint(load_config(tiny)) == base


def test_fingerprint_follows_the_numerics(tiny, monkeypatch):
    cfg = load_config(tiny)
    base = loop.code_fingerprint(cfg)
    assert loop.code_fingerprint(load_config(tiny, ["model.attention=sigmoid"])) != base  # another config
    real = loop.lr_at
    # a change that only bites at the last step of the schedule (past the canonical steps) still flips it
    monkeypatch.setattr(loop, "lr_at", lambda s, o, n: real(s, o, n) * (1.5 if s == n - 1 else 1.0))
    from sinklab.train import schedule as sched

    monkeypatch.setattr(sched, "lr_at", loop.lr_at)
    assert loop.code_fingerprint(cfg) != base
    monkeypatch.undo()
    # a change to the loss in the first steps flips it
    from sinklab.train import objective

    real_loss = objective.CausalObjective.loss
    monkeypatch.setattr(objective.CausalObjective, "loss", lambda self, *a: real_loss(self, *a) * (1 + 1e-6))
    assert loop.code_fingerprint(cfg) != base


def test_fingerprint_of_a_diverging_config_is_where_it_diverged(tiny, monkeypatch):
    from sinklab.train import objective

    real_loss = objective.CausalObjective.loss
    monkeypatch.setattr(objective.CausalObjective, "loss", lambda self, *a: real_loss(self, *a) * float("nan"))
    fp = loop.code_fingerprint(load_config(tiny))
    assert len(fp) == 16 and fp == loop.code_fingerprint(load_config(tiny))


def test_train_records_its_code_and_runs_no_canonical_training(tiny, tmp_path, monkeypatch):
    """train() records the environment and every start's code (commit, dirty flag, source digest); the
    training-code fingerprint is the study tool's: a train() that ran a canonical training would fail here."""
    from sinklab.provenance import code_version, source_digest

    def no(*a, **k):
        raise AssertionError("train() ran a canonical training")

    monkeypatch.setattr(loop, "code_fingerprint", no)
    out = tmp_path / "r"
    loop.train(load_config(tiny), out, progress=False, stop_after=4)
    loop.train(load_config(tiny), out, progress=False, resume=True)
    s = json.loads((out / "summary.json").read_text())
    assert s["code"] == code_version() and s["code"]["source"] == source_digest()
    assert s["code_starts"] == [s["code"], s["code"]]  # two starts
    assert "code_fingerprint" not in s and "code_fingerprints" not in s
    assert s["threads"] == 1 and s["torch_version"] and s["cpu_model"]


def test_the_study_tool_fingerprints_once_per_config_shape_and_records_it(tiny, tmp_path, monkeypatch):
    """sinklab.sweep.fingerprints: one canonical training per config shape and code (the seeds share it,
    cached on disk under SINKLAB_HOME/fingerprints/), recorded per start in sweep.json and written into the
    finished run's summary.json, equal to the fingerprint computed directly."""
    from sinklab.sweep.fingerprints import annotate, current_fingerprint, record_start
    from sinklab.sweep.summary import run_metrics

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    real, calls = loop.code_fingerprint, []
    monkeypatch.setattr(loop, "code_fingerprint", lambda cfg, out=None: calls.append(cfg.train.seed) or real(cfg, out))
    seeds = {k: load_config(tiny, [f"train.seed={k}"]) for k in (100, 101)}
    entries = {k: record_start(tmp_path / f"seed{k}", c, 1) for k, c in seeds.items()}
    assert len(calls) == 1 and entries[100] == entries[101]  # the seed is not part of the config's shape
    fp = entries[100]["fingerprint"]
    assert fp == real(seeds[100]) and entries[100]["cpu_model"] and "error" not in entries[100]
    cached = list((tmp_path / "home" / "fingerprints").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["fingerprint"] == fp
    assert current_fingerprint(seeds[101], 1) == fp and len(calls) == 1  # read from the disk cache
    other = record_start(tmp_path / "sig", load_config(tiny, ["model.attention=sigmoid"]), 1)
    assert len(calls) == 2 and other["fingerprint"] != fp  # another shape: its own canonical training
    # the finished run gets the fingerprint of each start through the start's source digest
    d = tmp_path / "seed100"
    assert not annotate(d)  # not finished
    loop.train(seeds[100], d, progress=False)
    assert annotate(d) and not annotate(d)  # written once
    s = json.loads((d / "summary.json").read_text())
    assert s["code_fingerprint"] == fp and s["code_fingerprints"] == [fp]
    assert s["fingerprint_env"] == {"torch_version": s["torch_version"], "cpu_model": s["cpu_model"]}
    assert run_metrics(d)["code_fingerprint"] == fp
    # a start the sweep did not launch (other code, resumed by hand) has no fingerprint: the run is mixed
    s["code_starts"] = [{"commit": None, "dirty": True, "source": "f" * 64}, s["code"]]
    (d / "summary.json").write_text(json.dumps(s))
    assert annotate(d)
    assert json.loads((d / "summary.json").read_text())["code_fingerprints"] == ["none", fp]
    assert run_metrics(d)["code_fingerprint"] == f"mixed:none+{fp}"


def _tiny_study(tmp_path: Path, tiny: Path, seeds: int = 2) -> Path:
    p = tmp_path / "study.toml"
    p.write_text(f'name = "tiny"\nbase = "{tiny.name}"\nsection = "loss"\nseeds = {seeds}\nfirst_seed = 100\n'
                 '[[points]]\nlabel = "softmax"\nset = { "model.attention" = "softmax" }\npaper = 18.18\n'
                 'expect = "reference"\n')
    return p


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory) -> Path:
    """A folder with tiny.toml, the 2-seed study.toml and its sweep results/tiny, trained once (two
    ``sinklab train`` subprocesses, by the local launcher) for the two tests below, which copy the folder."""
    root = tmp_path_factory.mktemp("tiny_sweep")
    (root / "tiny.toml").write_text(TINY)
    study = load_study(_tiny_study(root, root / "tiny.toml"))
    assert run_sweep(study, root / "results" / "tiny", progress=False, poll_s=0.05) == \
        {"softmax/seed100": "done", "softmax/seed101": "done"}
    return root


@pytest.mark.integration
def test_sweep_copies_only_runs_with_the_current_fingerprint(tiny_sweep, tmp_path, monkeypatch):
    """A sibling sweep of the same configs copies the finished runs; a run whose recorded fingerprint is not
    the current code's is trained again instead (it goes to the launcher; the other seed is still copied)."""
    import shutil

    import sinklab.sweep.run as sweep_run

    shutil.copytree(tiny_sweep, tmp_path, dirs_exist_ok=True)
    study = load_study(tmp_path / "study.toml")
    a, b = tmp_path / "results" / "tiny", tmp_path / "results" / "b"
    assert run_sweep(study, b, progress=False, poll_s=0.05) == {"softmax/seed100": "copied",
                                                                 "softmax/seed101": "copied"}
    # the same config trained by code with other numerics: trained again, not copied
    c = tmp_path / "results" / "c"
    s_path = a / "runs" / "softmax" / "seed100" / "summary.json"
    s = json.loads(s_path.read_text())
    s["code_fingerprint"] = "0" * 16
    s_path.write_text(json.dumps(s))
    (b / "runs").rename(tmp_path / "b_runs")  # leave only the tampered run (and the untouched seed 101) to copy from
    # what the launcher is given to train (the trainings themselves: the fixture's sweep, test_sweep.py)
    trained = []
    monkeypatch.setattr(sweep_run, "_run_local", lambda st, out, todo, *a, **k: trained.extend(
        (p.label, seed) for p, seed in todo))
    events = []
    st = run_sweep(load_study(study.path), c, progress=False, poll_s=0.05, on_event=lambda e, p: events.append(e))
    assert st == {"softmax/seed101": "copied"} and trained == [("softmax", 100)]
    assert any(e.startswith("not copied: training-code fingerprint 0000000000000000 there") for e in events)


@pytest.mark.integration
def test_summary_and_report_check_flag_stale_rows(tiny_sweep, tmp_path, monkeypatch, capsys):
    """``sinklab report --check`` (the CLI, run in-process): exit 0 while every row's fingerprint is current,
    exit 1 naming the stale row once a run's recorded fingerprint differs; without --check exit 0."""
    import shutil

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))  # the current fingerprint computed afresh here
    shutil.copytree(tiny_sweep, tmp_path, dirs_exist_ok=True)
    root = tmp_path / "results"
    rows = summarize_sweep(root / "tiny", plot=False, check=True)
    assert rows[0]["n_seeds"] == 2 and rows[0]["seeds"] == "100;101"
    assert rows[0]["fingerprint_current"] is True and len(rows[0]["code_fingerprint"]) == 16
    cli = ["report", str(root), "--check"]
    code, out, err = run_cli_captured(cli, capsys)
    assert code == 0, err
    assert "every reported row was trained by the current training code" in out
    s_path = root / "tiny" / "runs" / "softmax" / "seed101" / "summary.json"
    s = json.loads(s_path.read_text())
    s["code_fingerprint"], s["code_fingerprints"] = "f" * 16, ["f" * 16]
    s_path.write_text(json.dumps(s))
    code, out, err = run_cli_captured(cli, capsys)
    assert code == 1
    assert "stale: tiny/softmax" in err
    assert "stale" in (root / "REPORT.md").read_text()
    # without --check the report is still written, exit 0
    assert run_cli_captured(cli[:-1], capsys)[0] == 0


def test_a_row_that_could_not_be_compared_is_marked_unchecked_not_stale():
    from sinklab.sweep.summary import stale_mark

    assert stale_mark({"fingerprint_current": True, "fingerprint_check": "same machine"}) == ""
    assert stale_mark({"fingerprint_current": "False", "fingerprint_check": "commit abc re-run here"}) == \
        "stale: trained by code with other numerics"
    assert stale_mark({"fingerprint_current": False, "fingerprint_check": "same machine; commit abc re-run here"}) == \
        "stale: trained by code with other numerics"
    how = "commit f167b8851f71 cannot compute a fingerprint here"
    assert stale_mark({"fingerprint_current": False, "fingerprint_check": how}) == f"unchecked: {how}"


@pytest.mark.integration
def test_init_from_starts_from_the_runs_weights_with_a_fresh_optimizer(tiny, tmp_path):
    """Fine-tuning (issue 24 item 1): the first step's loss is the source model's loss on the new data's
    first batch, computed independently; a resume of the fine-tuning run is exact; a different model is refused."""
    import torch

    from sinklab.data.packing import PackedData, make_packer
    from sinklab.errors import ConfigError
    from sinklab.nn.model import SinkLM

    src = tmp_path / "src"
    loop.train(load_config(tiny), src, progress=False)
    # "new data": the synthetic task with another transition matrix (same vocabulary)
    over = [f"train.init_from={json.dumps(str(src))}", "data.synthetic.seed=5", "train.steps=6"]
    cfg = load_config(tiny, over)
    assert f'init_from = "{src}"' in __import__("sinklab.runs.config", fromlist=["to_toml"]).to_toml(cfg)
    res = loop.train(cfg, tmp_path / "ft", progress=False)
    # independent: the source model's loss on batch 0 of the new data
    from sinklab.runs import Run

    new = Run(cfg, tmp_path)
    data = PackedData(new.corpus.train, make_packer(cfg.data.packing, new.packing_context), cfg.data.seq_len,
                      seed=cfg.train.seed)
    x, y = data.batch(0, cfg.train.batch_size)
    m = SinkLM.from_pretrained(src / "final")
    with torch.no_grad():
        want = float(loop.lm_loss(m(x).logits, y))
    assert res.losses[1] == pytest.approx(want, rel=1e-5)
    # a fresh random init gives another first loss
    other = loop.train(load_config(tiny, over[1:]), tmp_path / "scratch", progress=False)
    assert other.losses[1] != pytest.approx(want, rel=1e-3)
    # resume of a fine-tuning run: identical losses
    part = tmp_path / "part"
    loop.train(cfg, part, progress=False, stop_after=3)
    resumed = loop.train(cfg, part, progress=False, resume=True)
    assert [resumed.losses[k] for k in (4, 5, 6)] == [res.losses[k] for k in (4, 5, 6)]
    assert json.loads((tmp_path / "ft" / "summary.json").read_text())["init_from"] == str(src)
    # the step-0 tracker line measures the starting model: on the source's own data (same probe and
    # validation windows) it equals the source run's final tracker line, number for number
    same = loop.train(load_config(tiny, [over[0], "train.steps=2"]), tmp_path / "same", progress=False)
    first = json.loads((tmp_path / "same" / "metrics.jsonl").read_text().splitlines()[0])
    last_src = [json.loads(ln) for ln in (src / "metrics.jsonl").read_text().splitlines() if "sink_rate" in ln][-1]
    assert first["step"] == 0 and "loss" not in first
    for k in ("val_loss", "sink_rate", "attention_mass_first", "norm_ratio"):
        assert first[k] == last_src[k], k
    assert same.history[0]["step"] == 0
    # the fingerprint identifies the code, not the starting weights: every parent gives the one of a
    # training from scratch with the same config, so the seeds of a fine-tuning study share it
    assert loop.code_fingerprint(cfg) == loop.code_fingerprint(load_config(tiny, over[1:]))
    with pytest.raises(ConfigError, match="model differs.*d_model"):
        loop.train(load_config(tiny, over + ["model.d_model=32"]), tmp_path / "bad", progress=False)


@pytest.mark.integration
def test_a_run_from_another_cpu_is_checked_by_re_running_its_commit_here(tiny, tmp_path, monkeypatch):
    """A run trained on another CPU (whose rounding differs) is current when the code of its commit
    gives the current fingerprint on this machine; a commit whose code computes other numbers is not;
    a dirty tree or a missing commit cannot be checked."""
    import shutil

    import sinklab
    from sinklab.sweep.summary import seed_is_current
    from sinklab.train.fingerprint import cached_fingerprint

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    repo = tmp_path / "repo"
    shutil.copytree(Path(sinklab.__file__).parent, repo / "src" / "sinklab",
                    ignore=shutil.ignore_patterns("__pycache__"))

    def git(*a):
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "same code")
    same = git("rev-parse", "HEAD")
    fp_file = repo / "src" / "sinklab" / "train" / "fingerprint.py"
    fp_file.write_text(fp_file.read_text().replace("FINGERPRINT_STEPS = 3", "FINGERPRINT_STEPS = 2"))
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "other numerics")
    other = git("rev-parse", "HEAD")

    run = repo / "results" / "run"
    cfg = load_config(tiny)
    loop.train(cfg, run, progress=False)
    current = cached_fingerprint(load_config(run / "config.toml"), loop.code_fingerprint, run)
    # trained outside a sweep: no fingerprint recorded, the source digest says it is the current code
    assert seed_is_current(run, current) == (True, "same source")
    # as the sweep records it (sinklab.sweep.fingerprints): the fingerprint, computed on this machine
    from sinklab.sweep.fingerprints import annotate, record_start

    record_start(run, cfg, None)
    assert annotate(run)
    s_path = run / "summary.json"
    s = json.loads(s_path.read_text())
    assert s["code_fingerprints"] == [current]
    assert seed_is_current(run, current) == (True, "same machine")

    def write_as(commit, dirty=False):
        code = {"commit": commit, "dirty": dirty, "source": "0" * 64}  # as that commit's trainer records it
        s.update(cpu_model="Some Other CPU", code_fingerprint="0" * 16, code_fingerprints=["0" * 16],
                 code=code, code_starts=[code], fingerprint_env={"cpu_model": "Some Other CPU"})
        s_path.write_text(json.dumps(s))

    def as_if(commit, dirty=False):
        write_as(commit, dirty)
        return seed_is_current(run, current)

    # Neither of these runs a commit's code: a dirty tree cannot be re-run, a missing commit cannot be exported.
    ok, how = as_if(same, dirty=True)
    assert not ok and "dirty tree" in how
    ok, how = as_if("f" * 40)
    assert not ok and "cannot compute" in how
    # Each commit's code is run once below (a Python + torch start each, the cost of this test); the later
    # checks of that commit read the fingerprint it cached under $SINKLAB_HOME/fingerprints/.
    # The commit's code gets the run's config.toml as that commit wrote it, not today's to_toml, whose newer
    # keys (e.g. model.attention_backend) older code rejects as unknown: today's to_toml writes a key the
    # commits' code rejects for every re-run below, so a re-run that was given to_toml's text fails.
    import sinklab.runs.config as runs_config

    real = runs_config.to_toml
    monkeypatch.setattr(runs_config, "to_toml", lambda c: real(c).replace("[model]\n", "[model]\nnot_a_key_yet = 1\n"))
    # A packed study's runs are read from its table unpacked into $SINKLAB_HOME, outside any checkout: the
    # commit is then looked up in the checkout that holds the sweep folder (check_fingerprints passes it).
    write_as(same)
    outside = tmp_path / "home" / "unpacked" / "run"
    shutil.copytree(run, outside)
    cached = [json.loads(f.read_text()).get("commit") for f in (tmp_path / "home" / "fingerprints").glob("*.json")]
    assert same not in cached  # nothing cached for the commit yet: the first answer is not read from the cache
    assert seed_is_current(outside, current)[1] == f"commit {same[:12]} cannot compute a fingerprint here"
    assert seed_is_current(outside, current, repo=repo / "results") == (True, f"commit {same[:12]} re-run here")
    # the run inside the checkout (same: cached above; other: its code run here, the commit found from the run
    # folder itself)
    assert as_if(same) == (True, f"commit {same[:12]} re-run here")
    ok, how = as_if(other)
    assert not ok and how == f"commit {other[:12]} re-run here"
    # A CPU that reports this machine's model name but rounded differently (the recorded fingerprint
    # is not this machine's): decided by re-running its commit, not declared stale by the name alone.
    def same_name(commit):
        code = {"commit": commit, "dirty": False, "source": "0" * 64}
        s.update(cpu_model=here["cpu_model"], torch_version=here["torch_version"], code_fingerprint="0" * 16,
                 code_fingerprints=["0" * 16], code=code, code_starts=[code], fingerprint_env=here)
        s_path.write_text(json.dumps(s))
        return seed_is_current(run, current)

    from sinklab.train.fingerprint import environment
    here = environment()
    assert same_name(same) == (True, f"commit {same[:12]} re-run here (same CPU name, other rounding)")
    assert same_name(other) == (False, f"commit {other[:12]} re-run here (same CPU name, other rounding)")


def test_commit_label_is_the_checkouts_head_and_says_dirty(monkeypatch):
    """The label benchmarks and experiments write into their results: HEAD's first hex digits, "+dirty" when the
    package's files differ from it, "unknown" outside git."""
    from sinklab import provenance

    monkeypatch.setattr(provenance, "code_version", lambda: {"commit": "0123456789abcdef" * 2 + "01234567",
                                                             "dirty": False, "version": None, "source": None})
    assert provenance.commit_label() == "0123456789ab" and provenance.commit_label(7) == "0123456"
    monkeypatch.setattr(provenance, "code_version", lambda: {"commit": "f" * 40, "dirty": True, "version": None,
                                                             "source": None})
    assert provenance.commit_label() == "ffffffffffff+dirty"
    monkeypatch.setattr(provenance, "code_version", lambda: {"commit": None, "dirty": None, "version": None,
                                                             "source": None})
    assert provenance.commit_label() == "unknown"
