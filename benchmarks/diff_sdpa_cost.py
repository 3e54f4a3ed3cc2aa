"""Why differential attention trains at about half softmax's speed on CPU: the cost of its two maps in SDPA.

Usage::

    python benchmarks/diff_sdpa_cost.py [--T 1024] [--B 4] [--reps 5] [--out FILE]

Times ``F.scaled_dot_product_attention`` forward + backward (causal, float32, 1 thread, process CPU time) at
the shapes of ``benchmarks/train_throughput.py``'s operation table (d_model 128, 4 heads of d_h 32, 4096
tokens per step) for softmax and for the ways differential attention (Ye et al. 2024) can call it:

* ``softmax``: H = 4 heads, q/k/v width 32 (the reference).
* ``diff padded`` (what :class:`sinklab.nn.Attention` does): 2H = 8 maps, q/k halves (16) zero-padded to
  the value's width 32 so that SDPA keeps its fused kernel.
* ``diff unpadded``: 8 maps, q/k width 16, v width 32 (SDPA falls back to its unfused math path).
* ``diff four calls``: the value split in halves too, 16 maps of width 16 (the paper's flash-attention code).

Prints each time and its ratio to softmax, and writes ``benchmarks/results/diff_sdpa_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sinklab.train.fingerprint import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def cost(B: int, T: int, maps: int, dqk: int, dv: int, reps: int) -> float:
    """CPU seconds of one SDPA forward + backward over (B, maps, T, dqk) queries / keys and (B, maps, T, dv) values."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, maps, T, dqk, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(B, maps, T, dv, generator=g).requires_grad_()
    for _ in range(2):  # warm-up
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    t = time.process_time()
    for _ in range(reps):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    return (time.process_time() - t) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "diff_sdpa_cost.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = {"softmax": (4, 32, 32), "diff padded": (8, 32, 32), "diff unpadded": (8, 16, 32),
            "diff four calls": (16, 16, 16)}
    out = {}
    for name, (maps, dqk, dv) in rows.items():
        out[name] = {"maps": maps, "qk_width": dqk, "v_width": dv, "cpu_s": cost(a.B, a.T, maps, dqk, dv, a.reps)}
    ref = out["softmax"]["cpu_s"]
    print(f"SDPA forward + backward, causal, B={a.B}, T={a.T}, float32, 1 thread (CPU seconds per call)")
    for name, r in out.items():
        r["vs_softmax"] = r["cpu_s"] / ref
        print(f"{name:16s} {r['maps']:3d} maps  q/k {r['qk_width']:3d}  v {r['v_width']:3d}  {r['cpu_s']:.4f} s  "
              f"{r['vs_softmax']:.2f}x softmax")
    rec = {"command": "python benchmarks/diff_sdpa_cost.py " + f"--T {a.T} --B {a.B} --reps {a.reps}",
           "torch": torch.__version__, "machine": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
           "load_1min": __import__("os").getloadavg()[0], "rows": out}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
