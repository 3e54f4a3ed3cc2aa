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

from sinklab.train import loop
from sinklab.data.packing import PackedData, PackingContext, make_packer
from sinklab.data.tokens import prepare_corpus
from sinklab.errors import ConfigError
from sinklab.train import distributed
from sinklab.runs.config import apply_overrides, from_dict, to_toml

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


@pytest.mark.integration
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
    summary = json.loads((out / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["processes_starts"] == [2]
    # the 2-rank checkpoint resumes on one process and gives the one-process run's next loss
    cfg4 = from_dict(apply_overrides(raw_cfg(corpus), [f"train.parallel={parallel}", "train.steps=4"]))
    nxt = loop.train(cfg4, out, resume=True, progress=False).losses
    assert sorted(nxt) == [1, 2, 3, 4] and all(abs(nxt[s] - two[s]) < 1e-6 for s in (1, 2, 3))  # the 2-rank start's kept
    assert nxt[4] == pytest.approx(one_process[4], abs=2e-5)
    summary = json.loads((out / "summary.json").read_text())  # every start's processes, not only the last one's
    assert summary["processes"] == 1 and summary["processes_starts"] == [2, 1]
    if parallel == "fsdp":  # a full one-process checkpoint loaded into sharded parameters and optimizer state
        p = subprocess.run([*cmd, "--resume", "--set", "train.steps=5"], env=env(), capture_output=True, text=True,
                           timeout=180)
        assert p.returncode == 0, p.stderr[-3000:]
        five = losses(out)
        assert sorted(five) == [1, 2, 3, 4, 5]
        assert five[5] == pytest.approx(one_process[5], abs=2e-5)


@pytest.mark.integration
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
    from helpers import run_cli_captured

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
    for step, micro in ((0, 0), (3, 1)):
        whole_x, whole_y = data.batch(step * A + micro, B)
        parts = [distributed.micro_batch(distributed.Dist(rank=r, world=3), data, step, micro, A, B) for r in range(3)]
        assert torch.equal(torch.cat([x for x, _ in parts]), whole_x)
        assert torch.equal(torch.cat([y for _, y in parts]), whole_y)
    x, y = distributed.micro_batch(distributed.Dist(), data, 3, 1, A, B)
    assert torch.equal(x, data.batch(3 * A + 1, B)[0])
    assert distributed.loss_weights(distributed.Dist(), [(x, y)], torch.device("cpu")) is None


def test_backend_for_each_device_type():
    """CUDA training needs NCCL for CUDA tensors and gloo for CPU ones; CPU training gloo alone."""
    assert distributed.backend_for(torch.device("cuda", 1)) == "cpu:gloo,cuda:nccl"
    assert distributed.backend_for(torch.device("cpu")) == "gloo"


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_step_statistics_are_reduced_on_the_training_device(monkeypatch, device):
    """loss_weights / mean_over_ranks: one all_reduce each, of a tensor on the training device (meta
    stands in for a CUDA device: a CPU tensor there would be the NCCL failure of issue 22), with the
    hand-worked weights c_{r,m} W / C_m of rank 0 of 2 whose peer has 4 and 2 targets."""
    calls = []
    peer = {"counts": torch.tensor([4.0, 2.0], dtype=torch.float64), "losses": torch.tensor([3.0, 5.0])}

    def fake_all_reduce(t):  # the sum over ranks: this rank's tensor plus the peer's
        calls.append((t.device.type, t.dtype, tuple(t.shape)))
        t += peer["counts" if t.dtype == torch.float64 else "losses"].to(t.device, t.dtype)

    monkeypatch.setattr(torch.distributed, "all_reduce", fake_all_reduce)
    d = distributed.Dist(rank=0, world=2)
    ignore = -100
    y0 = torch.tensor([[1, 2, ignore, ignore]])  # 2 targets
    y1 = torch.tensor([[1, 2, 3, 4]])  # 4 targets
    w = distributed.loss_weights(d, [(y0, y0), (y1, y1)], torch.device(device))
    losses = distributed.mean_over_ranks(d, torch.tensor([1.0, 2.0], device=device))
    assert calls == [(device, torch.float64, (2,)), (device, torch.float32, (2,))]
    assert w.device.type == device and losses.device.type == device
    if device == "cpu":  # rank 0: 2 of 6 targets in micro-batch 0, 4 of 6 in micro-batch 1
        assert w.tolist() == pytest.approx([2 * 2 / 6, 4 * 2 / 6], rel=1e-12)
        assert losses.tolist() == pytest.approx([(1 + 3) / 2, (2 + 5) / 2])


# ----------------------------------------------------------------------------- scale-sensitive equality

#: plain SGD without clipping: the update is lr x the gradient, so summing the ranks' gradients instead
#: of averaging them (or any other wrong scale) moves the parameters by a different amount
SGD = ["optim.lr=0.5", "optim.grad_clip=0", "optim.weight_decay=0", "train.steps=2", "train.grad_accum=3"]
WORKER = str(Path(__file__).resolve().parent / "dist_record_worker.py")


def final_params(run: Path) -> dict[str, torch.Tensor]:
    from sinklab.nn.model import SinkLM

    return SinkLM.from_pretrained(run / "final").state_dict()


@pytest.fixture(scope="module")
def sgd_one_process(corpus, tmp_path_factory):
    """The one-process SGD references on the ragged targets: parameters after 2 steps at lr and at 2 lr."""
    from dist_record_worker import ragged, sgd

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "build_optimizer", sgd)
        mp.setattr(PackedData, "samples", ragged(PackedData.samples))
        for name, lr in (("lr", 0.5), ("2lr", 1.0)):
            run = tmp_path_factory.mktemp(f"sgd-one-{name}") / "run"
            loop.train(from_dict(apply_overrides(raw_cfg(corpus), [*SGD, f"optim.lr={lr}"])), run, progress=False)
            out[name] = final_params(run)
    return out


#: the masked diffusion run of :func:`two_rank_runs` (2 steps, ddp)
DIFFUSION = ["train.objective=masked_diffusion", "train.steps=2"]


@pytest.fixture(scope="module")
def two_rank_runs(corpus, tmp_path_factory):
    """One torchrun launch of the recording worker (2 ranks) that trains, one after the other: 2 SGD steps
    (grad_accum 3) on the ragged targets under ddp and under fsdp, and 2 masked diffusion steps under ddp (each
    launch costs two Python + torch starts, so the three runs share one). The run folders and every rank's
    collectives, by name ("ddp", "fsdp", "diffusion")."""
    root = tmp_path_factory.mktemp("two-ranks")
    plan = []
    for name, over, flags in (("ddp", [*SGD, "train.parallel=ddp"], {"sgd": True, "ragged": True}),
                              ("fsdp", [*SGD, "train.parallel=fsdp"], {"sgd": True, "ragged": True}),
                              ("diffusion", [*DIFFUSION, "train.parallel=ddp"], {})):
        cfg_file = root / f"{name}.toml"
        cfg_file.write_text(to_toml(from_dict(apply_overrides(raw_cfg(corpus), over))))
        plan.append({"config": str(cfg_file), "out": str(root / name / "run"), "records": str(root / name / "records"),
                     **flags})
    (root / "plan.json").write_text(json.dumps(plan))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", WORKER,
           str(root / "plan.json")]
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return {name: {"run": root / name / "run",
                   "records": [json.loads((root / name / "records" / f"rank{r}.json").read_text()) for r in range(2)]}
            for name in ("ddp", "fsdp", "diffusion")}


