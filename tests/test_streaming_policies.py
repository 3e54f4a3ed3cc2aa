"""Cache policies (sinklab.streaming.policies) on SinkCache: exactness against recomputation.

References computed another way: after every step, a from-scratch forward over exactly the tokens
the cache kept (per row, at cache positions 0..K, the new token at K) on a one-layer model, in
float64; the kept sets against each policy's rule re-implemented here in plain Python, fed with the
attention weights of those from-scratch forwards; the on-the-fly sink mass against
sinklab.metrics.attention_mass of a full forward's attention; hand-made attention weights for the
detected-sinks rule.
"""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import InputError, UnknownNameError
from sinklab.streaming import SinkCache
from sinklab.streaming.policies import POLICIES, make_policy
from test_streaming_cache import llama, stream_logits, tiny_gemma3

ALL = ["window", "sinks", "h2o", "tova", "sinks+h2o", "sinks+tova", "detected-sinks"]
EPS = 0.2  # detected-sinks' threshold here: a random tiny model's attention is nearly uniform


def n_sink_of(policy: str) -> int:
    return 2 if POLICIES.get(policy).uses_sinks else 0


class Naive:
    """Each policy's rule in plain Python on one row: kept arrival indices, scores per arrival."""

    def __init__(self, policy: str, budget: int, n_sink: int, eps: float = EPS) -> None:
        self.policy, self.budget, self.n_sink, self.eps = policy, budget, n_sink, eps
        self.kept: list[int] = []
        self.acc: dict[int, float] = {}  # h2o: attention accumulated since arrival (all heads, all queries)
        self.mass: dict[int, list[float]] = {}  # detected: per-head sum of attention
        self.count: dict[int, int] = {}

    def step(self, t: int, attn_last) -> None:
        """Token t arrives; ``attn_last`` (H, K+1): its query's attention on the kept tokens, then itself."""
        cur = self.kept + [t]
        H = len(attn_last)
        for c, j in enumerate(cur):
            a = [float(attn_last[h][c]) for h in range(H)]
            self.acc[j] = self.acc.get(j, 0.0) + sum(a)
            self.mass[j] = [m + x for m, x in zip(self.mass.get(j, [0.0] * H), a)]
            self.count[j] = self.count.get(j, 0) + 1
        last = {j: sum(float(attn_last[h][c]) for h in range(H)) / H for c, j in enumerate(cur)}
        B, S = self.budget, self.n_sink
        if len(cur) <= B:
            self.kept = cur
            return
        p = self.policy
        if p == "window":
            keep = cur[-B:]
        elif p == "sinks":
            keep = cur[:S] + cur[len(cur) - (B - S):]
        elif p in ("h2o", "sinks+h2o"):
            recent = (B - S) // 2
            protected = set(cur[:S]) | set(cur[len(cur) - recent:])
            rest = sorted((j for j in cur if j not in protected), key=lambda j: -self.acc[j])
            keep = sorted(protected | set(rest[: B - len(protected)]))
        elif p in ("tova", "sinks+tova"):
            protected = set(cur[:S])
            rest = sorted((j for j in cur if j not in protected), key=lambda j: -last[j])
            keep = sorted(protected | set(rest[: B - S]))
        else:  # detected-sinks
            recent = cur[len(cur) - (B - S):]
            older = cur[: len(cur) - (B - S)]

            def alpha(j):
                return [m / self.count[j] for m in self.mass[j]]

            sinks = [j for j in older if max(alpha(j)) > self.eps]
            sinks.sort(key=lambda j: -(sum(a > self.eps for a in alpha(j)) + max(alpha(j))))
            chosen = sinks[:S]
            others = [j for j in older if j not in chosen][::-1]  # most recent first
            keep = sorted(chosen + others[: S - len(chosen)] + recent)
        self.kept = keep


def peaky_llama(layers: int = 1):
    """:func:`llama` with queries scaled up 30x: attention that depends on the tokens, not near uniform."""
    m = llama(layers=layers)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(30.0)
    return m


def make_cache(m, policy, budget, **kw):
    n = n_sink_of(policy)
    extra = {"eps": EPS} if policy == "detected-sinks" else {}
    return SinkCache(m, policy=policy, budget=budget, n_sink=n, **extra, **kw)


