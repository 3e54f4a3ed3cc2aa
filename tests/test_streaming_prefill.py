"""Chunked prefill (sinklab.streaming.prefill): what each chunk attends to, one-call prefill as an option,
the warning past the trained context, generate after a chunked prefill, query-aware prompts.

References computed another way: for every chunk, a from-scratch forward over exactly the tokens the
cache kept before it and the chunk's tokens (one layer, float64, at positions 0..K + q - 1, as the
cache places them); a single forward over the whole prompt (one-call prefill); a hand-written greedy
loop (generate); token-by-token feeding through the same cache (chunk = 1)."""

from __future__ import annotations

import warnings

import pytest
import torch

from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.prefill import generate, prefill, prefill_question
from test_streaming_cache import kept_positions, llama, stream_logits


def peaky(layers=1):
    m = llama(layers=layers)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    return m


@pytest.mark.parametrize("policy", ["sinks", "window", "h2o", "snapkv"])
def test_each_chunk_is_a_forward_over_kept_tokens_and_the_chunk(policy):
    """A 30-token prompt, budget 8 (sinks: 2 + window 6): chunks of the window (6 tokens; 8 without
    sinks); each chunk's logits equal a fresh forward over the tokens kept before it and the chunk,
    so no token attends to more than budget + chunk keys; the cache ends at the budget."""
    m = peaky()
    ids = torch.randint(0, 80, (1, 30), generator=torch.Generator().manual_seed(21))
    n_sink = 2 if policy == "sinks" else 0
    opts = {"observation_window": 2} if policy == "snapkv" else None
    cache = SinkCache(m, policy=policy, budget=8, n_sink=n_sink, policy_options=opts)
    chunk = cache.window
    assert chunk == 8 - n_sink
    got = prefill(m, ids, cache, logits="all")
    layer = cache.layers[0]
    with torch.no_grad():
        # replay the chunks by hand, reading the kept set before each chunk
        ref_cache = SinkCache(m, policy=policy, budget=8, n_sink=n_sink, policy_options=opts)
        refs = []
        for a in range(0, 30, chunk):
            b = min(30, a + chunk)
            kept = [] if not a else (ref_cache.layers[0].order[0] if ref_cache.layers[0].order.dim() == 2
                                     else ref_cache.layers[0].order).tolist()
            assert len(kept) <= 8
            refs.append(m(ids[:, kept + list(range(a, b))]).logits[:, len(kept):])
            m(ids[:, a:b], cache=ref_cache, use_cache=True, position_ids=torch.arange(len(kept), len(kept) + b - a)[None])
    ref = torch.cat(refs, dim=1)
    assert torch.allclose(got, ref, atol=1e-8)
    assert layer.kept == 8 and cache.get_seq_length() == 30
    if policy == "sinks":
        assert layer.order.tolist() == kept_positions(30, 2, 6)


def test_chunk_1_is_token_by_token_and_one_call_attends_to_everything():
    """chunk=1 is token-by-token decoding through the same cache; one_call=True is one
    forward over the whole prompt; the two differ once the prompt is longer than the budget, and the
    default chunked prefill differs from both."""
    m = peaky()
    ids = torch.randint(0, 80, (1, 24), generator=torch.Generator().manual_seed(22))
    tok = prefill(m, ids, SinkCache(m, n_sink=2, window=6), chunk=1, logits="all")
    ref = stream_logits(m, ids, SinkCache(m, n_sink=2, window=6), cache_positions=True)
    assert torch.allclose(tok, ref, atol=1e-10)
    one = prefill(m, ids, SinkCache(m, n_sink=2, window=6), one_call=True, logits="all")
    with torch.no_grad():
        assert torch.allclose(one, m(ids).logits, atol=1e-10)
    chunked = prefill(m, ids, SinkCache(m, n_sink=2, window=6), logits="all")
    assert torch.allclose(chunked[:, :9], tok[:, :9], atol=1e-10)  # until the first eviction, nothing differs
    assert not torch.allclose(chunked[:, -1], tok[:, -1], atol=1e-4)
    assert not torch.allclose(chunked[:, -1], one[:, -1], atol=1e-4)
    last = prefill(m, ids, SinkCache(m, n_sink=2, window=6))
    # logits="last" projects only the last position: the same values, not always the same bits (the GEMM's
    # blocking depends on the rows it multiplies; bit-equal on an AMD EPYC, not on an Intel Xeon)
    assert torch.allclose(last, chunked[:, -1], atol=1e-10, rtol=0)


