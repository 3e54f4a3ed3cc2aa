"""sinklab's ``sinks`` policy (StreamingLLM: 4 sinks + 256 recent, positions inside the cache) on the
peers' protocol (common.py). Run with sinklab's own environment (transformers 5):

    PYTHONPATH=src .venv/bin/python benchmarks/peers/sinklab_peer.py --model-dir DIR --out FILE [--latency]
"""
from __future__ import annotations

import torch

import common


def main() -> None:
    a = common.args(lambda ap: ap.add_argument("--attn", default="sdpa", help="sdpa | eager"))
    from transformers import AutoModelForCausalLM

    from sinklab.streaming import SinkCache

    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation=a.attn).eval()
    ids = common.load_ids(a.ids)
    cache = SinkCache(model, n_sink=common.N_SINK, window=common.WINDOW)

    def step(t, x):
        return model(x, past_key_values=cache, use_cache=True,
                     position_ids=torch.tensor([[cache.kept_length()]])).logits

    def prefill(x):
        model(x, past_key_values=cache, use_cache=True, position_ids=torch.arange(x.shape[1])[None])

    name = f"sinks@{common.BUDGET}" + ("" if a.attn == "sdpa" else f" ({a.attn})")
    if a.serve:
        return common.serve(prefill, step, ids)
    if a.latency:
        res = common.latency(prefill, step, ids)
    else:
        nll, ms = common.stream(step, ids)
        res = {**common.summarise(nll, ids.shape[1]), "ms_per_token_last256": ms, "nll": nll,
               "max_abs_nll_diff_vs_full_first260": common.check_reference(nll, a.ids)}
    res.update(cache_bytes=cache.nbytes, kept=cache.kept_length(), attn_implementation=a.attn)
    common.write(a.out, "sinklab", name, res)


if __name__ == "__main__":
    main()
