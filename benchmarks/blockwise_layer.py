"""Benchmark: one attention layer of the blockwise collector, by part, at SmolLM2-135M's shapes.

Random q, k, v (seeded) of one sequence with 9 query heads, 3 key/value heads, head size 64
(SmolLM2-135M), causal, at each T. In one process, each timed as the minimum CPU time of
``--repeats`` interleaved runs (so the ratios share the machine's load; the millisecond-scale
GEMMs and medians are timed over 20 and 5 calls per run):

* ``sdpa``       -- ``F.scaled_dot_product_attention`` as the plain forward calls it;
* ``tiles``      -- ``blockwise_attention(output="tiles")``: output and column sums from one
                    score tile per block of queries (the CPU default);
* ``fused``      -- ``blockwise_attention(output="fused")``: the fused CPU kernel's output and
                    LSE, then one more Q K^T for the column sums;
* ``gemm_fp32`` / ``gemm_bf16`` -- one batched Q K^T GEMM of a tile's shape (3 x (96 x 64) x
                    (64 x T)) in float32 and in bfloat16 (GFLOP/s reported);
* ``median_torch`` / ``median_radix`` -- the recorder's median |h| over T x 576 entries:
                    ``torch.median`` against :func:`sinklab.capture.recorder.median_nonnegative`.

The effective GEMM rate of ``sdpa`` counts its two products (Q K^T and P V over the causal half).

Usage::

    .venv/bin/python benchmarks/blockwise_layer.py --threads 1 --seq-lens 4096 8192 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time


def measure(seq_len: int, repeats: int) -> dict:
    """Minimum CPU seconds of each part at one T, and the derived rates and ratios."""
    import torch
    import torch.nn.functional as F

    from sinklab.capture.blockwise import blockwise_attention
    from sinklab.capture.recorder import median_nonnegative

    B, Hq, Hkv, D, d_model = 1, 9, 3, 64, 576
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, Hq, seq_len, D, generator=g) * 2
    k = torch.randn(B, Hkv, seq_len, D, generator=g) * 2
    v = torch.randn(B, Hkv, seq_len, D, generator=g)
    a = torch.randn(1, seq_len * d_model, generator=g).abs()
    qa, kb = torch.randn(3, 96, 64, generator=g), torch.randn(3, seq_len, 64, generator=g)
    qa16, kb16 = qa.bfloat16(), kb.bfloat16()

    inner = {"gemm_fp32": 20, "gemm_bf16": 20, "median_torch": 5, "median_radix": 5}  # calls per timed run
    parts = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.125),
        "tiles": lambda: blockwise_attention(q, k, v, scaling=0.125, attention_mask=None, is_causal=True,
                                             output="tiles"),
        "fused": lambda: blockwise_attention(q, k, v, scaling=0.125, attention_mask=None, is_causal=True,
                                             output="fused"),
        "gemm_fp32": lambda: torch.bmm(qa, kb.transpose(1, 2)),
        "gemm_bf16": lambda: torch.bmm(qa16, kb16.transpose(1, 2)),
        "median_torch": lambda: a.median(dim=1).values,
        "median_radix": lambda: median_nonnegative(a),
    }
    best = {name: float("inf") for name in parts}
    for name, f in parts.items():  # warm-up
        f()
    for _ in range(repeats):
        for name, f in parts.items():
            c0 = time.process_time()
            for _ in range(inner.get(name, 1)):
                f()
            best[name] = min(best[name], (time.process_time() - c0) / inner.get(name, 1))
    gemm_flops = 2 * 3 * 96 * 64 * seq_len
    sdpa_flops = 2 * 2 * Hq * D * seq_len * (seq_len + 1) / 2  # Q K^T and P V over the causal half
    return {
        "T": seq_len,
        "cpu_seconds": best,
        "tiles_over_sdpa": best["tiles"] / best["sdpa"],
        "fused_over_sdpa": best["fused"] / best["sdpa"],
        "gemm_fp32_gflops": gemm_flops / best["gemm_fp32"] / 1e9,
        "gemm_bf16_gflops": gemm_flops / best["gemm_bf16"] / 1e9,
        "sdpa_effective_gflops": sdpa_flops / best["sdpa"] / 1e9,
        "median_torch_over_radix": best["median_torch"] / best["median_radix"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    start = os.getloadavg()
    for T in args.seq_lens:
        r = measure(T, args.repeats)
        rows.append(r)
        t = r["cpu_seconds"]
        print(f"T={T}: sdpa {t['sdpa'] * 1e3:.0f} ms, tiles {t['tiles'] * 1e3:.0f} ms ({r['tiles_over_sdpa']:.2f}x), "
              f"fused {t['fused'] * 1e3:.0f} ms ({r['fused_over_sdpa']:.2f}x); GEMM fp32 {r['gemm_fp32_gflops']:.0f}, "
              f"bf16 {r['gemm_bf16_gflops']:.0f}, SDPA effective {r['sdpa_effective_gflops']:.0f} GFLOP/s; median "
              f"torch {t['median_torch'] * 1e3:.1f} ms vs radix {t['median_radix'] * 1e3:.1f} ms", flush=True)
    meta = {"load_average_start": start, "load_average_end": os.getloadavg(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            "command": "python benchmarks/blockwise_layer.py " + " ".join(
                f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                for k, v in vars(args).items() if v is not None)}
    print(f"load average: {meta['load_average_start']} -> {meta['load_average_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
