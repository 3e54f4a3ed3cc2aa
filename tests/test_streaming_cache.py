"""SinkCache (sinklab.streaming): StreamingLLM's sinks + window KV cache on the transformers Cache API.

References computed another way: the full cache (transformers' DynamicCache or one forward over the
whole stream), a from-scratch forward over exactly the kept tokens at their cache positions, and a
single forward with a sliding-window mask (every test in float64 unless it says otherwise).
"""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_gpt2, tiny_neox
from sinklab.errors import InputError
from sinklab.streaming import SinkCache


def kept_positions(t: int, n_sink: int, window: int) -> list[int]:
    """Stream positions held by the cache just before token t is fed (t tokens seen)."""
    return sorted(set(range(min(n_sink, t))) | set(range(max(n_sink, t - window), t)))


def llama(layers: int = 2, attn: str = "eager"):
    """A random LLaMA with 4 query heads and 2 KV heads (grouped-query attention), head_dim 8."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      attn_implementation=attn)
    return LlamaForCausalLM(cfg).eval().double()


def tiny_gemma3(sliding_window: int):
    """A random float64 Gemma 3 text model: layers 0, 2 sliding (window ``sliding_window``), 1, 3 global."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=sliding_window,
                           layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=128,
                           attn_implementation="eager")
    return Gemma3ForCausalLM(cfg).eval().double()


def stream_logits(model, ids, cache, *, cache_positions: bool):
    out = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            kw = {"position_ids": torch.tensor([[cache.kept_length()]])} if cache_positions else {}
            out.append(model(ids[:, t : t + 1], cache=cache, use_cache=True, **kw).logits)
    return torch.cat(out, dim=1)  # (B, T, V)


@pytest.mark.parametrize("cache_positions", [False, True])
def test_equals_full_cache_while_stream_fits(cache_positions):
    m = llama(layers=2)
    ids = torch.randint(0, 80, (2, 30), generator=torch.Generator().manual_seed(0))
    from transformers import DynamicCache

    got = stream_logits(m, ids, SinkCache(m, n_sink=4, window=26), cache_positions=cache_positions)
    full = stream_logits(m, ids, DynamicCache(config=m.config), cache_positions=False)
    assert torch.equal(got, full)  # nothing evicted, nothing moved: bit-identical to transformers' cache
    with torch.no_grad():
        assert torch.allclose(got, m(ids).logits, atol=1e-6)


@pytest.mark.parametrize("cache_positions", [False, True])
@pytest.mark.parametrize("n_sink,window", [(2, 8), (1, 5), (0, 6), (4, 3)])
def test_after_eviction_equals_forward_over_kept_tokens(n_sink, window, cache_positions):
    """One layer: the keys/values of a kept token depend only on the token and its position, so a
    decode step must equal a from-scratch forward over exactly the kept tokens at positions 0..K."""
    m = llama(layers=1)
    ids = torch.randint(0, 80, (2, 40), generator=torch.Generator().manual_seed(1))
    cache = SinkCache(m, n_sink=n_sink, window=window)
    with torch.no_grad():
        for t in range(40):
            kw = {"position_ids": torch.tensor([[cache.kept_length()]])} if cache_positions else {}
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True, **kw).logits[:, -1]
            ref = m(ids[:, kept_positions(t, n_sink, window) + [t]]).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-7), t
            assert cache.kept_length() == min(t + 1, n_sink + window)


def test_window_only_equals_sliding_window_mask_forward():
    """Several layers, no sinks: streaming with a window of W equals one forward over the whole stream
    in which token j sees tokens j-W..j (the window's keys are contiguous, so cache positions and true
    positions give the same relative distances) -- this checks the re-rotation of every kept key."""
    m = llama(layers=3)
    T, W = 36, 7
    ids = torch.randint(0, 80, (2, T), generator=torch.Generator().manual_seed(2))
    got = stream_logits(m, ids, SinkCache(m, n_sink=0, window=W), cache_positions=True)
    i = torch.arange(T)
    visible = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - W)
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill(~visible, float("-inf"))[None, None].expand(2, 1, T, T)
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).logits
    assert torch.allclose(got, ref, atol=1e-7)


