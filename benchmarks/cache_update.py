"""CPU time of SinkCache's decode-step update alone (no model): 30 layers of 3 KV heads x head_dim 64
(SmolLM2-135M's shapes), 4 sinks + 256, a 1024-token prefill, then single-token steps fed at cache
positions (p0 = 260, as the peers' protocol and ``sinklab stream`` do). Each ``--src`` (a sinklab src/
folder, e.g. ``git archive COMMIT src | tar -x -C DIR``) runs in its own process, alternated ``--rounds``
times in one run; prints the ms per step and the ratio of each to the first.

    PYTHONPATH=src .venv/bin/python benchmarks/cache_update.py --src /tmp/before/src src
    -> benchmarks/results/cache_update.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORKER = r'''
import json, time, torch
torch.set_num_threads(1)
from sinklab.streaming import SinkCache  # noqa: F401  (the package as a user imports it)
from sinklab.streaming import cache as C
from sinklab.streaming.rope import KeyRotation
from sinklab.streaming.policies import make_policy
inv = 1.0 / (100000 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
rot = KeyRotation(inv)
layers = [C.SinkCacheLayer(4, 256, rot, policy=make_policy("sinks", 260, 4)) for _ in range(30)]
if hasattr(C, "_StepMemo"):  # what SinkCache does for its layers
    memo = C._StepMemo()
    for l in layers:
        l._memo = memo
g = torch.Generator().manual_seed(0)
k = torch.randn(1, 3, 1024, 64, generator=g)
for l in layers:
    l.update(k, k, position_ids=torch.arange(1024)[None])
xs = torch.randn(400, 1, 3, 1, 64, generator=g)
def step(i):
    pid = torch.tensor([[260]])
    for l in layers:
        l.update(xs[i], xs[i], position_ids=pid)
for i in range(20):
    step(i)
c0 = time.process_time()
for i in range(20, 220):
    step(i)
print(json.dumps({"cpu_ms_per_step": 1000 * (time.process_time() - c0) / 200}))
'''


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", nargs="+", default=["src"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "cache_update.json"))
    a = ap.parse_args()
    res = {s: [] for s in a.src}
    for r in range(a.rounds):
        for s in (a.src if r % 2 == 0 else a.src[::-1]):
            env = {**os.environ, "PYTHONPATH": str(Path(s).resolve()), "OMP_NUM_THREADS": "1"}
            out = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True)
            res[s].append(json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms_per_step"])
    first = statistics.median(res[a.src[0]])
    summary = {s: {"cpu_ms_per_step_rounds": v, "median": statistics.median(v), "ratio_to_first": statistics.median(v) / first}
               for s, v in res.items()}
    for s, v in summary.items():
        print(f"{s}: {v['median']:.2f} ms CPU per step (30 layers), {v['ratio_to_first']:.3f} x {a.src[0]}")
    Path(a.out).write_text(json.dumps({"what": "CPU ms of 30 SinkCacheLayer.update calls per decode step (4 + 256, "
                                       "cache positions), 200 steps after 20 warm-up, one process per src and round",
                                       "load_average": list(os.getloadavg()), "time": time.time(), "results": summary},
                                      indent=1) + "\n")


if __name__ == "__main__":
    main()