@pytest.mark.parametrize("policy", ALL)
def test_after_every_eviction_equals_forward_over_kept_tokens(policy):
    """One layer, GQA, two rows: the decode step's logits equal a fresh forward over the kept tokens at
    cache positions 0..K, and the kept sets follow the policy's rule computed from those forwards."""
    m = peaky_llama()
    budget, T = 7, 36
    ids = torch.randint(0, 80, (2, T), generator=torch.Generator().manual_seed(11))
    cache = make_cache(m, policy, budget)
    naive = [Naive(policy, budget, n_sink_of(policy)) for _ in range(2)]
    layer = cache.layers[0]
    differed = not_window = False
    with torch.no_grad():
        for t in range(T):
            kept_before = [list(nv.kept) for nv in naive]
            differed |= kept_before[0] != kept_before[1]
            not_window |= any(k != list(range(max(0, t - budget), t)) for k in kept_before)
            if t:
                order = layer.order if layer.order.dim() == 2 else layer.order[None].expand(2, -1)
                assert order.tolist() == kept_before, t  # the cache kept what the rule keeps
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True,
                    position_ids=torch.tensor([[cache.kept_length()]])).logits[:, -1]
            for b in range(2):
                ref = m(ids[b : b + 1, kept_before[b] + [t]], output_attentions=True)
                assert torch.allclose(got[b], ref.logits[0, -1], atol=1e-8), (t, b)
                naive[b].step(t, ref.attentions[0][0, :, -1])
            assert cache.kept_length() == min(t + 1, budget)
    assert not_window == (policy != "window")  # every other policy kept tokens a window would have dropped
    if policy in ("tova", "sinks+tova", "detected-sinks"):  # (h2o's accumulated sums rank by age on this model)
        assert differed  # the rows kept different tokens at some point


@pytest.mark.parametrize("policy", ["h2o", "sinks+tova", "detected-sinks"])
def test_prompt_longer_than_budget_attends_to_itself_then_is_cut(policy):
    """A 20-token prompt in one call: all of it attends to itself (the full forward), then the cache keeps
    the budget by the rule with the prompt's attention; the next step equals a forward over those."""
    m = llama(layers=1)
    ids = torch.randint(0, 80, (1, 24), generator=torch.Generator().manual_seed(12))
    cache = make_cache(m, policy, 8)
    with torch.no_grad():
        full = m(ids[:, :20], output_attentions=True)
        pre = m(ids[:, :20], cache=cache, use_cache=True).logits
        assert torch.allclose(pre, full.logits, atol=1e-8)
        A = full.attentions[0][0]  # (H, 20, 20)
        S, B = n_sink_of(policy), 8
        if policy == "h2o":
            acc = A.sum(dim=(0, 1))
            recent = set(range(20 - 4, 20))
            rest = sorted(set(range(20)) - recent, key=lambda j: -float(acc[j]))
            expect = sorted(recent | set(rest[:4]))
        elif policy == "sinks+tova":
            last = A[:, -1].mean(0)
            rest = sorted(range(S, 20), key=lambda j: -float(last[j]))
            expect = sorted(set(range(S)) | set(rest[: B - S]))
        else:
            counts = torch.arange(20, 0, -1, dtype=torch.float64)  # queries i >= j that saw key j
            alpha = A.sum(1) / counts  # (H, 20)
            older = list(range(20 - (B - S)))
            flagged = sorted((j for j in older if float(alpha[:, j].max()) > EPS),
                             key=lambda j: -(int((alpha[:, j] > EPS).sum()) + float(alpha[:, j].max())))[:S]
            fill = [j for j in reversed(older) if j not in flagged][: S - len(flagged)]
            expect = sorted(flagged + fill + list(range(20 - (B - S), 20)))
        assert cache.layers[0].order[0].tolist() == expect
        for t in range(20, 24):
            kept = cache.layers[0].order[0].tolist()
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True).logits[:, -1]  # absolute positions: moved by RoPE
            ref = m(ids[:, kept + [t]]).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-8), t


def test_sinks_policy_is_the_default_cache_bit_for_bit():
    m = llama(layers=3)
    ids = torch.randint(0, 80, (2, 30), generator=torch.Generator().manual_seed(13))
    a = stream_logits(m, ids, SinkCache(m, n_sink=2, window=6), cache_positions=True)
    b = stream_logits(m, ids, SinkCache(m, policy="sinks", budget=8, n_sink=2), cache_positions=True)
    c = stream_logits(m, ids, SinkCache(m, policy="window", budget=6), cache_positions=True)
    d = stream_logits(m, ids, SinkCache(m, n_sink=0, window=6), cache_positions=True)
    assert torch.equal(a, b) and torch.equal(c, d)


