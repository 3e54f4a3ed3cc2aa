"""KV quantisation of the streaming cache (sinklab.streaming.quant).

References computed another way: min-max quantisation written out by hand and in plain Python
floats (float64, round half to even like torch), bytes packed bit by bit with Python integers,
a 16-bit cache against the default cache bit for bit, and the quantised cache's contents against
the plain-Python quantiser applied to the exact keys/values of an unquantised cache fed the same
stream (one layer: a token's keys/values depend only on the token and its position), per token and
per channel (blocks of arrivals, full-precision residual, lossless sinks).
"""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.harness import policy_specs
from sinklab.streaming.quant import QuantKV, dequantize, pack_codes, quantize_minmax, unpack_codes
from test_streaming_cache import llama, stream_logits


def naive_qdq(xs: list[float], bits: int) -> list[float]:
    """Quantise-dequantise one group in Python floats."""
    levels = 2**bits - 1
    mn, mx = min(xs), max(xs)
    scale = (mx - mn) / levels
    if scale == 0:
        return [0 * scale + mn for _ in xs]
    return [min(max(round((x - mn) / scale), 0), levels) * scale + mn for x in xs]


def naive_token(x: torch.Tensor, bits: int, g: int) -> torch.Tensor:
    """(..., d) float64: every run of g channels quantised as one group."""
    flat = x.reshape(-1, x.shape[-1]).tolist()
    out = [sum((naive_qdq(row[a : a + g], bits) for a in range(0, len(row), g)), []) for row in flat]
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape)


def test_quantize_by_hand():
    x = torch.tensor([[0.0, 1.0, 2.5, -1.5], [3.0, 3.0, 3.0, 3.0]], dtype=torch.float64)
    codes, scale, zero = quantize_minmax(x, 2)
    # group 0: zero -1.5, scale 4/3, (x + 1.5) / scale = 1.125, 1.875, 3, 0; group 1 constant
    assert codes.tolist() == [[1, 2, 3, 0], [0, 0, 0, 0]]
    assert scale[:, 0].tolist() == [4.0 / 3.0, 0.0] and zero[:, 0].tolist() == [-1.5, 3.0]
    back = dequantize(codes, scale, zero)
    assert back.tolist() == [[-1.5 + 4.0 / 3.0, -1.5 + 8.0 / 3.0, 2.5, -1.5], [3.0, 3.0, 3.0, 3.0]]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_quantize_dequantize_equals_float64_reference(bits):
    g = torch.Generator().manual_seed(bits)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64) * 3
    x[0, 1] = 0.7  # a constant group
    codes, scale, zero = quantize_minmax(x, bits)
    got = dequantize(codes, scale, zero)
    assert torch.equal(got, naive_token(x, bits, 16))
    assert int(codes.max()) <= 2**bits - 1
    assert bool(((got - x).abs() <= scale / 2 + 1e-12).all())  # rounding error at most half a step
    # grouping along another dimension: per channel over the second axis
    codes, scale, zero = quantize_minmax(x, bits, dim=1)
    ref = naive_token(x.transpose(1, 2).contiguous(), bits, 5).transpose(1, 2)
    assert torch.equal(dequantize(codes, scale, zero), ref)


