"""Per-tile cost of every tile-path attention operation, and of the element-wise idioms it is built from.

Usage::

    python benchmarks/tile_ops.py [--C 64] [--Tk 1024] [--reps 20] [--out FILE]

1. **Operations**: :func:`sinklab.nn.attention.tile_forward` and :func:`~sinklab.nn.attention.tile_backward`
   of each operation with an analytic tile gradient, on one tile as ``benchmarks/train_throughput.py``'s
   T = 1024 table makes them (B 4, H 4, d_h 32, ``C`` queries over ``Tk`` keys, causal), q and k float32 and
   v / dO bfloat16 as under bf16 autocast; CPU milliseconds per call (1 thread; the fastest and the mean of
   ``reps`` calls after one warm-up).
2. **Idioms**: one element-wise pass over a (16, C, Tk) float32 tile done several ways: a plain product, a
   ReLU, a sign, a bool tile, products with a bool and a float 0/1 tile, ``masked_fill_`` with a broadcast (C, Tk) bool mask, the same via ``addcmul`` with a float
   mask, ``torch.where``. Why the tile functions avoid boolean tiles.

Prints both tables and writes ``benchmarks/results/tile_ops.json`` (with the CPU model, commit and command).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sinklab.nn.attention import tile_backward, tile_forward
from sinklab.nn.ops import ATTENTION, OpContext
from sinklab.provenance import commit_label
from sinklab.train.fingerprint import cpu_model

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def cpu_ms(fn, reps: int) -> dict:
    """Process CPU milliseconds of ``fn()`` over ``reps`` calls after one warm-up call: the fastest call and the
    mean (they differ where the allocator hands out fresh pages, whose first touch costs page faults)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        times.append((time.process_time() - t) * 1e3)
    return {"min": min(times), "mean": sum(times) / len(times)}


def bench_ops(C: int, Tk: int, reps: int) -> dict:
    B, H, dh = 4, 4, 32
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, C, dh, generator=g), torch.randn(B, H, Tk, dh, generator=g)
    v = torch.randn(B, H, Tk, dh, generator=g).bfloat16()
    dout = torch.randn(B, H, C, dh, generator=g).bfloat16()
    mask = torch.ones(C, Tk, dtype=torch.bool).tril(Tk - C)  # the last query block of a causal T = Tk
    ctx = OpContext(n_heads=H, n_kv_heads=H, head_dim=dh, d_model=H * dh, max_seq_len=Tk)
    out = {}
    for name in ATTENTION.names():
        cls = ATTENTION.get(name)
        if cls.sdpa or not cls.has_tile_grad:
            continue
        op = cls(ctx)
        out[name] = {"forward_ms": cpu_ms(lambda: tile_forward(q, k, v, mask, None, op, 0.17), reps),
                     "backward_ms": cpu_ms(lambda: tile_backward(q, k, v, dout, mask, None, op, 0.17), reps)}
    return out


def bench_idioms(C: int, Tk: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, C, Tk, generator=g)
    y = torch.rand(16, C, Tk, generator=g)
    col = torch.rand(16, C, 1, generator=g)
    mask = torch.ones(C, Tk, dtype=torch.bool).tril(Tk - C)
    maskf = mask.float()
    pos = x > 0
    posf = pos.float()
    idioms = {  # each allocates its result, as the tile functions do
        "y * x (plain binary pass)": lambda: torch.mul(y, x),
        "relu(x)": lambda: torch.relu(x),
        "sign(x)": lambda: torch.sign(x),
        "x > 0 (a bool tile)": lambda: x > 0,
        "y * bool tile": lambda: torch.mul(y, pos),
        "y * float 0/1 tile": lambda: torch.mul(y, posf),
        "(y - col).masked_fill_(~mask, 0), mask (C, Tk)": lambda: (y - col).masked_fill_(~mask, 0.0),
        "addcmul(y, col, float mask (C, Tk), value=-1)": lambda: torch.addcmul(y, col, maskf, value=-1.0),
        "torch.where(bool tile, y, col)": lambda: torch.where(pos, y, col),
    }
    return {name: cpu_ms(fn, reps) for name, fn in idioms.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--C", type=int, default=64, help="queries per tile (64: tile_elems 2^20 at B x H = 16, T = 1024)")
    ap.add_argument("--Tk", type=int, default=1024, help="keys per tile")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS / "tile_ops.json")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    ops, idioms = bench_ops(a.C, a.Tk, a.reps), bench_idioms(a.C, a.Tk, a.reps)
    print(f"tile of B 4 x H 4 x C {a.C} x Tk {a.Tk}, 1 thread, CPU ms per call ({cpu_model()})")
    print(f"{'operation':<20}{'forward min':>12}{'mean':>8}{'backward min':>14}{'mean':>8}")
    for n, r in ops.items():
        f, b = r["forward_ms"], r["backward_ms"]
        print(f"{n:<20}{f['min']:>12.2f}{f['mean']:>8.2f}{b['min']:>14.2f}{b['mean']:>8.2f}")
    base = idioms["y * x (plain binary pass)"]["min"]
    print(f"\none pass over a (16, {a.C}, {a.Tk}) float32 tile, CPU ms: fastest call (x a plain binary pass y * x), mean")
    for n, ms in idioms.items():
        print(f"{n:<52}{ms['min']:>7.3f}{ms['min'] / base:>7.1f}x{ms['mean']:>8.3f}")
    rec = {"command": "python benchmarks/tile_ops.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "commit": commit_label(), "cpu_model": cpu_model(), "torch": torch.__version__, "threads": 1,
           "tile": {"B": 4, "H": 4, "C": a.C, "Tk": a.Tk, "d_h": 32}, "operations_ms": ops, "idioms_ms": idioms}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
