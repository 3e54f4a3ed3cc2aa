"""torchrun worker of tests/test_train_distributed.py: ``sinklab train`` with every collective recorded.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist_record_worker.py PLAN

PLAN is a JSON file: a list of runs, each ``{"config": CONFIG, "out": OUT, "records": RECORDS, "sgd": bool,
"ragged": bool}``, trained one after the other in the same processes and one process group, which the
worker starts (one launch serves several runs, since every launch costs two Python + torch starts). Each run trains the run config file CONFIG into OUT (as ``sinklab train CONFIG --out
OUT`` does) with each public ``torch.distributed`` collective wrapped so that every call is recorded: the op,
the module that called it, the device, dtype and size of its tensor and where in the loop it was made
(``step``: 1-based optimizer step, ``phase``: "step" between the start of the step and the end of
``optimizer.step()``, "between" otherwise). ``sgd``: plain SGD (no momentum, no weight decay) at
``optim.lr`` replaces AdamW, so a wrong gradient scale shows in the parameters. ``ragged``: the
training samples' targets masked by :func:`ragged` (the ranks of a micro-batch then count different
numbers of targets, so their loss weights differ from 1). Rank r writes the run's records to
RECORDS/rank{r}.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from sinklab.train import distributed, loop
from sinklab.runs.config import load_config

#: the collectives of torch.distributed that are recorded
OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
       "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "barrier", "all_gather_object",
       "broadcast_object_list", "_broadcast_coalesced")

RECORDS: list[dict] = []
WHERE = {"step": 0, "phase": "between"}


def _first_tensor(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0]
    return None


def _recorded(name, fn):
    def call(*args, **kwargs):
        t = _first_tensor(args, kwargs)
        RECORDS.append({"op": name, "caller": sys._getframe(1).f_globals.get("__name__", "?"), **WHERE,
                        "device": None if t is None else str(t.device),
                        "dtype": None if t is None else str(t.dtype).removeprefix("torch."),
                        "numel": None if t is None else t.numel()})
        return fn(*args, **kwargs)
    return call


def ragged_mask(g: int) -> int:
    """Leading targets masked in global training sample ``g`` under ``ragged``: (5 g) mod 13 (0..12 of T 16)."""
    return (5 * g) % 13


def ragged(samples):
    """``PackedData.samples`` with the first :func:`ragged_mask` (g) targets of sample g set to -100:
    documents of unequal length as the loss sees them (a pure function of the global sample index,
    so one process and every rank mask the same targets)."""
    from sinklab.data.packing import IGNORE_INDEX

    def masked(self, start, n, *, prefix_len=0):
        x, y = samples(self, start, n, prefix_len=prefix_len)
        for i in range(n):
            y[i, : ragged_mask(start + i)] = IGNORE_INDEX
        return x, y
    return masked


def sgd(model, cfg, device):
    """Plain SGD at ``optim.lr`` (no momentum, no weight decay): the update is lr x the gradient."""
    return torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=0.0, weight_decay=0.0)


def _marking(build):
    """``build`` (the loop's optimizer builder) whose optimizer marks the end of each step."""
    def build_and_mark(model, cfg, device):
        opt = build(model, cfg, device)
        step = opt.step

        def step_and_mark(*a, **k):
            out = step(*a, **k)
            WHERE["phase"] = "between"
            return out
        opt.step = step_and_mark
        return opt
    return build_and_mark


def main() -> None:
    from sinklab.data.packing import PackedData

    plan = json.loads(Path(sys.argv[1]).read_text())
    for name in OPS:
        if hasattr(dist, name):
            setattr(dist, name, _recorded(name, getattr(dist, name)))
    fault = distributed.maybe_fault

    def step_start(d, step):  # the loop calls this as it starts each 1-based step
        WHERE.update(step=step, phase="step")
        fault(d, step)
    distributed.maybe_fault = step_start
    build, samples = loop.build_optimizer, PackedData.samples
    # one process group for every run (each ``loop.train`` joins it and leaves it standing, as it does under any
    # group its caller started): a group destroyed and started again in the same processes could hang in gloo
    dist.init_process_group("gloo")
    for run in plan:
        RECORDS.clear()
        WHERE.update(step=0, phase="between")
        loop.build_optimizer = _marking(sgd if run.get("sgd") else build)
        PackedData.samples = ragged(samples) if run.get("ragged") else samples
        loop.train(load_config(run["config"]), Path(run["out"]), progress=False)
        records = Path(run["records"])
        records.mkdir(parents=True, exist_ok=True)
        (records / f"rank{os.environ['RANK']}.json").write_text(json.dumps(RECORDS))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