def test_batch_and_gqa_shapes():
    m = llama(layers=2)  # 4 query heads, 2 KV heads
    ids = torch.randint(0, 80, (3, 20), generator=torch.Generator().manual_seed(3))
    cache = SinkCache(m, n_sink=2, window=5)
    out = stream_logits(m, ids, cache, cache_positions=True)
    assert out.shape == (3, 20, 80)
    for layer in cache.layers:
        assert layer.keys.shape == (3, 2, 7, 8) and layer.values.shape == (3, 2, 7, 8)
    # each row streams independently: row 1 alone gives the same logits
    alone = stream_logits(m, ids[1:2], SinkCache(m, n_sink=2, window=5), cache_positions=True)
    assert torch.allclose(out[1:2], alone, atol=1e-10)


def test_prompt_longer_than_cache_in_one_prefill_call():
    m = llama(layers=1)
    n_sink, window, P = 2, 6, 20
    ids = torch.randint(0, 80, (1, P + 5), generator=torch.Generator().manual_seed(4))
    cache = SinkCache(m, n_sink=n_sink, window=window)
    with torch.no_grad():
        pre = m(ids[:, :P], cache=cache, use_cache=True).logits
        assert torch.allclose(pre, m(ids[:, :P]).logits, atol=1e-6)  # the prompt sees all of itself
        assert cache.kept_length() == n_sink + window and cache.get_seq_length() == P
        assert cache.layers[0].positions.tolist() == list(range(n_sink)) + list(range(P - window, P))
        for t in range(P, P + 5):
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]
            ref = m(ids[:, kept_positions(t, n_sink, window) + [t]]).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-7)


