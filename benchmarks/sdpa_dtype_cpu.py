"""Which precision PyTorch's fused CPU attention trains faster in: float32 or bfloat16, by sequence length.

Usage::

    python benchmarks/sdpa_dtype_cpu.py [--heads 4] [--tokens 4096] [--reps 3] [--out FILE]

Times ``F.scaled_dot_product_attention`` forward + backward (causal, 1 thread, process CPU time, the fastest of
``--reps`` calls after one warm-up) over (B, H, T, D) queries, keys and values with B = tokens / T, for head widths
D 32, 48, 64, 128 and T 128 ... 2048, in float32 and in bfloat16, and prints the ratio bf16 / float32 (below 1:
bfloat16 is faster). :class:`sinklab.nn.AttentionOptions`' ``cpu_fp32_sdpa_backward`` and
``cpu_fp32_sdpa_max_keys`` (a model under bf16 autocast trains its SDPA attention in float32 up to that many keys)
are read off this table. Writes ``benchmarks/results/sdpa_dtype_cpu.json`` (with the CPU model, torch version,
commit, command and the load average at the start and the end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sinklab.provenance import commit_label
from sinklab.train.fingerprint import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def cost(dtype: torch.dtype, B: int, H: int, T: int, D: int, reps: int) -> float:
    """Fastest CPU seconds of one causal SDPA forward + backward over (B, H, T, D) q, k, v in ``dtype``."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()  # warm-up
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
        best = min(best, time.process_time() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=4096, help="B x T of every call")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS / "sdpa_dtype_cpu.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = {"command": " ".join(["python", "benchmarks/sdpa_dtype_cpu.py", *(argv if argv is not None else sys.argv[1:])]),
           "commit": commit_label(), "cpu_model": cpu_model(), "torch": torch.__version__, "threads": 1,
           "load_avg_start": os.getloadavg(), "heads": args.heads, "tokens": args.tokens, "rows": []}
    print(f"{'D':>4}{'T':>6}{'fp32 ms':>10}{'bf16 ms':>10}{'bf16/fp32':>11}")
    for D in (32, 48, 64, 128):
        for T in (128, 256, 512, 1024, 2048):
            B = max(1, args.tokens // T)
            a, b = cost(torch.float32, B, args.heads, T, D, args.reps), cost(torch.bfloat16, B, args.heads, T, D, args.reps)
            res["rows"].append({"D": D, "T": T, "B": B, "fp32_s": a, "bf16_s": b, "bf16_over_fp32": b / a})
            print(f"{D:>4}{T:>6}{a * 1e3:>10.1f}{b * 1e3:>10.1f}{b / a:>11.2f}")
    res["load_avg_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
