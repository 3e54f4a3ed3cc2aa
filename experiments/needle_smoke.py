"""Needle in a haystack (sinklab.streaming.tasks) on a zoo model: the full cache (the ceiling) against
cache policies at a budget, per length x depth, with Wilson 95% intervals and a heat-map.

    python experiments/needle_smoke.py --out results/compression/needle_smoke      # SmolLM2-135M, pg-essays

Writes items.csv, accuracy.csv, heatmap.png and tasks.json (the command, model, corpus, code version)
into --out (:func:`sinklab.streaming.tasks.write_task_outputs`).
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
    ap.add_argument("--policy", nargs="+", default=["sinks"])
    ap.add_argument("--budget", nargs="+", type=int, default=[256])
    ap.add_argument("--kv-bits", nargs="+", type=int, default=[16])
    ap.add_argument("--no-full", action="store_true", help="leave out the full cache (the ceiling)")
    ap.add_argument("--query-agnostic", action="store_true", help="feed the question after the context (query_aware=False)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

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
    command = "python experiments/needle_smoke.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    meta = {"command": command, "model": args.model, "corpus": args.corpus, "tasks": args.tasks,
            "lengths": args.lengths, "depths": args.depths, "n": args.num_items, "seed": args.seed,
            "query_aware": not args.query_agnostic, "model_info": vars(loaded.info), "corpus_source": corpus.source,
            "code": code_version(), "torch_threads": torch.get_num_threads(),
            "title": f"{args.model} · {', '.join(args.tasks)} in {args.corpus} · {args.num_items} items per cell"}
    write_task_outputs(args.out, results, meta)


if __name__ == "__main__":
    main()
