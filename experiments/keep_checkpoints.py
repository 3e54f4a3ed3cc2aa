"""Train a run with its intermediate checkpoints kept, for `sinklab analyze depth` over training (issue 24, item 5).

`sinklab train` keeps one checkpoint.pt, replaced every train.checkpoint_every steps, and final/: no history.
This trains CONFIG into OUT in segments (sinklab.train.loop.train with stop_after, then resume, which
continues with the same losses), copying checkpoint.pt to OUT/checkpoints/step_NNNNNN.pt after each
segment; the last segment finishes the run (final/, summary.json). The run is the uninterrupted one:
compare OUT/summary.json with the run you copied the config from.

    python experiments/keep_checkpoints.py CONFIG OUT STEP[,STEP...] [--threads N]
e.g. (after sinklab.sweep.store.unpack('results/attention_operation', 'runs/ao'))
    python experiments/keep_checkpoints.py \
        runs/ao/softmax/seed100/config.toml runs/softmax_seed100_kept \
        50,100,150,200,300,400,600,800,1000 --threads 1
then
    sinklab analyze depth --model runs/softmax_seed100_kept --num-samples 32 --out results/analyze_learned/depth
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from sinklab.train import loop
from sinklab.runs.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("out", type=Path)
    ap.add_argument("steps", help="comma-separated steps after which the checkpoint is kept")
    ap.add_argument("--threads", type=int, default=None, help="sets train.threads (as the run was trained)")
    a = ap.parse_args()
    cfg = load_config(a.config, [f"train.threads={a.threads}"] if a.threads else [])
    keep = sorted({int(s) for s in a.steps.split(",") if s.strip()})
    if not keep or keep[0] < 1 or keep[-1] > cfg.train.steps:
        raise SystemExit(f"steps must lie in [1, {cfg.train.steps}], got {a.steps}")
    if keep[-1] != cfg.train.steps:
        keep.append(cfg.train.steps)
    kept = a.out / "checkpoints"
    t0 = time.perf_counter()
    for i, step in enumerate(keep):
        resume = (a.out / "checkpoint.pt").exists()
        loop.train(cfg, a.out, progress=False, stop_after=step, resume=resume)
        kept.mkdir(parents=True, exist_ok=True)
        shutil.copy(a.out / "checkpoint.pt", kept / f"step_{step:06d}.pt")
        print(f"step {step}: kept {kept / f'step_{step:06d}.pt'} ({time.perf_counter() - t0:.0f} s)", flush=True)
    s = json.loads((a.out / "summary.json").read_text())
    print(f"done: val loss {s['final']['val_loss']}, Sink_1 {s['final']['sink_rate'][0]}%, "
          f"commit {s['code']['commit']}, wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
