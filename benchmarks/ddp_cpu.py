"""Benchmark: data-parallel CPU training throughput, 2 gloo processes against 1 process, same global batch.

The ``tiny-cpu`` preset (4.9M parameters, SOTU text, global batch 16 x 256 tokens, bf16 autocast)
for ``--steps`` optimizer steps, run three ways through the real command line, one after the other:

* ``1proc-1thread``  -- ``sinklab train`` with ``OMP_NUM_THREADS=1`` (one core);
* ``1proc-2threads`` -- ``sinklab train`` with ``OMP_NUM_THREADS=2`` (two cores, intra-op threads);
* ``2proc-1thread``  -- ``sinklab train --nproc 2`` (torchrun, gloo, DDP; 8 windows per rank per
  step, one thread per rank: two cores).

Throughput is read from each run's ``summary.json``: ``median_step_tokens_per_s`` (tokens of a step
over the median optimizer-step wall time; data preparation, start-up and the tracker excluded) and
the launch's wall time. Ratios are against ``1proc-1thread`` measured in this one invocation; the
load average before and after is recorded (the machine is shared). The final losses of the runs are
recorded too: equal global batches give equal losses up to float summation order.

Usage::

    python benchmarks/ddp_cpu.py [--steps 20]

Writes ``benchmarks/results/ddp_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(name: str, steps: int, out: Path, nproc: int, threads: int) -> dict:
    sets = [f"train.steps={steps}", "train.checkpoint_every=0", "train.tensorboard=false", 'train.device="cpu"',
            "track.every=0", "track.n_probe=8", "track.val_windows=8"]
    cmd = [sys.executable, "-m", "sinklab", "train", "tiny-cpu", "--out", str(out), "--no-progress"]
    for s in sets:
        cmd += ["--set", s]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    launch_s = time.perf_counter() - t0
    s = json.loads((out / "summary.json").read_text())
    return {"name": name, "processes": nproc, "threads_per_process": threads, "command": " ".join(cmd[1:]),
            "launch_wall_s": round(launch_s, 2), "median_step_s": s["seconds_per_step"],
            "median_step_tokens_per_s": s["median_step_tokens_per_s"], "run_tokens_per_s": s["tokens_per_s"],
            "final_loss": s["final_loss"], "tokens_per_step": s["tokens"] // s["steps"], "steps": s["steps"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch

    load_start = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, nproc, threads in (("1proc-1thread", 1, 1), ("2proc-1thread", 2, 1), ("1proc-2threads", 1, 2)):
            r = run(name, args.steps, Path(tmp) / name, nproc, threads)
            runs.append(r)
            print(f"{name:16s} {r['median_step_tokens_per_s']:10.1f} tokens/s (median step)  "
                  f"launch {r['launch_wall_s']:.1f} s  final loss {r['final_loss']:.5f}")
    base = runs[0]["median_step_tokens_per_s"]
    ratios = {r["name"]: round(r["median_step_tokens_per_s"] / base, 3) for r in runs}
    print("ratio to 1proc-1thread (median optimizer step):", ratios)
    out = {
        "benchmark": "ddp_cpu", "command": "python benchmarks/ddp_cpu.py " + " ".join(sys.argv[1:]),
        "preset": "tiny-cpu", "torch": torch.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "cpu_count": os.cpu_count(),
        "load_avg_start": list(load_start), "load_avg_end": list(os.getloadavg()),
        "runs": runs, "ratio_median_step_tokens_per_s": ratios,
    }
    from sinklab.provenance import code_version

    out["code"] = code_version()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ddp_cpu.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {RESULTS / 'ddp_cpu.json'}")


if __name__ == "__main__":
    main()
