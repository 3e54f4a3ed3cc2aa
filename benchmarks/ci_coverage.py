"""How often sinklab's sink-rate interval (a percentile bootstrap over samples) contains the true rate, by N.

Usage::

    python benchmarks/ci_coverage.py [--reps 400] [--out FILE]

Draws synthetic attention masses (N samples, L = 6 layers, H = 9 heads, one position) in which every
(sample, layer, head) cell is a sink with probability p (independent cells), or with a per-sample probability drawn
from Beta(4 p / (1 - p), 4), whose mean is p (``varying``: samples differ, as windows of real text do), calls
:func:`sinklab.metrics.bootstrap_sink_rate_ci` (1000 resamples, level 0.95, the function ``sinklab measure`` uses)
and counts how often the interval contains 100 p, and how often it has zero width. Writes
``benchmarks/results/ci_coverage.json`` (command, commit, seed, the table).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from sinklab.metrics.sink import bootstrap_sink_rate_ci
from sinklab.provenance import commit_label

RESULTS = Path(__file__).resolve().parent / "results"
L, H = 6, 9


def coverage(N: int, p: float, varying: bool, reps: int, rng: np.random.Generator) -> tuple[float, float]:
    """(share of intervals containing 100 p, share of zero-width intervals) over ``reps`` synthetic probes."""
    hit = zero = 0
    for r in range(reps):
        q = rng.beta(4 * p / (1 - p), 4, size=N) if varying else np.full(N, p)  # per-sample sink probability
        cells = rng.random((N, L, H, 1)) < q[:, None, None, None]
        mass = torch.as_tensor(np.where(cells, 0.9, 0.0))  # mass 0.9 on a sink cell, 0 elsewhere (eps 0.3)
        lo, hi = bootstrap_sink_rate_ci(mass, 0.3, seed=r)[0].tolist()
        hit += lo <= 100 * p <= hi
        zero += lo == hi
    return hit / reps, zero / reps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--out", default=str(RESULTS / "ci_coverage.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    print(f"{'samples':<9}{'p':>6}{'N':>5}{'coverage':>10}{'zero width':>12}")
    for varying in (False, True):
        for p in (0.05, 0.5, 0.8):
            for N in (2, 3, 5, 8, 20, 50, 100):
                cov, zero = coverage(N, p, varying, args.reps, rng)
                rows.append({"varying": varying, "p": p, "N": N, "coverage": cov, "zero_width": zero})
                print(f"{'varying' if varying else 'alike':<9}{p:>6}{N:>5}{cov:>10.3f}{zero:>12.3f}")
    res = {"command": " ".join(["python", "benchmarks/ci_coverage.py", *(argv if argv is not None else sys.argv[1:])]),
           "commit": commit_label(), "reps": args.reps, "level": 0.95, "n_boot": 1000, "L": L, "H": H, "seed": 0,
           "rows": rows}
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
