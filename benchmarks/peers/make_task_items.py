"""Long-context task items for the peers, written once from sinklab's side (run with sinklab's venv):
sinklab's seeded needle items (:func:`sinklab.streaming.tasks.make_items`, the zoo's ``pg-essays``
haystack, SmolLM2-135M's tokenizer) with, per item, the prompt's token ids split into the context and
the question (which ends with the start of the answer), the expected answers, the greedy tokens to
decode (the task's ``answer_tokens``) and the tokenizer's end-of-sequence id; plus the model folder.
A peer (``kvpress_tasks.py``) reads the ids from this file and never tokenises.

Usage: python benchmarks/peers/make_task_items.py [--lengths 1024] [--depths 0 0.5 1] [-n 2]
       -> benchmarks/results/peers/task_items.json
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from common import RESULTS


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="pg-essays")
    ap.add_argument("--tasks", nargs="+", default=["needle"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[1024])
    ap.add_argument("--depths", nargs="+", type=float, default=[0.0, 0.5, 1.0])
    ap.add_argument("-n", "--num-items", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "task_items.json"))
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from sinklab.streaming.tasks import TASKS, make_items
    from sinklab.zoo.corpora import load_corpus
    from sinklab.zoo.models import fetch_model

    folder = fetch_model(a.model)  # already fetched: the cached folder
    tok = AutoTokenizer.from_pretrained(folder)
    corp = load_corpus(a.corpus)
    items = make_items(a.tasks, tok, corp.documents, lengths=a.lengths, depths=a.depths, n=a.num_items, seed=a.seed,
                       corpus_name=a.corpus)
    out = {"command": "python benchmarks/peers/make_task_items.py " + " ".join(map(shlex.quote, sys.argv[1:])),
           "model": a.model, "model_dir": str(folder), "corpus": a.corpus, "seed": a.seed,
           "eos_token_id": tok.eos_token_id,
           "items": [{"task": it.task, "index": it.index, "length": it.length, "depth": it.depth, "at": it.at,
                      "n_tokens": it.n_tokens, "context_ids": it.context_ids, "question_ids": it.question_ids,
                      "answers": it.answers, "seed": it.seed, "question": it.question, "meta": it.meta,
                      "max_new_tokens": TASKS.get(it.task).answer_tokens} for it in items]}
    with open(a.out, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(a.out, len(items), "items", [it.n_tokens for it in items])


if __name__ == "__main__":
    main()
