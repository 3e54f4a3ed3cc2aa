"""Streams of the perplexity task batched (issue 35): ``evaluate_streams`` runs each configuration once over
B streams of equal length and gives each stream the numbers ``evaluate_stream`` gives it alone.

Reference: every stream evaluated alone with ``evaluate_stream`` (itself checked against the token-by-token
SinkCache, a plain forward and from-scratch recomputation in test_streaming_harness.py). A float32 tiny
LLaMA, 3 streams of 40 tokens, budgets of 12 tokens (every cache evicts), under every registered policy at
16 bits, quantised stores (3 bits, per-channel keys, a lossless first token or detected lossless sinks) under
sinks and h2o, the full cache and recompute."""

from __future__ import annotations

import math

import pytest
import torch

from sinklab.errors import InputError
from sinklab.streaming import SinkCache, StackedCache
from sinklab.streaming.harness import evaluate_stream, evaluate_streams, policy_specs
from sinklab.streaming.policies import POLICIES
from test_streaming_cache import llama

TOL = 1e-5  # NLL, KL (nats): the batched matrix products sum in another order than one row's
N, B = 40, 3


@pytest.fixture(scope="module")
def model():
    return llama(layers=2, attn="sdpa").float()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 80, (B, N), generator=torch.Generator().manual_seed(11))


def _check_row(got, alone, row: int) -> None:
    """One stream's batched results against its results alone: the same configurations, NLLs, agreement
    and positions; stream 0's bytes as alone, the other streams untimed."""
    assert [r.name for r in got] == [r.name for r in alone]
    for g, a in zip(got, alone):
        where = f"stream {row}, {g.name}"
        assert abs(math.log(g.ppl) - math.log(a.ppl)) < TOL, where
        assert len(g.nll_by_chunk) == len(a.nll_by_chunk), where
        assert all(abs(x - y) < TOL for x, y in zip(g.nll_by_chunk, a.nll_by_chunk) if x is not None), where
        assert (g.kl is None) == (a.kl is None) and abs(g.kl - a.kl) < TOL, where
        assert abs(g.top1 - a.top1) < 1e-12 and g.agreement_positions == a.agreement_positions, where
        assert (g.evaluated, g.positions, g.count_by_chunk, g.mode) == (a.evaluated, a.positions, a.count_by_chunk,
                                                                         a.mode), where
        if g.ppl_matched is not None:
            assert abs(math.log(g.ppl_matched) - math.log(a.ppl_matched)) < TOL, where
        if row == 0:
            assert (g.cache_bytes, g.state_bytes) == (a.cache_bytes, a.state_bytes), where
            assert g.latency_ms_per_token is not None and g.latency_ms_per_token > 0, where
        else:
            assert (g.latency_ms_per_token, g.cache_bytes, g.state_bytes) == (None, 0, 0), where


@pytest.mark.slow
def test_every_policy_and_a_quantised_store_batched_equals_each_stream_alone(model, ids):
    # every policy at 16 bits; quantised stores (decoded alone, see the test below) on two policies only
    specs = policy_specs(POLICIES.names(), [12], n_sink=2, window=12)
    specs += [s for s in policy_specs(["sinks", "h2o"], [12], n_sink=2, kv_bits=[3], key_quant=["channel"],
                                      sinks_full_precision=[1, "detected"], kv_group=4, window=12)
              if s.kv_bits == 3]
    assert {s.policy for s in specs} == set(POLICIES.names()) | {"full", "recompute"}
    assert len({s.name for s in specs}) == len(specs)
    assert any(s.kv_bits == 3 and s.sinks_full_precision == "detected" for s in specs)
    kw = dict(chunk=8, recompute_every=3, max_context=128, latency_steps=4, progress=False)
    got = evaluate_streams(model, ids, specs, **kw)
    assert len(got) == B
    for b in range(B):
        _check_row(got[b], evaluate_stream(model, ids[b], specs, **kw), b)
    # not vacuous: the streams differ, and so do the caches on one stream
    nll = [[math.log(r.ppl) for r in row] for row in got]
    assert min(abs(x - y) for x, y in zip(nll[0], nll[1])) > 1e-3
    by = {r.name: math.log(r.ppl) for r in got[0]}
    assert abs(by["h2o@12"] - by["window@12"]) > 1e-3 and abs(by["sinks@12:kv3-channel-fp1"] - by["sinks@12"]) > 1e-4


@pytest.mark.slow
def test_decode_mode_and_without_agreement(model, ids):
    """``mode="decode"``: full / window / sinks through one cache of B rows token by token; without a
    reference (``agreement=False``) nothing is scored against the full cache."""
    specs = policy_specs(["sinks", "window", "tova"], [12], n_sink=2, window=12, recompute=False)
    for kw in (dict(mode="decode"), dict(agreement=False)):
        kw.update(chunk=8, max_context=128, latency_steps=2, progress=False)
        got = evaluate_streams(model, ids, specs, **kw)
        for b in range(B):
            alone = evaluate_stream(model, ids[b], specs, **kw)
            if not kw.get("agreement", True):
                assert all(r.kl is None for r in got[b]) and all(r.kl is None for r in alone)
                for r in got[b] + alone:
                    r.kl, r.top1 = 0.0, 1.0  # for _check_row
            _check_row(got[b], alone, b)


