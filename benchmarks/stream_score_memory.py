"""Peak memory of the streaming scorer (NLL, KL and top-1 against the full cache) at a large vocabulary.

Usage::

    python benchmarks/stream_score_memory.py [--rows 1024] [--vocab 262144] [--out FILE]

Scores ``rows`` positions of random float32 logits against random full-cache logits with
``sinklab.streaming.harness._score_rows`` twice, each in a fresh process: in one block of all rows (as before
``SCORE_BLOCK_ELEMS``) and in the default blocks of rows. Reports each process's peak resident memory above its
inputs (``ru_maxrss``, which Linux gives in KiB, reported in GiB = 2^30 bytes) and their ratio; writes ``benchmarks/results/stream_score_memory.json``. 1024 x 262,144
is one 1024-token stream of Gemma-3's vocabulary scored in one parallel evaluation.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

CHILD = """
import resource, sys, torch
from sinklab.streaming import harness
rows, vocab, one = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "one"
if one:
    harness.SCORE_BLOCK_ELEMS = 1 << 62
g = torch.Generator().manual_seed(0)
logits = torch.randn(rows, vocab, generator=g); ref = torch.randn(rows, vocab, generator=g)
targets = torch.randint(0, vocab, (rows,), generator=g)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
harness._score_rows(logits, targets, ref)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 2**20)  # KiB -> GiB
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "stream_score_memory.json")
    a = ap.parse_args()
    from sinklab.streaming.harness import SCORE_BLOCK_ELEMS

    gib = {}
    for mode in ("one", "blocks"):
        out = subprocess.run([sys.executable, "-c", CHILD, str(a.rows), str(a.vocab), mode], check=True,
                             capture_output=True, text=True).stdout
        gib[mode] = float(out.strip().splitlines()[-1])
        print(f"{mode:>6}: {gib[mode]:.2f} GiB above the inputs")
    print(f"ratio one block / blocks: {gib['one'] / gib['blocks']:.1f}x")
    res = {"rows": a.rows, "vocab": a.vocab, "score_block_elems": SCORE_BLOCK_ELEMS,
           "peak_gib_above_inputs_one_block": gib["one"], "peak_gib_above_inputs_blocks": gib["blocks"],
           "ratio": gib["one"] / gib["blocks"], "machine": platform.processor() or platform.machine(),
           "command": "python benchmarks/stream_score_memory.py " + " ".join(sys.argv[1:])}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
