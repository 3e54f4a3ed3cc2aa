"""What choosing an attention path costs: ``Attention.path`` (the walk over ``ATTENTION_PATHS``) against one
training step of the attention layer it dispatches.

Usage::

    python benchmarks/attention_dispatch.py [--reps 2000] [--out FILE]

For each operation in ``OPS`` (the sdpa path, the tile path, sdpa with a virtual key), a layer as
``benchmarks/train_throughput.py``'s T = 1024 table builds it (d 128, 4 heads, B 4, T 1024, RoPE): process CPU
microseconds per ``layer.path(ctx)`` call (mean of ``reps`` calls, 1 thread), and CPU milliseconds of the
layer's forward + backward (fastest of 3 after a warm-up); their ratio is the share of a layer's step that
the dispatch takes. ``Attention.forward`` calls ``path`` once per layer and pass.

Prints the table and writes ``benchmarks/results/attention_dispatch.json`` (with the CPU model, commit and
command, and the 1-minute load average when it started).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from sinklab.nn import ModelConfig
from sinklab.nn.attention import Attention, AttnContext
from sinklab.nn.positional import POSITIONAL
from sinklab.provenance import commit_label
from sinklab.train.fingerprint import cpu_model

ROOT = Path(__file__).resolve().parent.parent
OPS = ["softmax", "sigmoid", "sink_token"]  # the sdpa path, the tile path, sdpa with a virtual key


def _cpu(fn, reps: int) -> float:
    t0 = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t0) / reps


def measure(op: str, reps: int, B: int = 4, T: int = 1024) -> dict:
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=1, n_heads=4, d_ff=256, max_seq_len=T, attention=op)
    layer = Attention(cfg, 0)
    positional = POSITIONAL.get(cfg.positional)(cfg)
    ctx = AttnContext(T=T, device=torch.device("cpu"), positional=positional,
                      pos_state=positional.prepare(T, torch.device("cpu")))
    x = torch.randn(B, T, cfg.d_model, requires_grad=True)

    def step():
        layer(x, ctx).sum().backward()

    step()
    step_s = min(_cpu(step, 1) for _ in range(3))
    path_s = _cpu(lambda: layer.path(ctx, None, "cpu"), reps)
    return {"attention": op, "path": layer.path(ctx, None, "cpu"), "path_us": path_s * 1e6,
            "layer_step_ms": step_s * 1e3, "share": path_s / step_s}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "attention_dispatch.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load = os.getloadavg()[0]
    rows = [measure(op, args.reps) for op in OPS]
    print(f"{'attention':<12}{'path':<10}{'path() us':>10}{'layer step ms':>15}{'share':>10}")
    for r in rows:
        print(f"{r['attention']:<12}{r['path']:<10}{r['path_us']:>10.1f}{r['layer_step_ms']:>15.1f}{r['share']:>10.1e}")
    out = {"cpu_model": cpu_model(), "commit": commit_label(), "torch": torch.__version__,
           "load_1min_at_start": load, "command": "python " + " ".join([f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