def test_n_sink_at_least_the_stream_keeps_everything():
    m = llama(layers=2)
    ids = torch.randint(0, 80, (1, 15), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = m(ids).logits
    cache = SinkCache(m, n_sink=20, window=1)
    got = stream_logits(m, ids, cache, cache_positions=True)
    assert torch.allclose(got, ref, atol=1e-6)
    assert cache.kept_length() == 15


def test_cache_answers_generate_bookkeeping():
    m = llama(layers=2)
    cache = SinkCache(m, n_sink=2, window=5)
    assert len(cache) == 2 and cache.get_seq_length() == 0 and cache.get_max_length() == 7
    assert cache.get_mask_sizes(3, 0) == (3, 0) and not cache.is_compileable
    ids = torch.randint(0, 80, (1, 11), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        m(ids, cache=cache, use_cache=True)
    assert cache.get_seq_length() == 11  # tokens seen: generate slices new input ids by it
    assert cache.kept_length() == 7 and cache.get_seq_length(1) == 11
    assert cache.get_mask_sizes(1, 0) == (8, 4)  # 7 kept + 1 new keys, sitting right before the query at 11
    assert cache.nbytes == 2 * 2 * (1 * 2 * 7 * 8) * 8  # layers x (k, v) x elements x float64 bytes
    cache.reset()
    assert cache.get_seq_length() == 0 and cache.kept_length() == 0


def test_generate_with_sink_cache():
    m = llama(layers=2, attn="sdpa").float()
    prompt = torch.randint(4, 80, (1, 6), generator=torch.Generator().manual_seed(7))
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        ref = m.generate(prompt, **kw)
        big = m.generate(prompt, cache=SinkCache(m, n_sink=4, window=60), **kw)
        with pytest.warns(FutureWarning):  # the older keyword, deprecated in transformers 5 but accepted
            old_kw = m.generate(prompt, past_key_values=SinkCache(m, n_sink=4, window=60), **kw)
        cache = SinkCache(m, n_sink=2, window=4)
        small = m.generate(prompt, cache=cache, **kw)
    assert torch.equal(big, ref) and torch.equal(old_kw, ref)  # nothing evicted: greedy decoding is unchanged
    assert small.shape == ref.shape and torch.equal(small[:, :6], prompt)
    assert cache.get_seq_length() == 6 + 20 - 1 and cache.kept_length() == 6
    # the same tokens as a manual loop with the same cache semantics
    seq, c = prompt, SinkCache(m, n_sink=2, window=4)
    with torch.no_grad():
        logits = m(prompt, cache=c, use_cache=True).logits[:, -1]
        for _ in range(20):
            nxt = logits.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits = m(nxt, cache=c, use_cache=True).logits[:, -1]
    assert torch.equal(seq, small)


def test_generate_after_eviction_equals_forward_over_kept_tokens():
    """generate() with a small SinkCache (2 sinks + 4 recent, absolute positions from generate, a prefill that
    fills the cache, then 16 decode steps, 14 of them after an eviction): every step's logits equal a
    from-scratch forward (no cache at all) over exactly the kept tokens followed by the fed token, at
    positions 0..K. One layer, float64 (compared in float32, as generate returns logits): a kept token's key and value depend only on the token and its
    position. The test above compares generate with a loop through the same cache only; this one would
    fail for a cache that evicts the wrong tokens or does not re-rotate the kept keys."""
    m = llama(layers=1)
    n_sink, window, P, new = 2, 4, 6, 16
    prompt = torch.randint(4, 80, (1, P), generator=torch.Generator().manual_seed(10))
    cache = SinkCache(m, n_sink=n_sink, window=window)
    with torch.no_grad():
        out = m.generate(prompt, cache=cache, max_new_tokens=new, do_sample=False, pad_token_id=0,
                         output_logits=True, return_dict_in_generate=True)
    seq, logits = out.sequences, out.logits  # (1, P + new); new x (1, V), which generate returns in float32
    assert len(logits) == new
    with torch.no_grad():
        assert torch.allclose(logits[0], m(prompt).logits[:, -1].float(), atol=1e-6)  # the prompt fits: all of it
        for step in range(1, new):
            t = P - 1 + step  # the token fed at this step; the cache has seen t tokens
            kept = kept_positions(t, n_sink, window)
            assert len(kept) == n_sink + window
            ref = m(seq[:, kept + [t]]).logits[:, -1].float()
            assert torch.allclose(logits[step], ref, atol=1e-6), step
            assert int(logits[step].argmax()) == int(seq[0, t + 1])


def test_partial_rotary_model():
    """GPT-NeoX rotates only the first quarter of each head's dimensions."""
    m = tiny_neox()
    m.config.num_hidden_layers = 1
    m.gpt_neox.layers = m.gpt_neox.layers[:1]
    m = m.double()
    ids = torch.randint(0, 80, (1, 30), generator=torch.Generator().manual_seed(8))
    cache = SinkCache(m, n_sink=2, window=6)
    assert cache.layers[0].rotation.rotary_dim < m.config.hidden_size // m.config.num_attention_heads
    with torch.no_grad():
        for t in range(30):
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True,
                    position_ids=torch.tensor([[cache.kept_length()]])).logits[:, -1]
            ref = m(ids[:, kept_positions(t, 2, 6) + [t]]).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-7), t


def test_gemma3_sliding_layers_keep_their_own_window():
    """Gemma 3 mixes sliding and global layers: with global layers that never evict, the sink cache
    must equal transformers' own cache, whose sliding layers keep sliding_window - 1 tokens."""
    from transformers import DynamicCache

    m = tiny_gemma3(sliding_window=5)
    ids = torch.randint(0, 80, (1, 24), generator=torch.Generator().manual_seed(9))
    sink = SinkCache(m, n_sink=4, window=60)
    assert [layer.is_sliding for layer in sink.layers] == [True, False, True, False]
    assert sink.layers[0].window == 4 and sink.layers[0].n_sink == 0
    ref_cache = DynamicCache(config=m.config)
    with torch.no_grad():
        for t in range(24):
            got = m(ids[:, t : t + 1], cache=sink, use_cache=True).logits
            ref = m(ids[:, t : t + 1], cache=ref_cache, use_cache=True).logits
            assert torch.allclose(got, ref, atol=1e-10), t
    assert sink.layers[0].kept == 4 and sink.kept_length() == 24


