"""What a start of ``train()`` costs, in one process: a first call (cold: imports and first-use costs) and
a second call (warm), wall and CPU seconds, with the load average. Run it once with the code before a
change and once with the code after it (``PYTHONPATH=OTHER/src``), back to back, so both see the same
load; each run appends one JSON line to ``--out``.

    git archive COMMIT src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src python benchmarks/train_start_cost.py --label before
    PYTHONPATH=src python benchmarks/train_start_cost.py --label after

Config: the tests' tiny run (Bigram-Backcopy, 1 layer, d 16, T 16, 8 steps, 1 thread, fp32), or
``--config PRESET`` with ``--set KEY=VALUE`` overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

TINY = """
[model]
d_model = 16
n_layers = 1
n_heads = 2
d_ff = 32
[data]
source = "synthetic-bigram-backcopy"
synthetic = { vocab = 16, n_triggers = 2, n_train_docs = 256, n_val_docs = 64 }
seq_len = 16
packing = "bos"
[optim]
lr = 3e-3
warmup_steps = 2
[train]
steps = 8
batch_size = 4
log_every = 1
checkpoint_every = 2
tensorboard = false
threads = 1
precision = "fp32"
[track]
every = 2
n_probe = 8
probe_len = 16
positions = 3
val_windows = 4
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True, help="what code this is (e.g. before, after)")
    ap.add_argument("--config", default=None, help="a preset or TOML file (default: the tiny run)")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE override")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "train_start_cost.jsonl")
    a = ap.parse_args(argv)

    import sinklab
    from sinklab.runs.config import load_config
    from sinklab.train import loop

    res = {"label": a.label, "sinklab": str(Path(sinklab.__file__).parent), "config": a.config or "tiny",
           "overrides": a.set, "load_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = a.config
        if cfg is None:
            cfg = Path(tmp) / "tiny.toml"
            cfg.write_text(TINY)
        for name in ("first", "second"):
            t, c = time.perf_counter(), time.process_time()
            loop.train(load_config(cfg, a.set), Path(tmp) / name, progress=False)
            res[f"{name}_wall_s"] = round(time.perf_counter() - t, 3)
            res[f"{name}_cpu_s"] = round(time.process_time() - c, 3)
    res["load_after"] = [round(x, 2) for x in os.getloadavg()]
    res["cpu_count"] = os.cpu_count()
    print(json.dumps(res))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "a") as f:
        f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