@pytest.fixture(scope="module", params=["ddp", "fsdp"])
def sgd_two_ranks(request, two_rank_runs):
    """2 SGD steps on 2 ranks (grad_accum 3) under the recording worker, on the ragged targets: final
    parameters and every rank's collectives."""
    run = two_rank_runs[request.param]
    return {"parallel": request.param, "params": final_params(run["run"]), "records": run["records"]}


def test_ragged_targets_give_the_ranks_unequal_counts():
    """In every micro-batch of the SGD runs (2 steps x 3 micro-batches of 4 samples, 2 per rank) the
    two ranks count different numbers of targets (T 16 minus the masked ones), so every loss weight
    c_{r,m} W / C_m differs from 1 and a weight of 1 gives other gradients."""
    from dist_record_worker import ragged_mask

    for m in range(2 * 3):
        c = [sum(16 - ragged_mask(4 * m + 2 * r + i) for i in range(2)) for r in range(2)]
        assert c[0] != c[1], (m, c)


@pytest.mark.integration
def test_two_ranks_sgd_parameters_equal_one_process(sgd_two_ranks, sgd_one_process):
    """After 2 SGD steps without clipping the 2-rank parameters equal the one-process ones; the 2 lr
    reference (what a summed instead of averaged gradient would give at the first step) is far off,
    so the comparison sees a wrong gradient scale (AdamW and clipping would hide it). The ranks count
    different numbers of targets per micro-batch (:func:`dist_record_worker.ragged`), so the comparison
    also sees wrong per-rank loss weights (all 1, say, instead of c_{r,m} W / C_m)."""
    two, one, one2 = sgd_two_ranks["params"], sgd_one_process["lr"], sgd_one_process["2lr"]
    assert sorted(two) == sorted(one)
    worst = max(float((two[k] - one[k]).abs().max()) for k in one)
    scale = max(float((one2[k] - one[k]).abs().max()) for k in one)
    assert worst < 1e-5, (sgd_two_ranks["parallel"], worst)
    assert scale > 1e-2, scale  # the parameters moved: a 2x gradient would miss by >1000x the tolerance


@pytest.mark.integration
def test_collectives_are_on_the_device_once_per_step(sgd_two_ranks):
    """Every collective inside an optimizer step is on the training device; sinklab's own are two
    all_reduces per step (the 3 micro-batches' counts, then their losses: float64, 3 values each),
    not two per micro-batch."""
    for rank, records in enumerate(sgd_two_ranks["records"]):
        in_step = [r for r in records if r["phase"] == "step"]
        assert {r["device"] for r in in_step if r["device"] is not None} == {"cpu"}, (rank, in_step)
        ours = [r for r in in_step if r["caller"].startswith("sinklab")]
        assert {r["caller"] for r in ours} == {"sinklab.train.distributed"}
        for step in (1, 2):
            got = [(r["op"], r["dtype"], r["numel"]) for r in ours if r["step"] == step]
            assert got == [("all_reduce", "float64", 3)] * 2, (rank, step, got)
        assert {r["step"] for r in ours} == {1, 2}


@pytest.mark.integration
def test_two_ranks_masked_diffusion_equal_one_process(corpus, two_rank_runs, tmp_path):
    """Masked diffusion: every rank draws its rows' masks from (seed, global sample index), so 2 ranks
    give the one-process losses (issue 14). Trained in :func:`two_rank_runs`' launch (``torchrun -m sinklab
    train`` is the fsdp-torchrun case's launch, sinklab's --nproc launcher the ddp-sinklab case's)."""
    ref = loop.train(from_dict(apply_overrides(raw_cfg(corpus), DIFFUSION)), tmp_path / "one", progress=False).losses
    two = losses(two_rank_runs["diffusion"]["run"])
    assert sorted(two) == [1, 2]
    assert json.loads((two_rank_runs["diffusion"]["run"] / "summary.json").read_text())["processes"] == 2
    for s in two:
        assert two[s] == pytest.approx(ref[s], abs=2e-5), (s, two, ref)
