"""Benchmark: ``model.attention_backend`` on the CPU, one attention layer, in one process.

Two comparisons, each on the same weights and inputs:

* ``flex`` vs ``reference``, forward only (no grad): ``torch.compile(flex_attention)``'s fused CPU
  kernel against today's path (SDPA) for softmax + RoPE and sink_logit + ALiBi, causal;
* ``compiled`` vs ``reference`` (the eager tile path), forward + backward: sigmoid + ALiBi and
  softpick + RoPE, causal.

Warm-up calls first (the first compiled call compiles: reported as ``compile_s``), then ``--rounds``
rounds alternating the two backends (order flipped each round, so load from other processes hits
both alike); each round times ``--per-round`` calls. Printed and written: the median seconds per
call of each and the ratio ``reference / backend`` (> 1: the backend is faster), plus the largest
output difference. The CPU's FlexAttention has no backward (see :mod:`sinklab.nn.flex`), so flex is
timed forward only; these are CPU numbers, not the GPU kernels' speed.

Usage::

    python benchmarks/attention_backends_cpu.py [--threads 1] [--T 256] [--rounds 5] [--per-round 3] [--out FILE]

Writes ``benchmarks/results/attention_backends_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
import warnings
from pathlib import Path

import torch

from sinklab.nn import ModelConfig
from sinklab.nn.attention import Attention, AttnContext
from sinklab.nn.positional import POSITIONAL

CASES = [  # (attention, positional, backend, with backward)
    ("softmax", "rope", "flex", False),
    ("sink_logit", "alibi", "flex", False),
    ("sigmoid", "alibi", "compiled", True),
    ("softpick", "rope", "compiled", True),
]


def _layer(att, pos, backend, d, H, T):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=d, n_layers=1, n_heads=H, d_ff=2 * d, max_seq_len=T, attention=att,
                      positional=pos, attention_backend=backend)
    layer = Attention(cfg, 0)
    positional = POSITIONAL.get(pos)(cfg)
    return layer, positional


def _call(layer, positional, x, grad):
    T = x.shape[1]
    ctx = AttnContext(T=T, device=x.device, positional=positional, pos_state=positional.prepare(T, x.device))
    if not grad:
        with torch.no_grad():
            return layer(x, ctx)
    xg = x.detach().requires_grad_(True)
    y = layer(xg, ctx)
    y.square().sum().backward()
    return torch.cat([y.detach().flatten(), xg.grad.flatten()])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "attention_backends_cpu.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    x = torch.randn(args.batch, args.T, args.d_model, generator=torch.Generator().manual_seed(1))
    rows = []
    for att, pos, backend, grad in CASES:
        ref, ref_pos = _layer(att, pos, "reference", args.d_model, args.heads, args.T)
        new, new_pos = _layer(att, pos, backend, args.d_model, args.heads, args.T)
        new.load_state_dict(ref.state_dict())
        t0 = time.perf_counter()
        y_new = _call(new, new_pos, x, grad)  # compiles
        compile_s = time.perf_counter() - t0
        y_ref = _call(ref, ref_pos, x, grad)
        for _ in range(2):
            _call(new, new_pos, x, grad), _call(ref, ref_pos, x, grad)
        times = {"reference": [], backend: []}
        for r in range(args.rounds):
            order = [(ref, ref_pos, "reference"), (new, new_pos, backend)]
            for layer, p, name in (order if r % 2 == 0 else order[::-1]):
                t = time.perf_counter()
                for _ in range(args.per_round):
                    _call(layer, p, x, grad)
                times[name].append((time.perf_counter() - t) / args.per_round)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = dict(attention=att, positional=pos, backend=backend, timed="forward+backward" if grad else "forward",
                   compile_s=round(compile_s, 2), s_per_call_reference=med["reference"], s_per_call_backend=med[backend],
                   ratio_reference_over_backend=med["reference"] / med[backend],
                   max_abs_diff=(y_new - y_ref).abs().max().item(), rounds=times)
        rows.append(row)
        print(f"{att:12s} {pos:6s} {backend:9s} {row['timed']:17s} reference {med['reference'] * 1e3:8.2f} ms  "
              f"{backend} {med[backend] * 1e3:8.2f} ms  ratio ref/{backend} {row['ratio_reference_over_backend']:.2f}  "
              f"compile {compile_s:.0f} s  max|diff| {row['max_abs_diff']:.1e}", flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = None
    out = dict(command="python benchmarks/attention_backends_cpu.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        shape=dict(batch=args.batch, T=args.T, d_model=args.d_model, heads=args.heads), threads=args.threads,
        torch=torch.__version__, cpu=platform.processor() or platform.machine(), load_1min=os.getloadavg()[0],
        commit=commit, rows=rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
