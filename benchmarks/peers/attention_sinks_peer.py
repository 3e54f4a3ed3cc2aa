"""tomaarsen's ``attention_sinks`` 0.4.0 (transformers 4.34, eager attention: it patches LLaMA's
attention to rotate the keys at their positions inside the cache) with 4 sinks + a window of 256, on
the peers' protocol (common.py). Run with its own venv (benchmarks/peers/setup_venvs.sh):

    /work/peer-venvs/attention_sinks/bin/python benchmarks/peers/attention_sinks_peer.py --model-dir DIR --out FILE
"""
from __future__ import annotations

import torch

import common


def main() -> None:
    a = common.args()
    from attention_sinks import AutoModelForCausalLM

    cfg = common.config(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, config=cfg, torch_dtype=torch.float32,
                                                 attention_sink_size=common.N_SINK,
                                                 attention_sink_window_size=common.WINDOW).eval()
    ids = common.load_ids(a.ids)
    state = {"past": None}

    def step(t, x):
        out = model(input_ids=x, past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits

    def prefill(x):
        step(0, x)

    if a.serve:
        return common.serve(prefill, step, ids)
    if a.latency:
        res = common.latency(prefill, step, ids)
    else:
        nll, ms = common.stream(step, ids)
        res = {**common.summarise(nll, ids.shape[1]), "ms_per_token_last256": ms, "nll": nll,
               "max_abs_nll_diff_vs_full_first260": common.check_reference(nll, a.ids)}
    past = state["past"]
    res.update(cache_bytes=common.kv_bytes(past), kept=int(past[0][0].shape[-2]), attn_implementation="eager",
               rope_theta=cfg.rope_theta)
    common.write(a.out, "attention_sinks", f"attention_sinks {common.N_SINK}+{common.WINDOW}", res)


if __name__ == "__main__":
    main()
