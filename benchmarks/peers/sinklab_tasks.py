"""sinklab's cache policies on the peers' long-context task items (issue 35, item 6): the same items as
``kvpress_tasks.py`` (read from ``task_items.json``, written by ``make_task_items.py``), through
:func:`sinklab.streaming.tasks.evaluate_items` (greedy decoding, the item's ``answer_tokens``, stop after
EOS), with the policies matching kvpress's presses at the same budget: ``sinks`` (4 sinks),
``snapkv`` and ``pyramidkv`` (observation window 64 and kernel 5, kvpress's defaults; sinklab's own
default window would be 32), ``knorm``, and the full cache.

Protocols (``protocol``):
  one-call      the whole prompt (context + question) in one call, cut to the budget after it: the
                presses' protocol (``chunk`` = the prompt's length, ``query_aware=True``).
  question-after  the context in one call (cut to the budget), then the question in its own call
                (sinklab's ``query_aware=False`` in ``evaluate_items``: the question's call is cut back to
                the budget too, so a prefill-time policy scores once more, with the question's queries).
  chunked       sinklab's default: the prompt in chunks of the window (``budget - n_sink``; 256 for the
                policies without sinks), the policy applied after each chunk (``query_aware=True``).

Usage: PYTHONPATH=src python benchmarks/peers/sinklab_tasks.py [--budget 256]
       -> benchmarks/results/peers/tasks_sinklab.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import torch

from common import RESULTS

POLICIES = ["full", "sinks", "snapkv", "knorm", "pyramidkv"]
PROTOCOLS = ["one-call", "question-after", "chunked"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", default=str(RESULTS / "task_items.json"))
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--policies", nargs="+", default=POLICIES, choices=POLICIES)
    ap.add_argument("--protocols", nargs="+", default=PROTOCOLS, choices=PROTOCOLS)
    ap.add_argument("--observation-window", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "tasks_sinklab.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import pandas as pd

    from sinklab.models import load_model
    from sinklab.provenance import code_version
    from sinklab.streaming import SinkCache
    from sinklab.streaming.policies import POLICIES as POLICIES_
    from sinklab.streaming.tasks import TaskItem, evaluate_items

    spec = json.loads(open(a.items).read())
    loaded = load_model(spec["model"], attn_implementation="sdpa")
    model, tok = loaded.model, loaded.tokenizer
    assert tok.eos_token_id == spec["eos_token_id"], (tok.eos_token_id, spec["eos_token_id"])
    items = [TaskItem(task=d["task"], index=d["index"], length=d["length"], depth=d["depth"],
                      context_ids=d["context_ids"], question_ids=d["question_ids"], answers=d["answers"],
                      seed=d["seed"], at=d["at"], question=d["question"], meta=d["meta"]) for d in spec["items"]]
    n_prompt = {it.n_tokens for it in items}
    frames = []
    for protocol in a.protocols:
        for policy in a.policies:
            if policy == "full" and protocol != a.protocols[0]:
                continue
            if policy == "full":
                factory = None
            else:
                options = ({"observation_window": a.observation_window} if policy in ("snapkv", "pyramidkv")
                           else None)

                def factory(m, policy=policy, options=options):
                    return SinkCache(m, 4 if policy == "sinks" else 0, policy=policy, budget=a.budget,
                                     policy_options=options)

                factory.policy, factory.budget = policy, a.budget
                factory.name = f"{policy}@{a.budget}"
                factory.needs_weights = POLICIES_.get(policy).needs_scores  # eager attention for its weights
            if protocol == "chunked":
                chunk = None  # the cache's window
            else:
                chunk = max(n_prompt)  # the whole prompt (or the whole context) in one call
            t0 = time.perf_counter()
            df = evaluate_items(model, tok, items, factory, query_aware=protocol != "question-after", chunk=chunk)
            df["protocol"] = protocol
            frames.append(df)
            print(f"{policy} {protocol}: {int(df['correct'].sum())}/{len(df)} correct, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    res = pd.concat(frames, ignore_index=True)
    out = {"command": "PYTHONPATH=src python benchmarks/peers/sinklab_tasks.py " + " ".join(map(shlex.quote, sys.argv[1:])),
           "items_file": a.items, "budget": a.budget, "observation_window": a.observation_window,
           "code": code_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "rows": json.loads(res.to_json(orient="records"))}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(a.out, len(res), "rows")


if __name__ == "__main__":
    main()
