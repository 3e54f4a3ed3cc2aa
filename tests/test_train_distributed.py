"""Data-parallel training under torchrun (gloo on CPU): equality with one process, resume on another
number of ranks, a dead rank, batch sharding."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sinklab.train.loop as loop
from sinklab.data.packing import PackedData, PackingContext, make_packer
from sinklab.data.tokens import prepare_corpus
from sinklab.errors import ConfigError
from sinklab.train import distributed
from sinklab.train.config import apply_overrides, from_dict, to_toml

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will").split()
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    texts = root / "texts"
    texts.mkdir()
    rng = random.Random(1)
    for i in range(24):
        paras = [" ".join(rng.choice(WORDS) for _ in range(50)).capitalize() + "." for _ in range(6)]
        (texts / f"doc{i:02d}.txt").write_text("\n\n".join(paras))
    return {"texts": str(texts), "cache": str(root / "tokens")}


def raw_cfg(corpus):
    # constant schedule: a finished 3-step run continued to 4 steps equals a 4-step run (exact resume test)
    return {
        "model": {"d_model": 16, "n_layers": 2, "n_heads": 2, "d_ff": 32},
        "data": {"corpus": corpus["texts"], "vocab_size": 280, "seq_len": 16, "val_fraction": 0.2,
                 "cache_dir": corpus["cache"]},
        "optim": {"warmup_steps": 0, "lr": 3e-3, "schedule": "constant"},
        "train": {"steps": 3, "batch_size": 4, "grad_accum": 2, "log_every": 1, "checkpoint_every": 0,
                  "tensorboard": False, "precision": "fp32", "device": "cpu"},
        "track": {"every": 0, "n_probe": 4, "probe_len": 16, "positions": 2, "val_windows": 4},
    }


def env(**extra):
    e = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    e.update(extra)
    return e


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory):
    """The reference: 5 steps on one process (no torchrun)."""
    cfg = from_dict(apply_overrides(raw_cfg(corpus), ["train.steps=5"]))
    return loop.train(cfg, tmp_path_factory.mktemp("one") / "run", progress=False).losses


@pytest.mark.parametrize("parallel,launcher", [("ddp", "sinklab"), ("fsdp", "torchrun")])
def test_two_ranks_equal_one_process_and_resume_on_one(corpus, one_process, tmp_path, parallel, launcher):
    """3 steps on 2 ranks == 3 steps on 1 process; that checkpoint resumed on 1 process gives the
    4th loss; (FSDP2) that 1-process checkpoint resumed on 2 ranks gives the 5th."""
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(to_toml(from_dict(apply_overrides(raw_cfg(corpus), [f"train.parallel={parallel}"]))))
    out = tmp_path / "two"
    args = ["train", str(cfg_file), "--out", str(out), "--no-progress"]
    if launcher == "sinklab":
        cmd = [sys.executable, "-m", "sinklab", *args, "--nproc", "2"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "sinklab", *args]
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    two = losses(out)
    assert sorted(two) == [1, 2, 3]
    for s in two:  # same global batch, same losses (the gradient all-reduce only changes the summation order)
        assert two[s] == pytest.approx(one_process[s], abs=2e-5), (s, two, one_process)
    assert json.loads((out / "summary.json").read_text())["processes"] == 2
    # the 2-rank checkpoint resumes on one process and gives the one-process run's next loss
    cfg4 = from_dict(apply_overrides(raw_cfg(corpus), [f"train.parallel={parallel}", "train.steps=4"]))
    nxt = loop.train(cfg4, out, resume=True, progress=False).losses
    assert sorted(nxt) == [4]
    assert nxt[4] == pytest.approx(one_process[4], abs=2e-5)
    if parallel == "fsdp":  # a full one-process checkpoint loaded into sharded parameters and optimizer state
        p = subprocess.run([*cmd, "--resume", "--set", "train.steps=5"], env=env(), capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0, p.stderr[-3000:]
        five = losses(out)
        assert sorted(five) == [1, 2, 3, 4, 5]
        assert five[5] == pytest.approx(one_process[5], abs=2e-5)


def test_dead_rank_fails_the_launch_with_a_clear_message(corpus, tmp_path):
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(to_toml(from_dict(apply_overrides(raw_cfg(corpus), ["train.steps=50"]))))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sinklab", "train", str(cfg_file), "--out", str(tmp_path / "run"),
                        "--nproc", "2", "--no-progress"],
                       env=env(SINKLAB_FAULT="1:2"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    last = p.stderr.strip().splitlines()[-1]
    assert "rank 1 was killed by signal SIGKILL" in last, p.stderr[-3000:]
    assert time.monotonic() - t0 < 90


def test_failure_message_names_rank_and_exit_code():
    report = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026\n  host      : h\n"
              "  rank      : 3 (local_rank: 1)\n  exitcode  : 7 (pid: 12)\n")
    assert "rank 3 exited with code 7" in distributed.failure_message(4, 1, report)
    assert "exit code 1" in distributed.failure_message(4, 1, "nothing parsable")


def test_batch_must_split_over_ranks(corpus, tmp_path, capsys):
    from conftest import run_cli_captured

    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(to_toml(from_dict(raw_cfg(corpus))))
    code, _, err = run_cli_captured(["train", str(cfg_file), "--out", str(tmp_path / "r"), "--nproc", "3"], capsys)
    assert code == 2 and "does not split over 3 processes" in err
    with pytest.raises(ConfigError, match="ddp"):
        from_dict(apply_overrides(raw_cfg(corpus), ["train.parallel=zero3"]))


def test_rank_shares_partition_the_global_micro_batch(corpus, tmp_path):
    """Rank r's slice of every micro-batch: disjoint, in rank order, together the one-process batch."""
    tc = prepare_corpus(corpus["texts"], vocab_size=280, val_fraction=0.2, cache_root=corpus["cache"])
    data = PackedData(tc.train, make_packer("concat", PackingContext(eos_id=tc.eos_id, bos_id=tc.bos_id,
                                                                     vocab_size=tc.vocab_size)), 16, seed=0)
    B, A = 6, 2
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for step, micro in ((0, 0), (3, 1)):
            whole_x, whole_y = data.batch(step * A + micro, B)
            parts = [distributed.micro_batch(distributed.Dist(rank=r, world=3), data, step, micro, A, B) for r in range(3)]
            assert torch.equal(torch.cat([x for x, _, _ in parts]), whole_x)
            assert torch.equal(torch.cat([y for _, y, _ in parts]), whole_y)
    finally:
        torch.distributed.destroy_process_group()
    x, y, w = distributed.micro_batch(distributed.Dist(), data, 3, 1, A, B)
    assert w == 1.0 and torch.equal(x, data.batch(3 * A + 1, B)[0])


def test_two_ranks_masked_diffusion_equal_one_process(corpus, tmp_path):
    """Masked diffusion: every rank draws its rows' masks from (seed, global sample index), so 2 ranks
    give the one-process losses (issue 14)."""
    over = ["train.objective=masked_diffusion", "train.steps=2"]
    ref = loop.train(from_dict(apply_overrides(raw_cfg(corpus), over)), tmp_path / "one", progress=False).losses
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(to_toml(from_dict(apply_overrides(raw_cfg(corpus), [*over, "train.parallel=ddp"]))))
    p = subprocess.run([sys.executable, "-m", "sinklab", "train", str(cfg_file), "--out", str(tmp_path / "two"),
                        "--no-progress", "--nproc", "2"], env=env(), capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    two = losses(tmp_path / "two")
    assert sorted(two) == [1, 2]
    for s in two:
        assert two[s] == pytest.approx(ref[s], abs=2e-5), (s, two, ref)
