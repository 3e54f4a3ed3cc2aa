"""Needle in a haystack (sinklab.streaming.tasks) on a zoo model: the full cache (the ceiling) against
cache policies at a budget, per length x depth, with Wilson 95% intervals and a heat-map.

    python experiments/needle_smoke.py --out results/compression/needle_smoke      # SmolLM2-135M, pg-essays
    python experiments/needle_smoke.py --combine DIR1 DIR2 ... --out DIR            # parts run side by side, joined

Writes items.csv, accuracy.csv, heatmap.png and tasks.json (the command, model, corpus, code version;
with --combine the parts' tasks.json under "parts") into --out (:func:`sinklab.streaming.tasks.write_task_outputs`).
Items are drawn per (task, length, depth, index), so parts that split the lengths or the configurations
hold the same items as one run of them all.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time

import pandas as pd
import torch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="pg-essays")
    ap.add_argument("--tasks", nargs="+", default=["needle"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048])
    ap.add_argument("--depths", nargs="+", type=float, default=[0.0, 0.5, 1.0])
    ap.add_argument("-n", "--num-items", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", nargs="*", default=["sinks"], help="none given: the full cache only")
    ap.add_argument("--budget", nargs="+", type=int, default=[256])
    ap.add_argument("--kv-bits", nargs="+", type=int, default=[16])
    ap.add_argument("--no-full", action="store_true", help="leave out the full cache (the ceiling)")
    ap.add_argument("--query-agnostic", action="store_true", help="feed the question after the context (query_aware=False)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--combine", nargs="+", default=None, help="join the items.csv of these run folders instead")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    command = "python experiments/needle_smoke.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    if args.combine:
        return combine(args.combine, args.out, command)

    from sinklab.models import load_model
    from sinklab.provenance import code_version
    from sinklab.streaming.tasks import CacheFactory, evaluate_items, make_items, write_task_outputs
    from sinklab.zoo import load_corpus

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    corpus = load_corpus(args.corpus)
    items = make_items(args.tasks, tok, corpus.documents, lengths=args.lengths, depths=args.depths, n=args.num_items,
                       seed=args.seed, corpus_name=args.corpus)
    factories = ([None] if not args.no_full else []) + [
        CacheFactory(p, budget=b, kv_bits=k) for p in args.policy for b in args.budget for k in args.kv_bits]
    frames = []
    for f in factories:
        t0 = time.perf_counter()
        df = evaluate_items(model, tok, items, f, query_aware=not args.query_agnostic, progress=True)
        frames.append(df)
        print(f"{df['config'][0]}: {int(df['correct'].sum())}/{len(df)} correct, {time.perf_counter() - t0:.0f} s",
              flush=True)
    results = pd.concat(frames, ignore_index=True)
    meta = {"command": command, "model": args.model, "corpus": args.corpus, "tasks": args.tasks,
            "lengths": args.lengths, "depths": args.depths, "n": args.num_items, "seed": args.seed,
            "query_aware": not args.query_agnostic, "model_info": vars(loaded.info), "corpus_source": corpus.source,
            "code": code_version(), "torch_threads": torch.get_num_threads(),
            "title": f"{args.model} · {', '.join(args.tasks)} in {args.corpus} · {args.num_items} items per cell"}
    write_task_outputs(args.out, results, meta)


def combine(folders: list[str], out: str, command: str) -> None:
    """The items.csv of ``folders`` joined (same model, corpus, tasks, seed and code commit, else
    ValueError) and written as one run."""
    import json
    from pathlib import Path

    from sinklab.streaming.tasks import write_task_outputs

    metas = [json.loads((Path(f) / "tasks.json").read_text()) for f in folders]
    for key in ("model", "corpus", "tasks", "seed", "n", "query_aware"):
        if len({json.dumps(m[key]) for m in metas}) > 1:
            raise ValueError(f"the parts differ in {key}: {[m[key] for m in metas]}")
    if len({m["code"]["commit"] for m in metas}) > 1:
        raise ValueError(f"the parts ran different code: {[m['code'] for m in metas]}")
    results = pd.concat([pd.read_csv(Path(f) / "items.csv", dtype={"answers": str, "output": str}) for f in folders],
                        ignore_index=True)
    m0 = metas[0]
    meta = {"command": command, **{k: m0[k] for k in ("model", "corpus", "tasks", "n", "seed", "query_aware",
                                                    "model_info", "corpus_source", "code")},
            "lengths": sorted({t for m in metas for t in m["lengths"]}),
            "depths": sorted({d for m in metas for d in m["depths"]}),
            "title": m0["title"], "parts": [dict(m, folder=str(f)) for f, m in zip(folders, metas)]}
    write_task_outputs(out, results, meta)


if __name__ == "__main__":
    main()