def test_resumed_batch_keeps_the_done_results_and_reports_each_new_one(model, ids):
    specs = policy_specs(["sinks", "h2o"], [12], n_sink=2, window=12, recompute=False)
    kw = dict(chunk=8, max_context=128, latency_steps=0, progress=False)
    whole = evaluate_streams(model, ids, specs, **kw)
    marker = whole[1][2]
    done = [{}, {"h2o@12": marker}, {}]
    seen = []
    got = evaluate_streams(model, ids, specs, done=done, on_result=lambda row, r: seen.append((row, r.name)), **kw)
    assert got[1][2] is marker  # kept as it was
    assert sorted(seen) == sorted((b, s.name) for b in range(B) for s in specs if (b, s.name) != (1, "h2o@12"))
    for b in range(B):
        assert [r.ppl for r in got[b]] == pytest.approx([r.ppl for r in whole[b]], rel=1e-12)


def test_refusals(model, ids):
    specs = policy_specs(["sinks"], [12], n_sink=2, window=12, recompute=False)
    with pytest.raises(InputError, match=r"shape \(B, N\)"):
        evaluate_streams(model, ids[0], specs, chunk=8, progress=False)
    with pytest.raises(InputError, match="done has 1 entries for 3 streams"):
        evaluate_streams(model, ids, specs, chunk=8, progress=False, done=[{}])
    m = llama(layers=1)
    with pytest.raises(InputError, match=r"one row count >= 1 per cache, got \[1, 0\]"):
        StackedCache([SinkCache(m, n_sink=2, window=4), SinkCache(m, n_sink=2, window=4)], rows=[1, 0])


def test_stacked_cache_rows_split_the_batch(model, ids):
    """A StackedCache of a 1-row and a 2-row cache: each row computes what its stream computes alone."""
    def alone(row, **kw):
        cache = SinkCache(model, **kw)
        out = []
        with torch.no_grad():
            for t in range(N):
                pos = torch.tensor([[cache.kept_length()]])
                out.append(model(row[None, t : t + 1], cache=cache, position_ids=pos).logits[0, -1])
        return torch.stack(out)

    kw = dict(policy="tova", budget=10)
    with model_attention(model, "eager"):
        cache = StackedCache([SinkCache(model, **kw), SinkCache(model, **kw)], rows=[1, 2])
        got = []
        with torch.no_grad():
            for t in range(N):
                pos = torch.full((B, 1), cache.kept_length())
                got.append(model(ids[:, t : t + 1], cache=cache, position_ids=pos).logits[:, -1])
        got = torch.stack(got, dim=1)
        for b in range(B):
            torch.testing.assert_close(got[b], alone(ids[b], **kw), atol=1e-5, rtol=1e-4)
    assert cache.caches[1].layers[0].positions.shape[0] == 2  # one cache of two rows, each its own kept tokens


def model_attention(model, name):
    from sinklab.capture.adapter import adapt

    return adapt(model).attention(name)


@pytest.mark.integration
def test_stream_task_batched_equals_one_at_a_time(tmp_path, tiny_model_dir):
    """``sinklab.stream`` with several streams: the default batch and ``stream_batch=1`` give every stream
    the same figures, and the summary's intervals over streams agree."""
    from sinklab.streaming import stream
    from test_streaming_streams import _corpus

    ca = _corpus(tmp_path, "ca", 3, [60, 60, 60], 1)
    cb = _corpus(tmp_path, "cb", 3, [60, 60, 60], 2)
    kw = dict(corpus=f"{ca},{cb}", streams=4, tokens=40, policies=("window", "sinks", "h2o"), budgets=(12,), n_sink=2,
              window=12, recompute=False, progress=False)
    batched = stream(str(tiny_model_dir), **kw)
    one = stream(str(tiny_model_dir), stream_batch=1, **kw)
    assert batched["stream_batch"] == 4 and one["stream_batch"] == 1
    for sb, so in zip(batched["streams"], one["streams"]):
        assert sb["info"] == so["info"]
        for cb_, co in zip(sb["configs"], so["configs"]):
            assert cb_["name"] == co["name"]
            assert abs(math.log(cb_["ppl"]) - math.log(co["ppl"])) < TOL and abs(cb_["kl"] - co["kl"]) < TOL
            assert cb_["top1"] == co["top1"] and cb_["cache_bytes"] == co["cache_bytes"]
    for sb, so in zip(batched["configs"], one["configs"]):
        for f in ("nll", "nll_low", "nll_high", "kl", "kl_low", "kl_high", "top1"):
            assert sb[f] == pytest.approx(so[f], abs=TOL), (sb["name"], f)
    assert "--stream-batch 1" in one["command"] and "--stream-batch" not in batched["command"]


