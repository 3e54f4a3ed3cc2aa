"""NVIDIA's kvpress 0.5.5 (transformers 5.2, SDPA) StreamingLLMPress with 4 sinks at a budget of 260
kept tokens, on the peers' protocol (common.py). Run with its own venv (setup_venvs.sh):

    /work/peer-venvs/kvpress/bin/python benchmarks/peers/kvpress_peer.py --model-dir DIR --variant V --out FILE

Variants (``--variant``):
  prefill             StreamingLLMPress alone. kvpress presses act at prefill only: a 1024-token prefill
                      (its 1023 predictions see the full prefix) is cut to 4 + 256, then the other tokens
                      are decoded one per call with a cache that grows again (to 1284 at the end).
  prefill-rerotate    the same under KeyRerotationPress (kept keys re-rotated to positions 0..259).
  decoding            DecodingPress(StreamingLLMPress): one token per call from token 0, the cache cut to
                      target_size 260 after every step (compression_interval 1: the same budget as the
                      other peers), positions as transformers counts them (the compressed cache's length).
  decoding-absolute   the same with position_ids = the token's index in the stream.
  decoding-absolute-sorted   and the kept indices re-sorted into slot order (a patch of ScorerPress.compress:
                      the only change), to test the cache-order hypothesis.
  decoding-rerotate   DecodingPress over KeyRerotationPress(StreamingLLMPress) (its assertion that the base
                      press is a ScorerPress bypassed): kvpress's own re-rotation and sorting, cache positions.

Layer 0's cache is traced: the stream index of the token in every slot after each compression (the
same topk the press runs, on the same scores), to see where the 4 sinks go.
"""
from __future__ import annotations

import torch

import common

VARIANTS = ["prefill", "prefill-rerotate", "decoding", "decoding-absolute", "decoding-absolute-sorted",
            "decoding-rerotate"]


class Trace:
    """Stream index held in each of layer 0's slots, updated at every compression."""

    def __init__(self) -> None:
        self.slots: list[int] = []
        self.next = 0  # stream index of the next token to arrive
        self.compressions = 0
        self.unsorted = 0  # compressions whose kept indices were not ascending
        self.sink_evicted_at: dict[int, int] = {}
        self.first_slots_log: list[tuple[int, list[int]]] = []

    def arrive(self, upto: int) -> None:
        self.slots += list(range(self.next, upto))
        self.next = upto

    def kept(self, idx: torch.Tensor, k_len: int) -> None:
        assert len(self.slots) == k_len, (len(self.slots), k_len)
        order = idx[0, 0].tolist()  # head 0 (StreamingLLM scores every head alike)
        if order != sorted(order):
            self.unsorted += 1
        self.slots = [self.slots[i] for i in order]
        self.compressions += 1
        for s in range(common.N_SINK):
            if s not in self.slots and s not in self.sink_evicted_at:
                self.sink_evicted_at[s] = self.next - 1
        if self.compressions <= 3 or self.compressions % 256 == 0:
            self.first_slots_log.append((self.next - 1, self.slots[: common.N_SINK]))

    def summary(self) -> dict:
        return {"compressions": self.compressions, "compressions_with_unsorted_kept_indices": self.unsorted,
                "sink_evicted_at_token": self.sink_evicted_at, "first_slots_at_end": self.slots[: common.N_SINK],
                "sinks_in_cache_at_end": [s for s in range(common.N_SINK) if s in self.slots],
                "first_slots_after_compression": self.first_slots_log, "kept_at_end": len(self.slots)}


