"""Why kvpress's StreamingLLMPress under its DecodingPress loses the sinks (issue 23, item 6): a simulation
of the cache's *positions* only, no model, no kvpress import.

What kvpress does (read in NVIDIA/kvpress, kvpress/presses/scorer_press.py at 0603dec and
kvpress/presses/streaming_llm_press.py at 08a43bf, kvpress/presses/generation/decoding_press.py at 173dd74):
StreamingLLMPress scores every cache *slot* 1, except slots n_sink .. n_sink + n_pruned - 1, scored 0;
ScorerPress keeps ``scores.topk(n_kept).indices`` and gathers the keys in that order, without sorting
the indices back into slot order. DecodingPress calls it every ``compression_steps`` decode steps to cut
the cache to ``token_buffer_size``, passing as ``hidden_states`` the buffer of the last
``compression_steps`` steps, while StreamingLLMPress takes ``q_len = hidden_states.shape[1]`` to size
n_pruned.

Two effects, both simulated here with torch's own topk:
  1. order: among tied scores torch.topk does not return ascending indices, so after the first
     compression the first n_sink *slots* are not the first n_sink *tokens*; the next compression
     protects whatever sits there and the real sinks, now mid-cache, are pruned.
  2. size: n_pruned computed from the 10-token buffer is far smaller than the number of slots to drop,
     so topk also drops slots scored 1, chosen by its tie order.
``sorted`` re-sorts the kept indices into slot order (what the issue tried: perplexity 39.19).

Run: python benchmarks/kvpress_cache_order.py  (a second; writes benchmarks/results/kvpress_cache_order.json)
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

N_SINK, BUFFER, STEPS, TOKENS, PREFILL = 4, 256, 10, 2048, 260


def simulate(sort: bool, size_from_buffer: bool) -> dict:
    cache = list(range(PREFILL))  # token positions held, slot by slot
    lost_at = {}
    for t in range(PREFILL, TOKENS):
        cache.append(t)
        if (t - PREFILL + 1) % STEPS or len(cache) <= BUFFER:
            continue
        k_len = len(cache)
        ratio = 1 - BUFFER / k_len
        n_kept = int(k_len * (1 - ratio))
        while n_kept < BUFFER:  # the exact target, as DecodingPress's search finds it
            ratio -= 1e-6
            n_kept = int(k_len * (1 - ratio))
        q_len = STEPS if size_from_buffer else k_len
        n_pruned = q_len - int(q_len * (1 - ratio))
        scores = torch.ones(1, 1, k_len)
        scores[..., N_SINK : N_SINK + n_pruned] = 0
        idx = scores.topk(n_kept, dim=-1).indices[0, 0]
        if sort:
            idx = idx.sort().values
        cache = [cache[i] for i in idx.tolist()]
        for s in range(N_SINK):
            if s not in cache and s not in lost_at:
                lost_at[s] = t
    return {"first_slots_at_end": cache[:N_SINK], "sinks_kept_at_end": [s for s in range(N_SINK) if s in cache],
            "sink_evicted_at_token": lost_at,
            "recent_window_intact": cache[-(BUFFER - N_SINK):] == list(range(TOKENS - BUFFER + N_SINK, TOKENS))}


def main() -> None:
    out = {"setup": {"n_sink": N_SINK, "token_buffer_size": BUFFER, "compression_steps": STEPS, "tokens": TOKENS,
                     "prefill": PREFILL, "torch": torch.__version__}}
    for sort in (False, True):
        for from_buffer in (False, True):
            key = f"{'sorted' if sort else 'topk order'}, n_pruned from {'the 10-token buffer' if from_buffer else 'the cache length'}"
            out[key] = simulate(sort, from_buffer)
            print(key, out[key])
    path = Path(__file__).resolve().parent / "results" / "kvpress_cache_order.json"
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