def test_on_the_fly_sink_mass_is_sinklabs_attention_mass():
    """Nothing evicted: detected-sinks' running mass equals sinklab.metrics.attention_mass (Gu et al. Eq. 2)
    of the full forward's attention, per head and key."""
    from sinklab.metrics.sink import attention_mass

    m = llama(layers=1)
    ids = torch.randint(0, 80, (2, 16), generator=torch.Generator().manual_seed(14))
    cache = SinkCache(m, policy="detected-sinks", budget=40, n_sink=2)
    with torch.no_grad():
        m(ids[:, :5], cache=cache, use_cache=True)  # a chunk, then single tokens
        for t in range(5, 16):
            m(ids[:, t : t + 1], cache=cache, use_cache=True)
        A = m(ids, output_attentions=True).attentions[0]  # (2, H, 16, 16)
    got = cache.layers[0].policy.mass()  # (2, H, 16)
    assert torch.allclose(got, attention_mass(A), atol=1e-12)


def _feed_by_hand(pol, weights_of, steps: int = 20) -> list[int]:
    """Stream ``steps`` tokens through one policy, one query per step: ``weights_of(t, kept)`` gives the
    query's weight on each kept arrival (by arrival index), the same on 2 heads. Returns the arrivals
    kept at the end."""
    kept: list[int] = []
    for t in range(steps):
        kept.append(t)
        w = torch.zeros(1, 2, 1, len(kept), dtype=torch.float64)
        for a, v in weights_of(t, kept).items():
            w[0, :, 0, kept.index(a)] = v
        pol.observe(w, 1)
        keep = pol.keep(len(kept), torch.tensor(kept))
        if keep is not None:
            pol.select(keep)
            kept = [kept[i] for i in keep[0].tolist()]
    return kept


@pytest.mark.parametrize("policy, budget, n_sink, want", [("h2o", 3, 0, [5, 18, 19]), ("sinks+h2o", 4, 1, [0, 5, 18, 19])])
def test_h2o_keeps_the_heavy_hitter_by_hand(policy, budget, n_sink, want):
    """Hand-made weights: up to token 5 every query attends to itself only; from token 6 on it gives
    half to itself and half to token 5. So token 5's accumulated attention (1 + 0.5 per later query)
    exceeds every other token's (at most 1) from token 7 on, and h2o with a recent window of 2 keeps
    it beside the 2 most recent tokens (sinks+h2o: and token 0). A rule keeping the oldest tokens
    would keep token 0 (h2o) or token 1 (sinks+h2o) instead."""
    pol = make_policy(policy, budget, n_sink, recent=2)

    def w(t, kept):
        return {t: 1.0} if t <= 5 else {t: 0.5, 5: 0.5}

    assert _feed_by_hand(pol, w) == want
    assert float(pol.score[0, want.index(5)]) == pytest.approx(2 * (1 + 0.5 * 14))  # summed over the 2 heads


@pytest.mark.parametrize("policy, budget, n_sink, want", [("tova", 3, 0, [5, 18, 19]), ("sinks+tova", 4, 1, [0, 5, 18, 19])])
def test_tova_keeps_what_the_current_query_attends_to_by_hand(policy, budget, n_sink, want):
    """Hand-made weights: from token 6 on each query gives 0.6 to itself, 0.3 to token 5 and 0.1 to the
    previous token (before: 0.9 to itself, 0.1 to the previous). tova keeps the budget tokens the
    current query attends to most: itself, token 5 and the previous token (sinks+tova: and token 0,
    which the late queries give nothing)."""
    pol = make_policy(policy, budget, n_sink)

    def w(t, kept):
        if t == 0:
            return {0: 1.0}
        return {t: 0.9, t - 1: 0.1} if t <= 5 else {t: 0.6, 5: 0.3, t - 1: 0.1}

    assert _feed_by_hand(pol, w) == want
    assert pol.score[0].tolist() == pytest.approx([{0: 0.0, 5: 0.3, 18: 0.1, 19: 0.6}[a] for a in want])


def test_detected_sinks_keeps_a_secondary_sink_by_hand():
    """Hand-made weights, 2 heads: every query puts its weight on itself, except that from token 3 on
    head 1 gives half of it to token 3. So token 3's mass in head 1 stays >= 0.5 while any other
    token's is 1 / (queries that saw it) < 0.3 once it is 4 queries old. Budget 4 with n_sink 1: the
    cache ends with token 3 (a secondary sink; token 0 was evicted) and the 3 most recent tokens."""
    pol = make_policy("detected-sinks", 4, 1)
    kept: list[int] = []
    for t in range(20):
        kept.append(t)
        n = len(kept)
        w = torch.zeros(1, 2, 1, n, dtype=torch.float64)
        w[0, :, 0, -1] = 1.0
        if 3 in kept and t > 3:
            w[0, 1, 0, -1] = 0.5
            w[0, 1, 0, kept.index(3)] = 0.5
        pol.observe(w, 1)
        keep = pol.keep(n, torch.tensor(kept))
        if keep is not None:
            pol.select(keep)
            kept = [kept[i] for i in keep[0].tolist()]
    assert kept == [3, 17, 18, 19]
    alpha = pol.mass()[0]  # (H, 4)
    assert float(alpha[1, 0]) == pytest.approx((1 + 0.5 * 16) / 17) and float(alpha[0, 0]) == pytest.approx(1 / 17)


