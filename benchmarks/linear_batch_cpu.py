"""Benchmark: how the CPU's matrix-vector products scale from 1 row to 8 rows, float32 vs bfloat16 (issue 34).

The decode step of a 1B LLaMA-shaped model is dominated by its linear layers; ``device_batch.py``'s target
(batch 8 at least 3x the tokens/s of batch 1) needs an 8-row product to cost less than 8/3 of a 1-row one.
This measures exactly that, in **process CPU time on one thread** (``time.process_time``, so other jobs on a
shared machine change it far less than wall time), for the three weight shapes of LLaMA-3.2-1B: an MLP
up/gate projection (8192 x 2048), its down projection (2048 x 8192) and the LM head (128256 x 2048).

Printed and written (``benchmarks/results/linear_batch_cpu.json``): per shape and dtype the ms per product
for 1 and 8 rows and the ratio cost(8) / cost(1); tokens/s of an 8-row decode over a 1-row one can be at most
8 / that ratio (where the linear layers are the whole step), with the load before and after.

    .venv/bin/python benchmarks/linear_batch_cpu.py
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

SHAPES = {"mlp_up (8192 x 2048)": (8192, 2048), "mlp_down (2048 x 8192)": (2048, 8192),
          "lm_head (128256 x 2048)": (128256, 2048)}


def cpu_ms(x: torch.Tensor, w: torch.Tensor, n: int) -> float:
    for _ in range(2):
        torch.nn.functional.linear(x, w)
    best = float("inf")
    for _ in range(3):  # best of three blocks of n products: the least disturbed
        t = time.process_time()
        for _ in range(n):
            torch.nn.functional.linear(x, w)
        best = min(best, (time.process_time() - t) / n * 1000)
    return best


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load_before = os.getloadavg()
    rows = []
    for name, shape in SHAPES.items():
        for dt in (torch.float32, torch.bfloat16):
            w = torch.randn(*shape, dtype=dt)
            n = 4 if shape[0] > 100000 else 16
            ms = {r: cpu_ms(torch.randn(r, shape[1], dtype=dt), w, n) for r in (1, 8)}
            row = {"weight": name, "dtype": str(dt).removeprefix("torch."), "ms_1_row": round(ms[1], 3),
                   "ms_8_rows": round(ms[8], 3), "cost_ratio_8_over_1": round(ms[8] / ms[1], 3),
                   "max_tokens_per_s_ratio": round(8 * ms[1] / ms[8], 2)}
            rows.append(row)
            print(row, flush=True)
    out = Path(__file__).parent / "results" / "linear_batch_cpu.json"
    from sinklab.provenance import code_version

    out.write_text(json.dumps({"benchmark": "linear_batch_cpu", "threads": 1, "time": "process CPU time, best of 3",
                               "rows": rows, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                               "cpus": os.cpu_count(), "torch": torch.__version__, "code": code_version()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