def main() -> None:
    a = common.args(lambda ap: ap.add_argument("--variant", choices=VARIANTS, required=True))
    from transformers import AutoModelForCausalLM, DynamicCache

    import kvpress
    from kvpress import DecodingPress, KeyRerotationPress, ScorerPress, StreamingLLMPress
    from kvpress.utils import compute_n_kept

    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    ids = common.load_ids(a.ids)
    v = a.variant
    trace = Trace()
    sort = v.endswith("-sorted")
    orig_scorer, orig_rerot = ScorerPress.compress, KeyRerotationPress.compress

    def traced_scorer(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.compression_ratio == 0:
            return keys, values
        k_len = keys.shape[2]
        n_kept = compute_n_kept(k_len, self.compression_ratio)
        scores = self.score(module, hidden_states, keys, values, attentions, kwargs)
        idx = scores.topk(n_kept, dim=-1).indices  # what ScorerPress.compress keeps, in its order
        if sort:
            idx = idx.sort(dim=-1).values
            if module.layer_idx == 0:
                trace.kept(idx, k_len)
            g = idx.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
            return keys.gather(2, g).contiguous(), values.gather(2, g).contiguous()
        if module.layer_idx == 0:
            trace.kept(idx, k_len)
        return orig_scorer(self, module, hidden_states, keys, values, attentions, kwargs)

    def traced_rerot(self, module, hidden_states, keys, values, attentions, kwargs):
        if self.press.compression_ratio != 0 and module.layer_idx == 0:
            n_kept = compute_n_kept(keys.shape[2], self.press.compression_ratio)
            idx = self.press.score(module, hidden_states, keys, values, attentions, kwargs).topk(n_kept, dim=-1).indices
            trace.kept(idx.sort(dim=2).values, keys.shape[2])
        return orig_rerot(self, module, hidden_states, keys, values, attentions, kwargs)

    ScorerPress.compress, KeyRerotationPress.compress = traced_scorer, traced_rerot
    P = common.LAT_PREFILL
    if v.startswith("prefill"):
        base = StreamingLLMPress(compression_ratio=1 - common.BUDGET / P, n_sink=common.N_SINK)
        press = KeyRerotationPress(base) if v == "prefill-rerotate" else base
    else:
        base = StreamingLLMPress(n_sink=common.N_SINK)
        if v == "decoding-rerotate":
            DecodingPress.__post_init__ = lambda self: (setattr(self, "hidden_states_buffer", __import__(
                "collections").defaultdict(list)), setattr(self, "layer_step_counts", __import__(
                    "collections").defaultdict(int)))
            base = KeyRerotationPress(base)
        press = DecodingPress(base_press=base, compression_interval=1, target_size=common.BUDGET,
                              hidden_states_buffer_size=0)
    cache = DynamicCache(config=model.config)
    absolute = "absolute" in v

    def step(t, x):
        trace.arrive(t + 1)
        kw = {"position_ids": torch.tensor([[t]])} if absolute else {}
        return model(x, past_key_values=cache, use_cache=True, **kw).logits

    def prefill(x):
        trace.arrive(x.shape[1])
        return model(x, past_key_values=cache, use_cache=True).logits

    with torch.no_grad(), press(model):
        if a.serve:
            return common.serve(prefill, step, ids)
        if a.latency:  # a decoding press leaves the prefill whole: its first steps cut the cache to 260
            res = common.latency(prefill, step, ids)
        elif v.startswith("prefill"):
            logits = prefill(ids[:, :P])
            head = common.nll_of(logits[0, :-1], ids[0, 1:P]).tolist()
            last = float(common.nll_of(logits[0, -1], ids[0, P]))
            rest, ms = common.stream(lambda t, x: step(t + P, x), ids[:, P:])
            nll = head + [last] + rest
            res = {**common.summarise(nll, ids.shape[1]), "ms_per_token_last256": ms, "nll": nll}
        else:
            nll, ms = common.stream(step, ids)
            res = {**common.summarise(nll, ids.shape[1]), "ms_per_token_last256": ms, "nll": nll}
    if "nll" in res:
        res["max_abs_nll_diff_vs_full_first260"] = common.check_reference(res["nll"], a.ids)
    res.update(cache_bytes=common.kv_bytes((l.keys, l.values) for l in cache.layers),
               kept=int(cache.layers[0].keys.shape[-2]), attn_implementation="sdpa", kvpress=kvpress.__version__
               if hasattr(kvpress, "__version__") else "0.5.5", trace_layer0=trace.summary(),
               press=repr(press))
    common.write(a.out, "kvpress", v, res)


if __name__ == "__main__":
    main()
