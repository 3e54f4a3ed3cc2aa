"""Benchmark: ``train.compile = true`` (``torch.compile`` of the model's forward and backward) against
the eager step on the CPU, in one process.

For each shape (``tiny-cpu``: d 192, 4 layers, T 256, batch 16, bf16 autocast; ``emergence-cpu``:
d 64, 4 layers, T 64, batch 32, fp32; both presets' shapes and precisions) the same SinkLM weights
are trained eager and compiled on the same random batches with AdamW (``benchmarks/train_throughput.py``'s
``Trainee``): warm-up steps first (the compiled model's first step compiles it: reported as
``compile_s``), then rounds of timed steps alternating the two (order flipped each round) so that
load from other processes hits both alike. Printed and written: tokens/s of each, the speed-up
``compiled / eager`` (wall and process CPU time), and the largest loss difference over the steps.

Usage::

    python benchmarks/compile_cpu.py [--threads 1] [--rounds 4] [--per-round 3] [--out FILE]

Writes ``benchmarks/results/compile_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import Trainee, batches, interleave, sink_config  # noqa: E402

from sinklab.nn import SinkLM  # noqa: E402

SHAPES = {
    "tiny-cpu": (dict(vocab_size=8192, d_model=192, n_layers=4, n_heads=4, d_ff=512), 256, 16, "bf16"),
    "emergence-cpu": (dict(vocab_size=64, d_model=64, n_layers=4, n_heads=4, d_ff=256), 64, 32, "fp32"),
}


def bench(name: str, rounds: int, per_round: int, warmup: int) -> dict:
    shape, T, B, precision = SHAPES[name]
    torch.manual_seed(0)
    base = SinkLM(sink_config(T, **shape))
    state = {k: v.clone() for k, v in base.state_dict().items()}
    twin = SinkLM(sink_config(T, **shape))
    twin.load_state_dict(state)
    bf16 = precision == "bf16"
    eager = Trainee("eager", base, bf16=bf16)
    comp = Trainee("compiled", torch.compile(twin), bf16=bf16)
    data = batches(warmup + rounds * per_round, B, T, shape["vocab_size"])
    t0 = time.perf_counter()
    comp.step(*data[0])  # the first compiled step compiles
    compile_s = time.perf_counter() - t0
    eager.step(*data[0])
    interleave([eager, comp], data[1:], warmup=max(0, warmup - 1), rounds=rounds, per_round=per_round)
    tok = B * T
    r = {"shape": shape, "T": T, "batch": B, "precision": precision, "compile_s": round(compile_s, 1),
         "timed_steps": eager.steps,
         "eager_tokens_per_s": round(eager.steps * tok / eager.seconds, 1),
         "compiled_tokens_per_s": round(comp.steps * tok / comp.seconds, 1),
         "speedup_wall": round(eager.seconds / comp.seconds, 3),
         "speedup_cpu": round(eager.cpu_seconds / comp.cpu_seconds, 3),
         "max_loss_diff": max(abs(a - b) for a, b in zip(eager.losses, comp.losses))}
    print(f"{name:<14} {precision}: eager {r['eager_tokens_per_s']:>9,.0f} tok/s, compiled {r['compiled_tokens_per_s']:>9,.0f} "
          f"tok/s: {r['speedup_wall']:.2f}x wall, {r['speedup_cpu']:.2f}x CPU (compile {r['compile_s']} s; "
          f"max |loss difference| {r['max_loss_diff']:.2e} over {len(eager.losses)} steps)", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2, help="steps of each before timing (the first compiles)")
    ap.add_argument("--only", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "compile_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sinklab.provenance import code_version

    t0 = time.perf_counter()
    res = {"command": "python benchmarks/compile_cpu.py " + " ".join(sys.argv[1:]), "threads": args.threads,
           "shapes": {n: bench(n, args.rounds, args.per_round, args.warmup) for n in args.only},
           "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.perf_counter() - t0, 1),
           "machine": platform.processor() or platform.machine(), "torch": torch.__version__, "code": code_version()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