def test_generate_with_an_attention_based_policy():
    m = llama(layers=2, attn="eager").float()
    prompt = torch.randint(4, 80, (1, 6), generator=torch.Generator().manual_seed(15))
    kw = dict(max_new_tokens=15, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        cache = SinkCache(m, policy="sinks+h2o", budget=8, n_sink=2)
        out = m.generate(prompt, cache=cache, **kw)
        seq, c = prompt, SinkCache(m, policy="sinks+h2o", budget=8, n_sink=2)
        logits = m(prompt, cache=c, use_cache=True).logits[:, -1]
        for _ in range(15):
            nxt = logits.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
            logits = m(nxt, cache=c, use_cache=True).logits[:, -1]
    assert torch.equal(out, seq) and cache.kept_length() == 8


def test_batch_rows_stream_independently():
    m = llama(layers=2)
    ids = torch.randint(0, 80, (3, 25), generator=torch.Generator().manual_seed(16))
    both = stream_logits(m, ids, SinkCache(m, policy="tova", budget=6), cache_positions=True)
    alone = stream_logits(m, ids[2:3], SinkCache(m, policy="tova", budget=6), cache_positions=True)
    assert torch.allclose(both[2:3], alone, atol=1e-10)


def test_gemma3_sliding_layers_keep_their_window_under_h2o():
    """Budget above the stream: nothing evicted in the global layers, so h2o equals transformers' own cache."""
    from transformers import DynamicCache

    m = tiny_gemma3(sliding_window=5)
    ids = torch.randint(0, 80, (1, 20), generator=torch.Generator().manual_seed(17))
    cache, ref = SinkCache(m, policy="h2o", budget=60), DynamicCache(config=m.config)
    with torch.no_grad():
        for t in range(20):
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True).logits
            assert torch.allclose(got, m(ids[:, t : t + 1], cache=ref, use_cache=True).logits, atol=1e-10), t
    assert [layer.kept for layer in cache.layers] == [4, 20, 4, 20]


@pytest.mark.parametrize("policy", ["h2o", "sinks+tova", "detected-sinks"])
def test_sinklab_model_with_attention_based_policy(policy):
    """A one-layer sinklab model (its reference attention path hands the weights over): each step equals
    a fresh forward over the kept tokens."""
    from test_streaming_native import sinklm

    m = sinklm("softmax", "rope", layers=1)
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(18))
    cache = make_cache(m, policy, 6)
    with torch.no_grad():
        for t in range(24):
            layer = cache.layers[0]
            kept = [[] for _ in range(2)] if not layer.kept else layer.order.tolist()
            got = m(ids[:, t : t + 1], cache=cache).logits[:, -1]
            for b in range(2):
                ref = m(ids[b : b + 1, kept[b] + [t]]).logits[0, -1]
                assert torch.allclose(got[b], ref, atol=1e-8), (t, b)
    assert cache.kept_length() == 6


def test_bad_policy_arguments():
    m = llama(layers=1)
    with pytest.raises(UnknownNameError, match="unknown cache policy 'h3o'.*valid names: .*sinks\\+h2o"):
        SinkCache(m, policy="h3o", budget=8)
    with pytest.raises(InputError, match="policy h2o keeps no sink tokens"):
        SinkCache(m, policy="h2o", budget=8, n_sink=2)
    with pytest.raises(InputError, match="needs budget > n_sink"):
        SinkCache(m, policy="sinks+tova", budget=4, n_sink=4)
    with pytest.raises(InputError, match="disagrees with budget"):
        SinkCache(m, n_sink=2, window=6, budget=9)
    with pytest.raises(InputError, match="recent window must lie in"):
        SinkCache(m, policy="h2o", budget=8, recent=9)
    with pytest.raises(InputError, match="exceeds the model's context of 128"):
        SinkCache(m, policy="tova", budget=129)
    sdpa = llama(layers=1, attn="sdpa")
    with pytest.raises(InputError, match="needs the attention weights, which 'sdpa' attention"):
        SinkCache(sdpa, policy="tova", budget=8)
    cache = SinkCache(m, policy="tova", budget=8)
    m.set_attn_implementation("sdpa")  # switched after the cache was built: refused at the first call
    try:
        with pytest.raises(InputError, match="needs the attention weights"):
            m(torch.ones(1, 3, dtype=torch.long), cache=cache, use_cache=True)
    finally:
        m.set_attn_implementation("eager")
