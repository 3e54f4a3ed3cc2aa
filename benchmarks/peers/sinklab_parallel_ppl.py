"""sinklab's ``sinks`` policy (4 sinks + 256) on the peers' ids in ``parallel`` mode: one exact forward that
computes the token-by-token cache's attention (:mod:`sinklab.streaming.parallel`, tested equal to the
decode path), so its perplexity by chunk costs one 2048-token forward instead of 2047 decode steps.
Also the window-only cache (0 + 260) and the full cache, for scale. Run with sinklab's environment:

    PYTHONPATH=src .venv/bin/python benchmarks/peers/sinklab_parallel_ppl.py   -> results/peers/ppl_sinklab_parallel.json
"""
from __future__ import annotations

import json
from dataclasses import asdict

import torch

import common


def main() -> None:
    from transformers import AutoModelForCausalLM

    from sinklab.streaming.harness import evaluate_stream, policy_specs

    torch.set_num_threads(1)
    d = json.loads((common.RESULTS / "ids.json").read_text())
    ids = torch.tensor(d["ids"], dtype=torch.long)
    model = AutoModelForCausalLM.from_pretrained(d["model_dir"], dtype=torch.float32, attn_implementation="sdpa").eval()
    specs = policy_specs(["sinks", "window"], [common.BUDGET], n_sink=common.N_SINK, window=common.WINDOW,
                         full=True, recompute=False)
    res = evaluate_stream(model, ids, specs, chunk=common.CHUNK, mode="parallel", progress=False, latency_steps=4)
    out = {"model_dir": d["model_dir"], "tokens": len(d["ids"]), "chunk": common.CHUNK, "mode": "parallel",
           "note": "latency_ms_per_token here: 4 decode steps on a loaded machine, not the peers' latency protocol",
           "configs": [asdict(r) for r in res], "env": common.env()}
    (common.RESULTS / "ppl_sinklab_parallel.json").write_text(json.dumps(out, indent=1) + "\n")
    for r in res:
        print(r.name, "ppl", round(r.ppl, 4), "by chunk", [round(x, 2) if x else x for x in r.ppl_by_chunk])


if __name__ == "__main__":
    main()
