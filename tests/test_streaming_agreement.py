"""Agreement with the full cache in the streaming harness: KL(full || policy) and top-1 agreement per
configuration, per chunk and overall (issue 35 part 1).

References: the full cache's logits from a plain forward, the policy's from the token-by-token
SinkCache, and the KL computed by hand in float64 (a Python loop over the vocabulary), independently of
:mod:`sinklab.metrics.agreement`.
"""

from __future__ import annotations

import math

import pytest
import torch

from sinklab.streaming import SinkCache, cache_specs, evaluate_stream
from sinklab.streaming.harness import policy_specs
from test_streaming_cache import llama, stream_logits

N = 30


def _sharp():
    """A float32 tiny LLaMA with sharp attention (evictions move the logits)."""
    m = llama(layers=2).float()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return m


def _naive_kl(full_row: torch.Tensor, row: torch.Tensor) -> float:
    """KL(p || q) in nats, float64, by hand: softmax with the max subtracted, then a loop over tokens."""
    a, b = full_row.double().tolist(), row.double().tolist()
    ma, mb = max(a), max(b)
    za = sum(math.exp(x - ma) for x in a)
    zb = sum(math.exp(x - mb) for x in b)
    kl = 0.0
    for x, y in zip(a, b):
        lp, lq = x - ma - math.log(za), y - mb - math.log(zb)
        kl += math.exp(lp) * (lp - lq)
    return kl


def test_kl_and_top1_equal_a_naive_float64_computation():
    m = _sharp()
    ids = torch.randint(0, 80, (N,), generator=torch.Generator().manual_seed(7))
    specs = cache_specs(window=6, sinks=[2], recompute=False)
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=10, max_context=128, latency_steps=2,
                                              progress=False)}
    with torch.no_grad():
        full = m(ids[None]).logits[0, :-1]  # (N - 1, V): plain causal attention
    pol = stream_logits(m, ids[None], SinkCache(m, n_sink=2, window=6), cache_positions=True)[0, :-1]
    kls = [_naive_kl(full[t], pol[t]) for t in range(N - 1)]
    agree = [float(full[t].argmax() == pol[t].argmax()) for t in range(N - 1)]
    r = res["sinks_2"]
    assert r.agreement_positions == N - 1
    assert r.kl == pytest.approx(sum(kls) / len(kls), rel=1e-4, abs=1e-9)
    assert r.top1 == pytest.approx(sum(agree) / len(agree))
    by_chunk = [sum(kls[a : a + 10]) / len(kls[a : a + 10]) for a in range(0, N - 1, 10)]
    assert r.kl_by_chunk == pytest.approx(by_chunk, rel=1e-4, abs=1e-9)
    assert r.top1_by_chunk == pytest.approx([sum(agree[a : a + 10]) / len(agree[a : a + 10])
                                             for a in range(0, N - 1, 10)])
    # positions 0..7 see the whole history (2 sinks + window 6): nothing evicted yet, KL ~ 0 there
    assert max(kls[:8]) < 1e-9 and r.kl > 1e-4  # and an evicting cache moves the distribution afterwards
    assert res["full"].kl == 0.0 and res["full"].top1 == 1.0


@pytest.mark.parametrize("mode", ["parallel", "decode"])
def test_a_cache_that_keeps_everything_agrees_exactly(mode):
    """window@64 on a 30-token stream keeps every token: the same computation as the full cache, so KL is
    exactly 0 and top-1 exactly 1, in every chunk; an evicting window at the same stream does not."""
    m = _sharp()
    ids = torch.randint(0, 80, (N,), generator=torch.Generator().manual_seed(8))
    specs = policy_specs(["window"], [64, 5], window=8, recompute=False)
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=10, max_context=128, latency_steps=2,
                                              mode=mode, progress=False)}
    keep, evict = res["window@64"], res["window@5"]
    assert keep.kl == 0.0 and keep.top1 == 1.0
    assert keep.kl_by_chunk == [0.0, 0.0, 0.0] and keep.top1_by_chunk == [1.0, 1.0, 1.0]
    assert evict.kl > 1e-4 and evict.top1 < 1.0 and evict.kl_by_chunk[0] < evict.kl_by_chunk[-1]
    assert evict.agreement_positions == N - 1


def test_stacked_policies_and_recompute_get_agreement_and_full_context_limits_it():
    """Token-by-token policies decoded in a stacked batch and recompute are scored against the same
    reference; past the model's context (here 20) the full cache has no logits, so no agreement there."""
    m = _sharp()
    ids = torch.randint(0, 80, (N,), generator=torch.Generator().manual_seed(9))
    specs = policy_specs(["h2o", "window"], [64], window=8, recompute=True)
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=10, max_context=128, recompute_every=3,
                                              latency_steps=2, progress=False)}
    assert res["h2o@64"].kl == pytest.approx(0.0, abs=1e-9) and res["h2o@64"].top1 == 1.0  # nothing evicted
    assert res["recompute"].agreement_positions == len(range(0, N - 1, 3))
    assert res["recompute"].kl > 1e-4  # a window of 8 from scratch differs from the whole history
    small = evaluate_stream(m, ids, policy_specs(["window"], [5], window=8, recompute=False), chunk=10,
                            max_context=20, latency_steps=2, progress=False)
    assert small[0].name == "full" and small[0].agreement_positions == 19
    assert small[1].agreement_positions == 19 and small[1].evaluated == N - 1
    assert small[1].kl_by_chunk[-1] is None  # positions 20..28 have no full-cache reference


def test_agreement_without_the_full_configuration_and_off():
    m = _sharp()
    ids = torch.randint(0, 80, (N,), generator=torch.Generator().manual_seed(10))
    with_full = {r.name: r for r in evaluate_stream(m, ids, policy_specs(["window"], [5], window=8, recompute=False),
                                                    chunk=10, max_context=128, latency_steps=2, progress=False)}
    alone = evaluate_stream(m, ids, policy_specs(["window"], [5], window=8, full=False, recompute=False), chunk=10,
                            max_context=128, latency_steps=2, progress=False)
    assert [r.name for r in alone] == ["window@5"] and alone[0].kl == with_full["window@5"].kl
    off = evaluate_stream(m, ids, policy_specs(["window"], [5], window=8, recompute=False), chunk=10,
                          max_context=128, latency_steps=2, progress=False, agreement=False)
    assert all(r.kl is None and r.top1 is None and r.kl_by_chunk == [] for r in off)
