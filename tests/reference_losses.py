"""The pinned reference training runs: their configs, how they are trained, and the committed file of
their losses (``tests/data/reference_losses.json``).

Regenerate the file (only when a change of the training numerics is intended, and say so in the
commit message)::

    PYTHONPATH=src python tests/reference_losses.py --update

Without ``--update`` the script trains the runs and prints how far they are from the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

#: the committed losses
REFERENCE_FILE = Path(__file__).parent / "data" / "reference_losses.json"

_BASE = """
[model]
d_model = 32
n_layers = 2
n_heads = 2
d_ff = 64
attention = "softmax"
positional = "rope"
{model_extra}
[data]
source = "synthetic-bigram-backcopy"
synthetic = {{ vocab = 24, n_triggers = 3, alpha = 0.5, n_train_docs = 600, n_val_docs = 64 }}
seq_len = 32
packing = "bos"
[optim]
lr = 1e-2
weight_decay = 0.1
decay = "matrices"
schedule = "cosine"
warmup_steps = 4
min_lr_ratio = 0.1
grad_clip = 1.0
[train]
steps = 24
batch_size = 8
grad_accum = 2
threads = 1
precision = "fp32"
log_every = 1
checkpoint_every = 12
tensorboard = false
{train_extra}
[track]
every = 8
n_probe = 8
probe_len = 32
val_windows = 8
"""

#: name -> TOML of one reference run (24 steps, 2 micro-batches a step, 1 thread, fp32; about 1 s of
#: training each on one core): a causal LM, and a prefix LM with a sliding window (the mask paths)
RUNS: dict[str, str] = {
    "causal": _BASE.format(model_extra="", train_extra=""),
    "prefix_window": _BASE.format(model_extra="sliding_window = 8", train_extra="prefix_len = 4"),
}


def key() -> dict[str, Any]:
    """The machine key recorded beside the losses: ``{"cpu_model", "torch_version", "threads"}``."""
    from sinklab.train.fingerprint import environment

    return {**environment(), "threads": 1}


def train_reference(name: str) -> dict[str, Any]:
    """Train the reference run ``name`` in a temporary folder.

    Returns:
        ``{"losses": [loss of step 1, ...], "val_loss": {step: validation loss}}`` (floats as Python
        writes them, round-trip exact).
    """
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    with tempfile.TemporaryDirectory(prefix="sinklab-reference-") as tmp:
        cfg_path = Path(tmp) / f"{name}.toml"
        cfg_path.write_text(RUNS[name])
        res = loop.train(load_config(cfg_path), Path(tmp) / "run", progress=False)
    return {"losses": [res.losses[s] for s in sorted(res.losses)],
            "val_loss": {str(r["step"]): r["val_loss"] for r in res.history if "val_loss" in r}}


def compute() -> dict[str, Any]:
    """Every reference run, with the machine key."""
    return {"key": key(), "runs": {name: train_reference(name) for name in RUNS}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--update", action="store_true", help=f"rewrite {REFERENCE_FILE}")
    args = ap.parse_args(argv)
    got = compute()
    if args.update:
        REFERENCE_FILE.parent.mkdir(parents=True, exist_ok=True)
        REFERENCE_FILE.write_text(json.dumps(got, indent=1) + "\n")
        print(f"wrote {REFERENCE_FILE}")
        return 0
    ref = json.loads(REFERENCE_FILE.read_text())
    print("recorded key:", ref["key"], "\nthis machine:", got["key"])
    for name, run in got["runs"].items():
        a, b = ref["runs"][name]["losses"], run["losses"]
        worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        print(f"{name}: {sum(x == y for x, y in zip(a, b))}/{len(a)} steps bit-equal, max relative difference {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