@pytest.mark.parametrize("kw,msg", [
    ({"n_sink": 4, "window": 0}, "window must be"),
    ({"n_sink": -1, "window": 8}, "n_sink"),
    ({"n_sink": 8, "window": 121}, "exceeds the model's context of 128"),
])
def test_bad_arguments(kw, msg):
    with pytest.raises(InputError, match=msg):
        SinkCache(llama(), **kw)


def test_unsupported_models_are_named():
    with pytest.raises(InputError, match="gpt2 uses learned absolute position embeddings"):
        SinkCache(tiny_gpt2(), n_sink=4, window=8)
    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=80, hidden_size=32, n_layer=1, n_head=4))
    with pytest.raises(InputError, match="ALiBi"):
        SinkCache(bloom, n_sink=4, window=8)
    with pytest.raises(InputError, match="transformers model"):
        SinkCache(torch.nn.Linear(2, 2), n_sink=4, window=8)


def test_padded_batch_is_refused():
    m = llama(layers=1)
    cache = SinkCache(m, n_sink=1, window=4)
    with pytest.raises(InputError, match="same position ids in every row"):
        m(torch.ones(2, 3, dtype=torch.long), cache=cache, use_cache=True,
          position_ids=torch.tensor([[0, 1, 2], [0, 0, 1]]))


def test_rotate_by_equals_rotate_with_the_offset_repeated():
    """The contiguous decode path rotates a run of keys by one scalar offset: bit-identical to the
    per-slot table for that offset repeated, and to a float64 rotation by the angle."""
    from sinklab.nn.positional import rotate_half
    from sinklab.streaming.rope import KeyRotation

    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    rot = KeyRotation(inv)
    keys = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(0))
    for d in (-7, 3, -7):  # the third call reuses the memo of the first offset: recomputed after 3
        got = rot.rotate_by(keys, d)
        assert torch.equal(got, rot.rotate(keys, torch.full((5,), d)))
        ang = d * inv.float()
        cos, sin = torch.cat((ang, ang)).cos(), torch.cat((ang, ang)).sin()
        assert torch.allclose(got, keys * cos + rotate_half(keys) * sin, atol=1e-6)


@pytest.mark.parametrize("policy", ["sinks", "window"])
def test_contiguous_path_equals_general_path_and_shares_per_step_tensors(policy):
    """window / sinks at 16 bits cut by slices (SinkCacheLayer._update_contiguous); forcing the general
    path (per-slot rotation table, index select) gives bit-identical logits, keys and positions, chunked
    calls included; the layers of one cache share the positions / order tensors of a step."""
    from sinklab.streaming.cache import SinkCacheLayer

    m = llama(layers=3, attn="sdpa")
    ids = torch.randint(0, 80, (2, 50), generator=torch.Generator().manual_seed(3))

    def run(general: bool):
        cache = SinkCache(m, policy=policy, n_sink=3 if policy == "sinks" else 0, budget=11)
        out, t = [], 0
        with torch.no_grad():
            for q in [1] * 20 + [4, 1, 6, 1, 1, 13]:
                if general:
                    for layer in cache.layers:
                        layer._contiguous = lambda: False
                out.append(m(ids[:, t : t + q], cache=cache, use_cache=True,
                             position_ids=(cache.kept_length() + torch.arange(q))[None]).logits)
                t += q
        return torch.cat(out, 1), cache

    fast, c_fast = run(False)
    slow, c_slow = run(True)
    assert torch.equal(fast, slow)
    for a, b in zip(c_fast.layers, c_slow.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert torch.equal(a.positions, b.positions) and torch.equal(a.order, b.order)
    assert all(layer.positions is c_fast.layers[0].positions for layer in c_fast.layers)
    assert isinstance(c_fast.layers[0], SinkCacheLayer) and c_fast.kept_length() == 11
