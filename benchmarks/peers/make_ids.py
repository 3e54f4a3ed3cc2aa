"""Tokenise once for every peer (run with sinklab's own environment): the first 2048 ids of the zoo's
``sotu`` corpus with SmolLM2-135M's tokenizer (:func:`sinklab.streaming.token_stream`, as ``sinklab
stream`` builds its stream), the model folder's path, and the full cache's NLLs of the first
predictions (one forward over the stream, float32: the same-model check each peer makes).

Usage: python benchmarks/peers/make_ids.py [--tokens 2048]  -> benchmarks/results/peers/ids.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from common import BUDGET, RESULTS, nll_of


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="sotu")
    ap.add_argument("--tokens", type=int, default=2048)
    a = ap.parse_args()
    from sinklab.streaming import token_stream
    from sinklab.zoo.corpora import load_corpus
    from sinklab.models import load_model
    from sinklab.zoo.models import fetch_model

    folder = fetch_model(a.model)  # already fetched: returns the cached folder
    loaded = load_model(a.model, attn_implementation="sdpa")
    corp = load_corpus(a.corpus)
    ids = token_stream(loaded.tokenizer, corp.documents, a.tokens, corpus_name=corp.name)
    torch.set_num_threads(1)
    with torch.no_grad():
        logits = loaded.model(ids[None]).logits[0]
    full = nll_of(logits[:-1], ids[1:])
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = {"model": a.model, "model_dir": str(folder), "corpus": a.corpus, "tokens": a.tokens, "ids": ids.tolist(),
           "full_nll_first": full[:BUDGET].tolist(), "full_ppl": float(full.mean().exp())}
    (RESULTS / "ids.json").write_text(json.dumps(out) + "\n")
    print(folder, "full-cache ppl", out["full_ppl"])


if __name__ == "__main__":
    main()