def test_warns_once_past_the_trained_context():
    """The model's context is 128 positions: a 200-token prompt at stream positions warns once (one
    line), at cache positions (chunked) not at all."""
    m = llama(layers=1)
    ids = torch.randint(0, 80, (1, 200), generator=torch.Generator().manual_seed(23))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prefill(m, ids, SinkCache(m, n_sink=2, window=30), positions="stream")
    msgs = [str(x.message) for x in w if "trained context" in str(x.message)]
    assert len(msgs) == 1 and "trained context of 128 positions" in msgs[0] and "\n" not in msgs[0]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        prefill(m, ids, SinkCache(m, n_sink=2, window=30))
    assert not [x for x in w if "trained context" in str(x.message)]


def test_generate_after_chunked_prefill_equals_a_greedy_loop():
    m = peaky()
    ids = torch.randint(0, 80, (1, 20), generator=torch.Generator().manual_seed(24))
    out = generate(m, ids, SinkCache(m, n_sink=2, window=6), max_new_tokens=4, do_sample=False)
    cache = SinkCache(m, n_sink=2, window=6)
    prefill(m, ids[:, :-1], cache, positions="stream")
    seq = ids
    with torch.no_grad():
        for _ in range(4):
            t = seq.shape[1] - 1
            nxt = m(seq[:, -1:], cache=cache, use_cache=True, position_ids=torch.tensor([[t]])).logits[:, -1].argmax(-1)
            seq = torch.cat((seq, nxt[:, None]), dim=1)
    assert out.tolist() == seq.tolist()
    with pytest.raises(InputError, match="empty cache"):
        generate(m, ids, cache, max_new_tokens=1)


def test_query_aware_question_steers_snapkv_and_agnostic_does_not():
    """SnapKV, budget 6, observation window 2: query-aware, the question's last two tokens vote (the
    kept set is SnapKV over context + question in one prompt); query-agnostic, the context's own last
    two tokens vote, then each of the 3 question tokens evicts the oldest kept token."""
    m = peaky()
    g = torch.Generator().manual_seed(25)
    ctx, q = torch.randint(0, 80, (1, 14), generator=g), torch.randint(0, 80, (1, 3), generator=g)
    opts = {"observation_window": 2}
    aware = SinkCache(m, policy="snapkv", budget=6, policy_options=opts)
    prefill_question(m, ctx, q, aware, one_call=True)
    whole = SinkCache(m, policy="snapkv", budget=6, policy_options=opts)
    prefill(m, torch.cat((ctx, q), 1), whole, one_call=True)
    assert aware.layers[0].order.tolist() == whole.layers[0].order.tolist()
    blind = SinkCache(m, policy="snapkv", budget=6, policy_options=opts)
    ctx_only = SinkCache(m, policy="snapkv", budget=6, policy_options=opts)
    prefill(m, ctx, ctx_only, one_call=True)
    logits = prefill_question(m, ctx, q, blind, query_aware=False, one_call=True)
    kept_ctx = ctx_only.layers[0].order[0].tolist()
    assert blind.layers[0].order[0].tolist() == (kept_ctx + [14, 15, 16])[3:]
    assert aware.layers[0].order[0].tolist() != blind.layers[0].order[0].tolist()
    with torch.no_grad():
        seq = torch.cat((ctx, q), 1)[0].tolist()
        ref = m(torch.tensor([[seq[j] for j in kept_ctx[2:] + [14, 15]] + [seq[16]]])).logits[:, -1]
    assert torch.allclose(logits, ref, atol=1e-8)


def test_bad_arguments():
    m = llama(layers=1)
    cache = SinkCache(m, n_sink=2, window=6)
    with pytest.raises(InputError, match="chunk"):
        prefill(m, torch.zeros(1, 4, dtype=torch.long), cache, chunk=0)
    with pytest.raises(InputError, match="positions"):
        prefill(m, torch.zeros(1, 4, dtype=torch.long), cache, positions="absolute")
    with pytest.raises(InputError, match="ids"):
        prefill(m, torch.zeros(4, dtype=torch.long), cache)
