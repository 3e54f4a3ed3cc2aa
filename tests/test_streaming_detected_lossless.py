"""``sinks_full_precision = "detected"``: the sinks sinklab's metric flags kept lossless in a quantised cache.

References computed another way: on hand-made float64 tensors, the store's contents against the
plain-Python quantiser of tests/test_streaming_quant.py (flagged slots exact, the others
quantise-dequantised) and its bytes counted by hand; on a one-layer float64 model, the flags
re-derived in plain Python from the attention weights the model returns (``output_attentions``,
not the cache's hook): a token is lossless iff the metric flagged it at the end of its arrival
step and at every step since; the cache's keys/values against the exact ones the model handed
it, quantised by the plain-Python reference where not lossless.
"""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.harness import policy_specs
from sinklab.streaming.quant import QuantKV, make_store, parse_sinks_full_precision
from test_streaming_cache import llama
from test_streaming_quant import naive_token

EPS = 0.2  # a random tiny model's attention is nearly uniform: 0.2 flags some tokens and not others


def test_store_by_hand_flagged_slots_exact_others_quantised():
    """B 1, 1 head, head_dim 8, 2 bits in groups of 4, float64. Step 1: 3 tokens, flags T F T. Step 2: a
    4th token, flags F F T T: slot 0 loses its copy, slot 3 gets one. Then slot 0 is evicted."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 1, 4, 8, generator=g, dtype=torch.float64) * 2
    v = torch.randn(1, 1, 4, 8, generator=g, dtype=torch.float64)
    st = QuantKV(2, 4, "token", "detected")
    st.init(k[..., :0, :], v[..., :0, :])
    st.append(k[..., :3, :], v[..., :3, :], torch.arange(3))
    st.mark_lossless(torch.tensor([[True, False, True]]))
    keys, values = st.read(torch.arange(3))
    for j, exact in enumerate([True, False, True]):
        want_k = k[0, 0, j] if exact else naive_token(k[0, 0, j], 2, 4)
        want_v = v[0, 0, j] if exact else naive_token(v[0, 0, j], 2, 4)
        assert torch.equal(keys[0, 0, j], want_k) and torch.equal(values[0, 0, j], want_v), j
    assert not torch.equal(naive_token(k[0, 0, 1], 2, 4), k[0, 0, 1])  # 2 bits do lose something here
    st.append(k[..., 3:, :], v[..., 3:, :], torch.arange(4))
    st.mark_lossless(torch.tensor([[False, False, True, True]]))
    keys, values = st.read(torch.arange(4))
    for j, exact in enumerate([False, False, True, True]):
        want_k = k[0, 0, j] if exact else naive_token(k[0, 0, j], 2, 4)
        assert torch.equal(keys[0, 0, j], want_k), j
    assert st.fp_idx.tolist() == [[-1, -1, 0, 1]] and st.fp_k.shape[-2] == 2
    # bytes: codes 2 x 4 slots x 2 bytes; scales + zeros 4 x 4 x 2 groups x 8; copies 2 x 2 x 8 x 8; index 4 x 8
    assert st.nbytes == 2 * 4 * 2 + 4 * 4 * 2 * 8 + 2 * 2 * 8 * 8 + 4 * 8
    st.select(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 3]))
    keys, _ = st.read(torch.tensor([1, 2, 3]))
    assert torch.equal(keys[0, 0, 1:], k[0, 0, 2:]) and torch.equal(keys[0, 0, 0], naive_token(k[0, 0, 1], 2, 4))
    st.select(torch.tensor([0, 2]), torch.tensor([1, 3]))  # slot of token 2 evicted: its copy freed
    assert st.fp_idx.tolist() == [[-1, 0]] and st.fp_k.shape[-2] == 1
    assert torch.equal(st.fp_k[0, 0, 0], k[0, 0, 3])


def test_store_rows_pad_to_the_longest():
    """Two rows with 2 and 0 flagged slots: copies stored (2, H, 2, d), each row reads its own."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(2, 2, 3, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 3, 8, generator=g, dtype=torch.float64)
    st = QuantKV(3, 8, "token", "detected")
    st.init(k[..., :0, :], v[..., :0, :])
    st.append(k, v, torch.arange(3))
    st.mark_lossless(torch.tensor([[True, False, True], [False, False, False]]))
    assert st.fp_k.shape == (2, 2, 2, 8)
    keys, values = st.read(torch.arange(3))
    for b, exact in ((0, [True, False, True]), (1, [False] * 3)):
        for j, e in enumerate(exact):
            assert torch.equal(keys[b, :, j], k[b, :, j] if e else naive_token(k[b, :, j], 3, 8)), (b, j)
            assert torch.equal(values[b, :, j], v[b, :, j] if e else naive_token(v[b, :, j], 3, 8)), (b, j)


class NaiveMetric:
    """The sink metric in plain Python on one row: per kept arrival, per-head sums of attention and counts."""

    def __init__(self, H: int) -> None:
        self.H = H
        self.mass: dict[int, list[float]] = {}
        self.count: dict[int, int] = {}

    def step(self, cur: list[int], attn) -> None:
        """``attn`` (H, len(cur)): the new query's weights on the slots ``cur`` (arrival indices)."""
        for c, j in enumerate(cur):
            self.mass[j] = [m + float(attn[h][c]) for h, m in enumerate(self.mass.get(j, [0.0] * self.H))]
            self.count[j] = self.count.get(j, 0) + 1

    def flagged(self, j: int) -> bool:
        return max(m / self.count[j] for m in self.mass[j]) > EPS


