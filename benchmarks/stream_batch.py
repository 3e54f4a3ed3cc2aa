"""Benchmark: the perplexity task's streams batched (the default) against one at a time (``--stream-batch 1``).

Runs ``sinklab stream perplexity`` twice per repetition in subprocesses, the same command with and without
``--stream-batch 1``, alternating the order between repetitions (the machine is shared: a load change
then hits both alike), and records for each run the process's wall time, the evaluation's own ``wall_s``
(from ``stream.json``: without loading the model) and the load average (``os.getloadavg()``) before and
after. Then checks that the two give every stream the same figures: the largest absolute difference over
streams and configurations of the per-stream NLL (log of the stream's perplexity, nats) and KL (nats), and
whether every top-1 agreement is equal. Default: SmolLM2-135M (float32, CPU), ``--corpus sotu,austen
--tokens 256 --streams 4 --policy sinks,window --budget 64 --no-recompute``.

Results: ``benchmarks/results/stream_batch.json`` (commands, times, loads, differences, torch threads).

Usage::

    .venv/bin/python benchmarks/stream_batch.py                  # 1 repetition of each
    .venv/bin/python benchmarks/stream_batch.py --reps 2 --threads 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK = ["--model", "smollm2-135m", "--corpus", "sotu,austen", "--tokens", "256", "--streams", "4",
        "--policy", "sinks,window", "--budget", "64", "--no-recompute"]


def run(cmd: list[str], out: Path) -> dict:
    """One ``sinklab stream perplexity`` run into ``out``: its command, wall times, loads and stream.json."""
    argv = [sys.executable, "-m", "sinklab", "stream", "perplexity", *cmd, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    data = json.loads((out / "stream.json").read_text())
    return {"command": "sinklab stream perplexity " + shlex.join(cmd), "process_wall_s": wall,
            "evaluation_wall_s": data["wall_s"], "stream_batch": data.get("stream_batch"),
            "torch_threads": data.get("torch_threads"), "loadavg_before": load0, "loadavg_after": os.getloadavg(),
            "data": data}


def differences(a: dict, b: dict) -> dict:
    """Largest per-stream differences between two multi-stream results of the same command."""
    d_nll = d_kl = 0.0
    top1_equal = True
    n = 0
    for sa, sb in zip(a["streams"], b["streams"], strict=True):
        assert sa["info"] == sb["info"]
        for ca, cb in zip(sa["configs"], sb["configs"], strict=True):
            assert ca["name"] == cb["name"]
            d_nll = max(d_nll, abs(math.log(ca["ppl"]) - math.log(cb["ppl"])))
            if ca["kl"] is not None:
                d_kl = max(d_kl, abs(ca["kl"] - cb["kl"]))
            top1_equal &= ca["top1"] == cb["top1"]
            n += 1
    return {"max_abs_nll_diff": d_nll, "max_abs_kl_diff": d_kl, "top1_all_equal": top1_equal,
            "stream_configs_compared": n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=1, help="repetitions of the pair (order alternates)")
    ap.add_argument("--threads", type=int, default=None, help="--threads of both runs (default: torch's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "stream_batch.json"))
    args = ap.parse_args()
    task = TASK + (["--threads", str(args.threads)] if args.threads else [])
    cells = {"batched": task, "one_at_a_time": task + ["--stream-batch", "1"]}
    runs: dict[str, list[dict]] = {k: [] for k in cells}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = list(cells) if rep % 2 == 0 else list(cells)[::-1]
            for name in order:
                r = run(cells[name], Path(tmp) / f"{name}-{rep}")
                runs[name].append(r)
                print(f"{name:14s} rep {rep}: evaluation {r['evaluation_wall_s']:.2f} s, process {r['process_wall_s']:.2f} s, "
                      f"load {r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f}", flush=True)
    diff = differences(runs["batched"][0]["data"], runs["one_at_a_time"][0]["data"])
    summary = {k: {"evaluation_wall_s": [r["evaluation_wall_s"] for r in v],
                   "process_wall_s": [r["process_wall_s"] for r in v]} for k, v in runs.items()}
    ratio = (min(summary["one_at_a_time"]["evaluation_wall_s"]) / min(summary["batched"]["evaluation_wall_s"]))
    out = {"what": __doc__.split("\n")[0], "machine": platform.processor() or platform.machine(),
           "cpus": os.cpu_count(), "python": platform.python_version(),
           "runs": {k: [{kk: vv for kk, vv in r.items() if kk != "data"} for r in v] for k, v in runs.items()},
           "summary": summary, "speedup_evaluation_min_over_min": ratio, "per_stream_equality": diff,
           "per_stream_figures": {k: [{"info": s["info"], "configs": [{f: c[f] for f in ("name", "ppl", "kl", "top1")}
                                                                     for c in s["configs"]]}
                                      for s in v[0]["data"]["streams"]] for k, v in runs.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"speedup (evaluation, best of each): {ratio:.2f}x; per-stream max |dNLL| {diff['max_abs_nll_diff']:.2e}, "
          f"max |dKL| {diff['max_abs_kl_diff']:.2e}, top-1 equal: {diff['top1_all_equal']} -> {args.out}")


if __name__ == "__main__":
    main()
