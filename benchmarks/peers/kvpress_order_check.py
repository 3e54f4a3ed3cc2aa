"""What kvpress's own code does to the cache's order (issue 23, item 6), checked with kvpress 0.5.5 itself,
not simulated: a small random LLaMA (transformers 5.2, 2 layers, fast) decoded token by token under
``DecodingPress(StreamingLLMPress(n_sink=4), compression_interval=1, target_size=260)``, as the peers'
run does with SmolLM2. At every compression of layer 0, kvpress's unmodified ``ScorerPress.compress``
is called a second time on *tag* tensors (every slot's keys and values = the stream index of the token
in that slot; StreamingLLMPress scores slots by their index only, so it keeps the same slots in the
same order) and the tags it returns are the cache's new slot -> token map. The real keys returned are
checked against the real keys gathered in that order (so the tags are the cache).

Printed and written (benchmarks/results/peers/kvpress_order_check.json): after the first compressions,
the tokens in the first 4 slots (what StreamingLLMPress protects as "the sinks" next time) and whether
the slots are in stream order; when tokens 0..3 leave the cache; the positions the query and the kept
keys were rotated at, with the default position ids (the compressed cache's length) and with absolute
ones; torch.topk's order on a tie, the root cause. Also with the kept indices re-sorted (``--sorted``
patch, what the peers' decoding-absolute-sorted variant does).

    /work/peer-venvs/kvpress/bin/python benchmarks/peers/kvpress_order_check.py
"""
from __future__ import annotations

import json
import platform
from pathlib import Path

import torch

N_SINK, TARGET, TOKENS = 4, 260, 600
OUT = Path(__file__).resolve().parents[1] / "results" / "peers" / "kvpress_order_check.json"


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=4096, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


def run(absolute: bool, sort: bool) -> dict:
    from transformers import DynamicCache

    import kvpress
    from kvpress import DecodingPress, ScorerPress, StreamingLLMPress

    model = tiny_llama()
    ids = torch.randint(0, 128, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    orig = ScorerPress.compress
    state = {"tags": torch.zeros(1, 2, 0, 16), "step": 0, "log": [], "lost": {}, "unsorted": 0, "first_unsorted": None,
             "tags_match": True}

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        if module.layer_idx != 0 or self.compression_ratio == 0:
            return (orig if not sort else sorted_compress)(self, module, hidden_states, keys, values, attentions, kwargs)
        tags = state["tags"]
        assert tags.shape[2] == keys.shape[2], (tags.shape, keys.shape)
        tk = tags[..., :1].expand(-1, keys.shape[1], -1, keys.shape[3]).contiguous()  # (B, H_kv, K, head_dim)
        fn = orig if not sort else sorted_compress
        new_k, new_v = fn(self, module, hidden_states, keys, values, attentions, kwargs)
        tag_k, _ = fn(self, module, hidden_states, tk, tk.clone(), attentions, kwargs)
        order = tag_k[0, 0, :, 0].long()  # token index now in each slot
        where = {tok: i for i, tok in enumerate(tags[0, 0, :, 0].long().tolist())}  # token -> slot before
        slot_idx = torch.tensor([where[tok] for tok in order.tolist()])
        state["tags_match"] &= bool(torch.equal(new_k, keys[:, :, slot_idx]))
        slots = order.tolist()
        if slots != sorted(slots):
            state["unsorted"] += 1
            state["first_unsorted"] = state["first_unsorted"] or state["step"]
        n = len(state["log"])
        if n < 4 or state["step"] in (400, TOKENS - 1):
            state["log"].append({"token": state["step"], "first_4_slots": slots[:4], "last_3_slots": slots[-3:],
                                 "in_stream_order": slots == sorted(slots)})
        for s in range(N_SINK):
            if s not in slots and s not in state["lost"]:
                state["lost"][s] = state["step"]
        state["tags"] = order[None, None, :, None].float().expand(1, 2, -1, 16)
        return new_k, new_v

    def sorted_compress(self, module, hidden_states, keys, values, attentions, kwargs):  # ScorerPress.compress + sort
        from kvpress.utils import compute_n_kept

        if self.compression_ratio == 0:
            return keys, values
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        idx = scores.topk(compute_n_kept(keys.shape[2], self.compression_ratio), dim=-1).indices.sort(dim=-1).values
        g = idx.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
        return keys.gather(2, g).contiguous(), values.gather(2, g).contiguous()

    ScorerPress.compress = compress
    press = DecodingPress(base_press=StreamingLLMPress(n_sink=N_SINK), compression_interval=1, target_size=TARGET,
                          hidden_states_buffer_size=0)
    cache = DynamicCache(config=model.config)
    seen_pos = []
    rope = model.model.rotary_emb
    hook = rope.register_forward_pre_hook(
        lambda m, a, kw: seen_pos.append(int(kw.get("position_ids", a[1] if len(a) > 1 else None)[0, -1])),
        with_kwargs=True)
    try:
        with torch.no_grad(), press(model):
            for t in range(TOKENS):
                state["step"] = t
                state["tags"] = torch.cat((state["tags"], torch.full((1, 2, 1, 16), float(t))), dim=2)
                kw = {"position_ids": torch.tensor([[t]])} if absolute else {}
                model(ids[:, t : t + 1], past_key_values=cache, use_cache=True, **kw)
    finally:
        ScorerPress.compress = orig
        hook.remove()
    return {"compressions_with_slots_out_of_stream_order": state["unsorted"],
            "first_out_of_order_at_token": state["first_unsorted"], "after_compression": state["log"],
            "sink_tokens_evicted_at": {str(k): v for k, v in sorted(state["lost"].items())},
            "tags_equal_kvpress_keys": state["tags_match"],
            "query_position_at_tokens_299_599": [seen_pos[299], seen_pos[TOKENS - 1]],
            "kept_keys_rotated_at": "their absolute stream positions (kvpress does not move keys) -- up to token "
                                    f"{TOKENS - 1}", "kvpress": getattr(kvpress, "__version__", "0.5.5")}


def main() -> None:
    import transformers

    ones = torch.ones(1, 1, TARGET + 1)
    ones[..., N_SINK] = 0  # one slot to drop, as at every decode step once the cache is full
    tie = ones.topk(TARGET, dim=-1).indices[0, 0]
    out = {"setup": {"n_sink": N_SINK, "target_size": TARGET, "compression_interval": 1, "tokens": TOKENS,
                     "model": "random LLaMA, 2 layers, 2 KV heads, head_dim 16", "torch": torch.__version__,
                     "transformers": transformers.__version__, "python": platform.python_version()},
           "torch_topk_on_ties": {"scores": f"1 on {TARGET + 1} slots except slot {N_SINK} (0)",
                                  "first_8_indices": tie[:8].tolist(), "ascending": tie.tolist() == sorted(tie.tolist())}}
    for name, absolute, sort in [("decoding (default positions)", False, False),
                                 ("decoding-absolute", True, False), ("decoding-absolute-sorted", True, True)]:
        out[name] = run(absolute, sort)
        print(name, json.dumps({k: v for k, v in out[name].items() if k != "after_compression"}))
        for row in out[name]["after_compression"]:
            print("   ", row)
    print("topk on ties:", out["torch_topk_on_ties"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