def test_pack_by_hand():
    c2 = torch.tensor([1, 2, 3, 0, 3, 3, 3, 3], dtype=torch.uint8)
    assert pack_codes(c2, 2).tolist() == [1 | 2 << 2 | 3 << 4, 255]
    c3 = torch.tensor([1, 2, 3, 4, 5, 6, 7, 0], dtype=torch.uint8)
    word = sum(v << (3 * i) for i, v in enumerate(c3.tolist()))
    assert pack_codes(c3, 3).tolist() == [word & 255, word >> 8 & 255, word >> 16 & 255]
    c4 = torch.tensor([15, 1], dtype=torch.uint8)
    assert pack_codes(c4, 4).tolist() == [15 | 1 << 4]
    with pytest.raises(InputError, match="multiple of 8 codes"):
        pack_codes(torch.zeros(12, dtype=torch.uint8), 3)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_unpack_round_trip(bits):
    codes = torch.randint(0, 2**bits, (2, 3, 5, 64), generator=torch.Generator().manual_seed(bits)).to(torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (2, 3, 5, 64 * bits // 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_codes(packed, bits, 64), codes)


@pytest.mark.parametrize("policy", ["window", "sinks", "h2o", "tova", "sinks+h2o", "sinks+tova", "detected-sinks"])
def test_16_bits_is_bit_identical_to_the_unquantised_cache(policy):
    m = llama(layers=2)
    ids = torch.randint(0, 80, (2, 30), generator=torch.Generator().manual_seed(3))
    a = stream_logits(m, ids, SinkCache(m, policy=policy, budget=8), cache_positions=True)
    b = stream_logits(m, ids, SinkCache(m, policy=policy, budget=8, kv_bits=16, kv_group=4), cache_positions=True)
    assert torch.equal(a, b)


def test_options_that_would_do_nothing_are_refused():
    """Storage options on a 16-bit cache, more lossless tokens than the budget, an eps no part of the cache uses:
    each is refused in one line instead of being accepted and ignored (SinkCache and the stream tasks' specs)."""
    m = llama(layers=1)
    for kw, match in [(dict(key_quant="channel"), "key_quant='channel'"),
                      (dict(sinks_full_precision=3), "sinks_full_precision=3"),
                      (dict(sinks_full_precision="detected"), "sinks_full_precision='detected'")]:
        with pytest.raises(InputError, match=f"{match} set\\(s\\) quantised storage.*kv_bits below 16"):
            SinkCache(m, policy="sinks", budget=8, kv_bits=16, **kw)
    with pytest.raises(InputError, match="sinks_full_precision=9 exceeds the budget 8"):
        SinkCache(m, policy="sinks", budget=8, kv_bits=4, kv_group=4, sinks_full_precision=9)
    SinkCache(m, policy="sinks", budget=8, kv_bits=4, kv_group=4, sinks_full_precision=8)  # all of it: allowed
    with pytest.raises(InputError, match="eps=0.2 is used by the detected-sinks policy .* this cache \\(sinks, 4 bits\\)"):
        SinkCache(m, policy="sinks", budget=8, kv_bits=4, kv_group=4, eps=0.2)
    m_eager = llama(layers=1, attn="eager")
    SinkCache(m_eager, policy="detected-sinks", budget=8, eps=0.2)
    SinkCache(m_eager, policy="sinks", budget=8, kv_bits=4, kv_group=4, sinks_full_precision="detected", eps=0.2)
    with pytest.raises(InputError, match="sinks_full_precision=4, kv_group=8 set\\(s\\) quantised storage"):
        policy_specs(["sinks"], [64], kv_bits=[16], sinks_full_precision=[0, 4], kv_group=8)
    with pytest.raises(InputError, match="sinks_full_precision=128 exceeds the budget 64"):
        policy_specs(["sinks"], [64, 256], kv_bits=[16, 4], sinks_full_precision=[0, 128])
    specs = policy_specs(["sinks"], [64], kv_bits=[16, 4], sinks_full_precision=[0, 4], kv_group=8)
    assert [s.name for s in specs] == ["full", "sinks@64", "sinks@64:kv4-token-fp0", "sinks@64:kv4-token-fp4", "recompute"]


def _side_by_side(key_quant: str, bits: int, group: int, lossless: int, T: int = 30, policy: str = "sinks"):
    """Feed one stream through a quantised one-layer cache; yield per step (t, the exact key/value of
    token t as the model handed them to the cache, the layer, the arrivals held before this step's
    eviction: a list, or one list per row for a policy whose rows keep their own tokens)."""
    m = llama(layers=1)
    ids = torch.randint(0, 80, (2, T), generator=torch.Generator().manual_seed(4))
    n_sink = 2 if policy == "sinks" else 0
    quant = SinkCache(m, policy=policy, budget=9, n_sink=n_sink, kv_bits=bits, kv_group=group, key_quant=key_quant,
                      sinks_full_precision=lossless)
    ql = quant.layers[0]
    seen = {}
    update = ql.update

    def spy(k, v, *args, **kwargs):
        seen["k"], seen["v"] = k[..., -1, :].clone(), v[..., -1, :].clone()
        return update(k, v, *args, **kwargs)

    ql.update = spy
    with torch.no_grad():
        for t in range(T):
            if ql.policy.needs_scores:  # per-row sets
                before = [row + [t] for row in ql.order.tolist()] if ql.kept else [[t], [t]]
            else:
                before = (ql.order.tolist() if ql.kept else []) + [t]
            m(ids[:, t : t + 1], cache=quant, use_cache=True, position_ids=torch.tensor([[quant.kept_length()]]))
            yield t, seen["k"], seen["v"], ql, before


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("lossless", [0, 3])
def test_cache_stores_per_token_quantisation(bits, lossless):
    """Keys and values per token in groups of 4 channels (head_dim 8); the first `lossless` tokens exact."""
    exact_k, exact_v = {}, {}
    for t, k, v, layer, _ in _side_by_side("token", bits, 4, lossless):
        exact_k[t], exact_v[t] = k, v
        keys, values = layer.read()
        for s, j in enumerate(layer.order.tolist()):
            want_k = exact_k[j] if j < lossless else naive_token(exact_k[j], bits, 4)
            want_v = exact_v[j] if j < lossless else naive_token(exact_v[j], bits, 4)
            assert torch.equal(keys[..., s, :], want_k) and torch.equal(values[..., s, :], want_v), (t, j)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("lossless", [0, 1])
def test_cache_stores_per_channel_keys(bits, lossless):
    """KIVI keys: each channel over a block of 4 arrivals, from the block's tokens still held when it
    completes (lossless ones left out); the block's tokens stay exact until then; values per token."""
    G = 4
    exact_k, exact_v, deq = {}, {}, {}
    for t, k, v, layer, before in _side_by_side("channel", bits, G, lossless):
        exact_k[t], exact_v[t] = k, v
        if (t + 1) % G == 0:  # block t // G completes with this token
            members = [j for j in range(t + 1 - G, t + 1) if j in before and j >= lossless]
            block = torch.stack([exact_k[j] for j in members], dim=-1)  # (B, H, d, n)
            q = naive_token(block, bits, len(members))
            for i, j in enumerate(members):
                deq[j] = q[..., i]
        keys, values = layer.read()
        for s, j in enumerate(layer.order.tolist()):
            want_k = exact_k[j] if j < lossless or j >= (t + 1) // G * G else deq[j]
            want_v = exact_v[j] if j < lossless else naive_token(exact_v[j], bits, G)  # kv_group channels
            assert torch.equal(keys[..., s, :], want_k) and torch.equal(values[..., s, :], want_v), (t, j)
        assert layer.store.res_k.shape[-2] == (t + 1) % G  # the residual: the open block's arrivals
        blocks = {j // G for j in layer.order.tolist() if lossless <= j < (t + 1) // G * G}
        assert sorted(layer.store.tab_block.tolist()) == sorted(blocks)  # freed once no member is held


def test_per_channel_values_are_per_token():
    for t, k, v, layer, _ in _side_by_side("channel", 4, 8, 0, T=12):
        _, values = layer.read()
        assert torch.equal(values[..., -1, :], naive_token(v, 4, 8))


def test_attention_policy_with_quantised_cache_per_row():
    """tova (rows keep different tokens) with 3-bit per-channel keys: contents as the reference quantiser."""
    G = 4
    exact_k, deq = {}, {}
    for t, k, v, layer, before in _side_by_side("channel", 3, G, 1, T=24, policy="tova"):
        exact_k[t] = k
        if (t + 1) % G == 0:
            for b in range(2):
                members = [j for j in range(t + 1 - G, t + 1) if j in before[b] and j >= 1]
                if members:
                    block = torch.stack([exact_k[j][b] for j in members], dim=-1)
                    q = naive_token(block, 3, len(members))
                    for i, j in enumerate(members):
                        deq[(b, j)] = q[..., i]
        keys, _ = layer.read()
        for b in range(2):
            for s, j in enumerate(layer.order[b].tolist()):
                want = exact_k[j][b] if j < 1 or j >= (t + 1) // G * G else deq[(b, j)]
                assert torch.equal(keys[b, :, s], want), (t, b, j)


def test_bytes_are_counted_honestly():
    """B 1, 2 KV heads, head_dim 8, 8 tokens held, 4 bits in groups of 4, float64, 2 lossless tokens:
    codes 2 x (2 x 8 x 4 bytes) + scales and zeros 4 x (2 x 8 x 2) x 8 bytes + lossless 2 x (2 x 2 x 8) x 8 while
    the first two tokens are kept (sinks), none once they are evicted (window: the copies were counted, and held,
    after their tokens had left the cache)."""
    m = llama(layers=1)
    quantised = 2 * (2 * 8 * 4) + 4 * (2 * 8 * 2) * 8
    for policy, lossless in (("sinks", 2 * (2 * 2 * 8) * 8), ("window", 0)):
        cache = SinkCache(m, policy=policy, budget=8, kv_bits=4, kv_group=4, sinks_full_precision=2)
        with torch.no_grad():
            m(torch.arange(12)[None], cache=cache, use_cache=True)
        assert cache.nbytes == quantised + lossless, policy
    cache = SinkCache(m, policy="window", budget=8, kv_bits=4, kv_group=4, sinks_full_precision=2)
    with torch.no_grad():  # token by token: the copies go one by one as their tokens leave the window
        for t in range(10):
            m(torch.tensor([[t]]), cache=cache, use_cache=True)
    assert cache.layers[0].store.fp_k.shape[-2] == 0 and cache.layers[0].store.fp_start == 2
    dense = SinkCache(m, policy="window", budget=8)
    with torch.no_grad():
        m(torch.arange(12)[None], cache=dense, use_cache=True)
    assert dense.nbytes == 2 * (2 * 8 * 8) * 8
    assert dense.state_nbytes == 2 * 8 * 8  # positions and arrival indices, int64


@pytest.mark.parametrize("kw,msg", [
    ({"kv_bits": 5}, "kv_bits must be one of 16, 8, 4, 3, 2"),
    ({"kv_bits": 4, "key_quant": "head"}, "key_quant must be token or channel"),
    ({"kv_bits": 4, "kv_group": 0}, "kv_group must be an integer >= 1"),
    ({"kv_bits": 4, "sinks_full_precision": -1}, "sinks_full_precision must be"),
])
def test_bad_quantisation_options(kw, msg):
    with pytest.raises(InputError, match=msg):
        SinkCache(llama(layers=1), policy="sinks", budget=8, **kw)


def test_group_that_does_not_divide_head_dim_is_refused():
    m = llama(layers=1)
    cache = SinkCache(m, policy="sinks", budget=8, kv_bits=4, kv_group=3)
    with pytest.raises(InputError, match="kv_group 3 must divide head_dim 8 .*the channels of one token's key and value"):
        m(torch.ones(1, 2, dtype=torch.long), cache=cache, use_cache=True)
    cache = SinkCache(m, policy="sinks", budget=8, kv_bits=4, kv_group=3, key_quant="channel")
    with pytest.raises(InputError, match="kv_group 3 must divide head_dim 8 .*the values' channels of one token"):
        m(torch.ones(1, 2, dtype=torch.long), cache=cache, use_cache=True)  # (a channel-mode key block is in tokens)
    store = QuantKV(3, 8)
    with pytest.raises(InputError, match="head_dim 12 is not a multiple of 8"):
        store.init(torch.zeros(1, 1, 1, 12), torch.zeros(1, 1, 1, 12))


@pytest.mark.parametrize("key_quant", ["token", "channel"])
def test_quantised_decode_equals_attention_over_the_dequantised_cache(key_quant):
    """Each step equals transformers' own DynamicCache filled with the dequantised kept keys (moved to
    positions 0..K-1 by transformers' rotary module, not sinklab's) and values, the new token at K."""
    from transformers import DynamicCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = llama(layers=1)
    ids = torch.randint(0, 80, (2, 28), generator=torch.Generator().manual_seed(5))
    cache = SinkCache(m, policy="sinks", budget=9, n_sink=2, kv_bits=3, kv_group=4, key_quant=key_quant,
                      sinks_full_precision=1)
    layer = cache.layers[0]
    with torch.no_grad():
        for t in range(28):
            K = cache.kept_length()
            dyn = DynamicCache(config=m.config)
            if K:
                keys, values = layer.read()  # rotated at layer.positions
                cos, sin = m.model.rotary_emb(values, (torch.arange(K) - layer.positions)[None])
                moved, _ = apply_rotary_pos_emb(keys, keys, cos, sin)
                dyn.update(moved, values, 0)
            ref = m(ids[:, t : t + 1], cache=dyn, use_cache=True, position_ids=torch.tensor([[K]])).logits
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[K]])).logits
            assert torch.allclose(got, ref, atol=1e-6), t  # transformers' rotary tables are float32