@pytest.mark.parametrize("name", ["h2o", "sinks+h2o", "tova", "sinks+tova"])
def test_score_policies_select_each_row_by_its_own_scores(name):
    """Hand-worked: two rows of one cache whose attention falls on different slots keep different slots. On the
    random tiny LLaMA above, H2O's accumulated scores follow token age, so every row keeps the same arrivals and
    the batched-equals-alone test cannot see a row selecting with another row's scores; this case can.
    Budget 3 with 1 protected slot (h2o: the recent slot 4; sinks+: the sink arrival 0, n_sink 1): the two other
    kept slots are each row's two highest-scoring ones."""
    from sinklab.streaming.policies import POLICIES

    n_sink = 1 if name.startswith("sinks") else 0
    opts = {"recent": 1 - n_sink} if "h2o" in name else {}
    pol = POLICIES.get(name)(budget=3, n_sink=n_sink, **opts)
    w = torch.full((2, 1, 1, 5), 0.01, dtype=torch.float64)  # (B, H, q, n): one query over 5 slots
    w[0, 0, 0, [1, 3, 4]] = torch.tensor([0.6, 0.3, 0.2], dtype=torch.float64)
    w[1, 0, 0, [2, 0, 4]] = torch.tensor([0.6, 0.3, 0.2], dtype=torch.float64)
    pol.observe(w, 1)
    kept = pol.keep(5, torch.arange(5))
    # no sinks: row 0 keeps its three heaviest (1, 3, 4), row 1 its own (0, 2, 4); h2o's protected recent slot 4 is
    # among them. sinks+: arrival 0 always, then each row's two heaviest of slots 1-4: (1, 3) and (2, 4)
    expected = [[0, 1, 3], [0, 2, 4]] if n_sink else [[1, 3, 4], [0, 2, 4]]
    assert kept.tolist() == expected


@pytest.mark.slow
def test_a_quantised_cache_gives_each_stream_exactly_its_numbers_alone(model, ids):
    """A quantised cache's code near a rounding boundary flips with the float rounding of a batch's layout (and
    of the eager attention a scoring policy beside it needs), and the flip runs through the later layers: an
    outside audit found SmolLM2's 4-bit perplexities moving by ~1% with the batch's other streams and
    configurations. Each stream is now decoded alone under each quantised configuration: its NLLs are exactly
    those of that stream with that configuration alone, whatever runs beside it."""
    specs = policy_specs(["sinks", "h2o"], [12], n_sink=2, kv_bits=[16, 4], key_quant=["channel"],
                         sinks_full_precision=[0], kv_group=4, window=12, recompute=False)
    kw = dict(chunk=8, max_context=128, latency_steps=0, progress=False)
    got = evaluate_streams(model, ids, specs, **kw)
    full = next(s for s in specs if s.kind == "full")
    quantised = [s for s in specs if s.kv_bits != 16]
    assert len(quantised) == 2
    for b in range(B):
        by = {r.name: r for r in got[b]}
        for s in quantised:
            alone = {r.name: r for r in evaluate_stream(model, ids[b], [full, s], **kw)}[s.name]
            g = by[s.name]
            assert g.ppl == alone.ppl and g.nll_by_chunk == alone.nll_by_chunk, (b, s.name)
            assert abs(g.kl - alone.kl) < TOL and g.top1 == alone.top1, (b, s.name)


def test_chunk_and_recompute_every_below_one_are_refused(model, ids, capsys):
    """An outside audit: ``chunk=-5`` ran every configuration and then failed writing (KeyError), 0 was quietly
    the default, ``recompute_every=0`` raised ZeroDivision/ValueError deep inside. Now one line, before any
    work, from Python and the CLI."""
    specs = policy_specs(["sinks"], [12], n_sink=2, window=12, recompute=False)
    for kw in (dict(chunk=0), dict(chunk=-5), dict(chunk=8, recompute_every=0)):
        with pytest.raises(InputError, match="chunk and recompute_every must be >= 1"):
            evaluate_streams(model, ids, specs, progress=False, **kw)
    from sinklab.streaming.options import PerplexityOptions
    from sinklab.streaming.run import _perplexity

    for name, v in (("chunk", 0), ("chunk", -5), ("recompute_every", -1), ("recompute_every", 0)):
        with pytest.raises(InputError, match=f"{name} must be >= 1, got {v}"):
            _perplexity(None, PerplexityOptions(**{name: v}), model=None, resume=None, on_result=None, progress=False,
                        command="")


def test_a_padded_batch_through_a_stacked_cache_is_refused():
    """A StackedCache's caches never read the attention mask, so a left-padded row kept its pads, the first ones as
    its sinks (logits up to 0.076 off the row alone; outside audit, 2026-12-07). Refused in one line; an all-ones mask
    is fine."""
    m = llama(layers=1)
    cache = StackedCache([SinkCache(m, n_sink=2, window=4), SinkCache(m, n_sink=2, window=4)])
    ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 6, dtype=torch.long)
    with torch.no_grad():
        m(ids, attention_mask=mask, past_key_values=cache)
    mask[0, :2] = 0
    with pytest.raises(InputError, match="StackedCache takes rows of equal length without padding"), torch.no_grad():
        m(ids, attention_mask=mask, past_key_values=StackedCache([SinkCache(m, n_sink=2, window=4),
                                                                  SinkCache(m, n_sink=2, window=4)]))