@pytest.mark.parametrize("policy,key_quant", [("sinks", "token"), ("tova", "token"), ("sinks", "channel")])
def test_cache_keeps_the_detected_sinks_exact(policy, key_quant):
    """One-layer float64 model, 2 rows, budget 9, 3 bits in groups of 4, one token per step (cache positions)."""
    m = llama(layers=1)
    B, T, bits, G = 2, 30, 3, 4
    ids = torch.randint(0, 80, (B, T), generator=torch.Generator().manual_seed(7))
    n_sink = 2 if policy == "sinks" else 0
    cache = SinkCache(m, policy=policy, budget=9, n_sink=n_sink, kv_bits=bits, kv_group=G, key_quant=key_quant,
                      sinks_full_precision="detected", eps=EPS)
    layer = cache.layers[0]
    seen, exact_k, exact_v = {}, {}, {}
    update = layer.update

    def spy(k, v, *args, **kwargs):
        seen["k"], seen["v"] = k[..., -1, :].clone(), v[..., -1, :].clone()
        return update(k, v, *args, **kwargs)

    layer.update = spy
    naive = [NaiveMetric(4) for _ in range(B)]
    lossless: list[set[int]] = [set() for _ in range(B)]
    counts = {"exact": 0, "quantised": 0, "demoted": 0}
    with torch.no_grad():
        for t in range(T):
            rows = [r + [t] for r in layer.order.tolist()] if layer.kept and layer.order.dim() == 2 else \
                [(layer.order.tolist() if layer.kept else []) + [t]] * B
            out = m(ids[:, t : t + 1], cache=cache, use_cache=True, output_attentions=True,
                    position_ids=torch.tensor([[cache.kept_length()]]))
            A = out.attentions[0]  # (B, H, 1, K + 1)
            exact_k[t], exact_v[t] = seen["k"], seen["v"]
            for b in range(B):
                naive[b].step(rows[b], A[b, :, 0].tolist())
                before = set(lossless[b])
                lossless[b] = {j for j in rows[b] if naive[b].flagged(j) and (j == t or j in lossless[b])}
                counts["demoted"] += len(before - lossless[b])
            keys, values = layer.read()
            kept = layer.order.tolist() if layer.order.dim() == 2 else [layer.order.tolist()] * B
            for b in range(B):
                for s, j in enumerate(kept[b]):
                    if j in lossless[b]:
                        assert torch.equal(keys[b, :, s], exact_k[j][b]), (t, b, j)
                        assert torch.equal(values[b, :, s], exact_v[j][b]), (t, b, j)
                        counts["exact"] += 1
                        continue
                    counts["quantised"] += 1
                    assert torch.equal(values[b, :, s], naive_token(exact_v[j][b], bits, G)), (t, b, j)
                    if key_quant == "token":
                        assert torch.equal(keys[b, :, s], naive_token(exact_k[j][b], bits, G)), (t, b, j)
                    elif j < (t + 1) // G * G:  # a closed block: quantised, so not the exact key
                        assert not torch.equal(keys[b, :, s], exact_k[j][b]), (t, b, j)
            # honest bytes: the copies as stored (rows padded to the longest) and their slot index
            M = max(len(x & set(k)) for x, k in zip(lossless, kept))
            assert layer.store.fp_k.shape[-2] == M
    assert counts["exact"] and counts["quantised"] and counts["demoted"], counts
    K = layer.kept
    per_token = B * 2 * K * (bits * 8 // 8) * 2 + 4 * B * 2 * K * 2 * 8  # codes (k, v) + scales/zeros (float64)
    if key_quant == "token":
        assert cache.nbytes == per_token + 2 * B * 2 * M * 8 * 8 + B * K * 8


def test_detected_needs_eager_attention_and_is_refused_at_16_bits():
    with pytest.raises(InputError, match="sinks_full_precision='detected' needs the attention weights"):
        SinkCache(llama(layers=1, attn="sdpa"), policy="sinks", budget=8, kv_bits=4, sinks_full_precision="detected")
    m = llama(layers=1, attn="sdpa")
    with pytest.raises(InputError, match="a 16-bit cache stores keys and values as given"):
        SinkCache(m, policy="sinks", budget=8, kv_bits=16, sinks_full_precision="detected")  # nothing to keep
    assert not SinkCache(m, policy="sinks", budget=8, kv_bits=16).needs_weights


def test_parse_and_specs():
    assert parse_sinks_full_precision("detected") == "detected" and parse_sinks_full_precision("4") == 4
    with pytest.raises(InputError, match="sinks_full_precision must be an integer >= 0 or 'detected'"):
        parse_sinks_full_precision("first")
    with pytest.raises(InputError, match="sinks_full_precision must be"):
        make_store(4, 32, "token", "sinks")
    specs = policy_specs(["sinks"], [16], kv_bits=[4], sinks_full_precision=["0", "detected"], full=False,
                         recompute=False)
    assert [s.name for s in specs] == ["sinks@16:kv4-token-fp0", "sinks@16:kv4-token-fpdetected"]
    assert [s.needs_weights for s in specs] == [False, True]
