"""Prefill-time cache policies (snapkv, pyramidkv, knorm; sinklab.streaming.policies.PrefillPolicy).

References computed another way: hand-worked attention weights and keys fed to the policies (the kept
sets worked out on paper in each docstring), the pooling and PyramidKV's budgets worked by hand, the
kept sets re-derived in plain Python from a full forward's attention weights / keys, and after the
cut a from-scratch forward over exactly the kept tokens (one layer, float64, at the cache positions
0..K the cache gives them, the new token at K).
"""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.policies import make_policy, pool_scores, pyramid_budgets
from test_streaming_cache import llama

PREFILL = ["snapkv", "pyramidkv", "knorm"]


def prompt_weights(n: int, last_two: dict[int, float]) -> torch.Tensor:
    """(1, 2, n, n) causal weights of an n-token prompt, 2 heads alike: every query on itself, except the
    last two queries, which give ``last_two[j]`` to token j and the rest to themselves."""
    w = torch.eye(n, dtype=torch.float64)[None, None].repeat(1, 2, 1, 1)
    for i in (n - 2, n - 1):
        for j, v in last_two.items():
            w[0, :, i, j] = v
        w[0, :, i, i] = 1.0 - sum(last_two.values())
    return w


def cut(pol, n: int, weights=None, keys=None) -> list[int]:
    """One prompt call of n tokens through a policy: the slots it keeps (row 0)."""
    if keys is not None:
        pol.observe_keys(keys)
    if weights is not None:
        pol.observe(weights, n)
    keep = pol.keep(n, torch.arange(n)[None])
    return list(range(n)) if keep is None else keep[0].tolist()


#: the hand-worked case: 10 prompt tokens; the last two queries vote 0.3 for token 6, 0.2 for token 3,
#: 0.1 for token 1, 0.05 for token 5 (nothing for the others); keys whose norms rank 0 < 2 < 4 < 7 < the rest
VOTES = {6: 0.3, 3: 0.2, 1: 0.1, 5: 0.05}
NORMS = [0.5, 3.0, 1.0, 3.1, 1.5, 3.2, 3.3, 2.0, 3.4, 3.5]


def hand_keys() -> torch.Tensor:
    """(1, 1, 10, 2) keys of norms NORMS, pointing anywhere (the direction does not matter)."""
    k = torch.zeros(1, 1, 10, 2, dtype=torch.float64)
    for j, v in enumerate(NORMS):
        k[0, 0, j] = torch.tensor([0.6 * v, 0.8 * v])
    return k


def test_each_prefill_policy_keeps_a_token_the_others_drop_by_hand():
    """Budget 4, observation window 2, no pooling (kernel 1).

    SnapKV: the window (tokens 8, 9) and the 2 best-voted earlier tokens, 6 (0.6 summed over the two
    window queries) and 3 (0.4): [3, 6, 8, 9]. PyramidKV over 2 layers at the same budget: free slots
    4 - 2 = 2 per layer on average, top layer 2 // 20 = 0, bottom layer 2 * 2 - 0 = 4: budgets [6, 2].
    Layer 0 keeps the window and the 4 best-voted (6, 3, 1, 5): [1, 3, 5, 6, 8, 9]: tokens 1 and 5, which
    SnapKV drops; layer 1 keeps the window only, dropping 3 and 6. Key norm: the 4 lowest norms, tokens
    0 (0.5), 2 (1.0), 4 (1.5), 7 (2.0): [0, 2, 4, 7], each dropped by the other two, which keep 8 and 9."""
    w = prompt_weights(10, VOTES)
    opts = {"observation_window": 2, "kernel_size": 1}
    snap_pol = make_policy("snapkv", 4, options=opts)
    snap = cut(snap_pol, 10, w)
    assert snap_pol.score[0, :8].topk(2).indices.tolist() == [6, 3]  # score order; the cache keeps stream order
    assert pyramid_budgets(4, 2, 2) == [6, 2]
    pyr = [cut(make_policy("pyramidkv", b, options=opts), 10, w) for b in (6, 2)]
    kn = cut(make_policy("knorm", 4), 10, keys=hand_keys())
    assert snap == [3, 6, 8, 9]
    assert pyr == [[1, 3, 5, 6, 8, 9], [8, 9]]
    assert kn == [0, 2, 4, 7]
    assert set(pyr[0]) - set(snap) - set(kn) == {1, 5}  # PyramidKV keeps what the others drop
    assert set(snap) - set(pyr[1]) - set(kn) == {3, 6}  # SnapKV keeps what PyramidKV's top layer and knorm drop
    assert set(kn) - set(snap) - set(pyr[0]) - set(pyr[1]) == {0, 2, 4, 7}


def test_snapkv_pooling_by_hand():
    """Votes [0, 1, 0, 0, 0, .5, .5, 0] pooled over 3 slots with zero padding: avgpool divides by 3
    (padding counted), maxpool takes the largest neighbour. In a prompt whose last two queries give
    token 1 0.4, token 2 0.1 and token 5 0.3 (votes 0.8, 0.2, 0.6 over the two), kernel 1 keeps the two
    best-voted, 1 and 5; kernel 3 averages the neighbours: token 1 and 2 (0.8 + 0.2) / 3 = 0.33, token
    5 0.6 / 3 = 0.2, so it keeps 1 and 2."""
    x = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0]], dtype=torch.float64)
    avg = pool_scores(x, 3, "avgpool")[0].tolist()
    assert avg == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0, 0.5 / 3, 1 / 3, 1 / 3, 0.5 / 3])
    assert pool_scores(x, 3, "maxpool")[0].tolist() == [1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5]
    w = prompt_weights(10, {1: 0.4, 2: 0.1, 5: 0.3})
    raw = cut(make_policy("snapkv", 4, options={"observation_window": 2, "kernel_size": 1}), 10, w)
    pooled = cut(make_policy("snapkv", 4, options={"observation_window": 2, "kernel_size": 3}), 10, w)
    assert raw == [1, 5, 8, 9] and pooled == [1, 2, 8, 9]


def test_pyramid_budgets_by_hand():
    """Budget 40, window 8: 32 free slots per layer on average; top layer 32 // 20 = 1, bottom 63.
    3 layers: the line 63, 32, 1 (sum 96 = 3 x 32). 4 layers: 63, 42.33, 21.67, 1 rounded down to
    63, 42, 21, 1 (sum 127), the slot left to the largest remainder (21.67): 63, 42, 22, 1 (sum 128)."""
    assert pyramid_budgets(40, 3, 8) == [71, 40, 9]
    assert pyramid_budgets(40, 4, 8) == [71, 50, 30, 9]
    assert sum(pyramid_budgets(64, 30, 16)) == 30 * 64
    assert pyramid_budgets(12, 1, 4) == [12]


def test_prefill_policy_options_are_checked():
    with pytest.raises(InputError, match="kernel_size"):
        make_policy("snapkv", 8, options={"kernel_size": 4})
    with pytest.raises(InputError, match="pooling"):
        make_policy("snapkv", 8, options={"pooling": "median"})
    with pytest.raises(InputError, match="policy_options"):
        make_policy("knorm", 8, options={"observation_window": 2})
    with pytest.raises(InputError, match="observation_window"):
        SinkCache(llama(layers=1), policy="snapkv", budget=8, policy_options={"observation_window": 0})


def naive_keep(policy: str, A: torch.Tensor, keys: torch.Tensor, budget: int, window: int) -> list[int]:
    """The rule in plain Python on one row: A (H, n, n) the prompt's weights, keys (H_kv, n, d)."""
    n = A.shape[-1]
    if policy == "knorm":
        score = {j: -sum(float(keys[h, j].norm()) for h in range(keys.shape[0])) for j in range(n)}
        return sorted(sorted(range(n), key=lambda j: -score[j])[:budget])
    H = A.shape[0]
    votes = [[sum(float(A[h, i, j]) for i in range(n - window, n)) for j in range(n - window)] for h in range(H)]
    pooled = [[sum(v[j + d] for d in (-2, -1, 0, 1, 2) if 0 <= j + d < len(v)) / 5 for j in range(len(v))]
              for v in votes]
    score = {j: sum(p[j] for p in pooled) / H for j in range(n - window)}
    best = sorted(score, key=lambda j: -score[j])[: budget - window]
    return sorted(best + list(range(n - window, n)))


@pytest.mark.parametrize("policy", PREFILL)
def test_after_the_prompt_equals_forward_over_kept_tokens_in_stream_order(policy):
    """One layer, float64, GQA: a 20-token prompt in one call, cut to 8 by the rule recomputed from the
    full forward's weights / keys; then each decode step (first in, first out) equals a fresh forward
    over exactly the kept tokens (cache positions 0..K) and the new token. The kept tokens are sorted
    by arrival although the scores rank them otherwise (the order kvpress's topk leaves)."""
    m = llama(layers=1)
    with torch.no_grad():
        m.model.layers[0].self_attn.q_proj.weight.mul_(8.0)  # peaked attention: scores far from uniform
    ids = torch.randint(0, 80, (1, 26), generator=torch.Generator().manual_seed(3))
    opts = {"observation_window": 3} if policy != "knorm" else None
    cache = SinkCache(m, policy=policy, budget=8, policy_options=opts)
    with torch.no_grad():
        full = m(ids[:, :20], output_attentions=True)
        pre = m(ids[:, :20], cache=cache, use_cache=True).logits
        assert torch.allclose(pre, full.logits, atol=1e-10)  # the prompt attends to all of itself
        layer = cache.layers[0]
        keys = m.model.layers[0].self_attn.k_proj(m.model.layers[0].input_layernorm(m.model.embed_tokens(ids[:, :20])))
        keys = keys.view(1, 20, 2, 8).transpose(1, 2)[0]  # (H_kv, 20, d): norms do not depend on RoPE
        expect = naive_keep(policy, full.attentions[0][0], keys, 8, 3)
        assert layer.order[0].tolist() == expect
        assert expect != list(range(12, 20))  # not a window
        by_score = layer.policy.score[0].argsort(descending=True).tolist() if policy != "knorm" else \
            layer.policy.norms[0].argsort().tolist()
        assert by_score != sorted(by_score)  # score order differs from stream order
        kept = list(expect)
        for t in range(20, 26):
            got = m(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[cache.kept_length()]]))
            ref = m(ids[:, kept + [t]]).logits[:, -1]
            assert torch.allclose(got.logits[:, -1], ref, atol=1e-8), (t, (got.logits[:, -1] - ref).abs().max())
            kept = (kept + [t])[1:]  # decode step: the oldest kept token goes
            assert layer.order[0].tolist() == kept


def test_pyramidkv_layers_keep_their_budgets_and_a_later_chunk_is_exact():
    """Two layers, layer 0's attention output zeroed (so the logits depend on layer 1's cache only, and
    layer 1's keys on each token alone): PyramidKV budgets at mean 8, observation window 3: 5 free slots
    on average, top layer 5 // 20 = 0, bottom 10: [13, 3]; a second multi-token call after the cut
    (transformers builds one mask from layer 0's 13 kept slots; layer 1 keeps 3) equals a fresh forward
    over layer 1's kept tokens and the new ones."""
    m = llama(layers=2)
    with torch.no_grad():
        m.model.layers[0].self_attn.o_proj.weight.zero_()
        m.model.layers[1].self_attn.q_proj.weight.mul_(8.0)
    ids = torch.randint(0, 80, (1, 24), generator=torch.Generator().manual_seed(4))
    cache = SinkCache(m, policy="pyramidkv", budget=8, policy_options={"observation_window": 3})
    assert [l.policy.budget for l in cache.layers] == pyramid_budgets(8, 2, 3) == [13, 3]
    with torch.no_grad():
        m(ids[:, :20], cache=cache, use_cache=True)
        assert [l.kept for l in cache.layers] == [13, 3]
        kept = cache.layers[1].order[0].tolist()
        assert kept == [17, 18, 19]
        got = m(ids[:, 20:23], cache=cache, use_cache=True, position_ids=torch.arange(13, 16)[None]).logits
        ref = m(ids[:, kept + [20, 21, 22]]).logits[:, -3:]
        assert torch.allclose(got, ref, atol=1e-8)
        assert [l.kept for l in cache.layers] == [13, 3]


def test_pyramidkv_on_gpt_neox_trims_each_layers_mask():
    """GPT-NeoX hands its attention the cache as ``layer_past``, which the per-layer mask trim did not look for: a
    second call after PyramidKV's cut raised a size mismatch (outside audit, 2026-12-07). The later chunk now equals a
    fresh forward over layer 1's kept tokens and the new ones (layer 0's output zeroed, as above)."""
    from helpers import tiny_neox

    m = tiny_neox()
    m.set_attn_implementation("eager")  # the policy reads the attention weights
    with torch.no_grad():
        m.gpt_neox.layers[0].attention.dense.weight.zero_()
        m.gpt_neox.layers[0].attention.dense.bias.zero_()
    ids = torch.randint(0, 80, (1, 24), generator=torch.Generator().manual_seed(4))
    cache = SinkCache(m, policy="pyramidkv", budget=8, policy_options={"observation_window": 3})
    n = [l.policy.budget for l in cache.layers]
    assert len(set(n)) > 1
    with torch.no_grad():
        m(ids[:, :20], past_key_values=cache, use_cache=True)
        kept = cache.layers[-1].order[0].tolist()
        got = m(ids[:, 20:23], past_key_values=cache, use_cache=True,
                position_ids=torch.arange(n[0], n[0] + 3)[None]).logits
        assert [l.kept for l in cache.layers] == n
        ref = m(ids[:, kept + [20, 21, 22]]).logits[:, -3:]
    assert torch.allclose(got, ref, atol=1e-6), (got - ref).abs().max()


@pytest.mark.parametrize("policy", PREFILL)
def test_rows_keep_their_own_tokens(policy):
    """Two rows of different prompts keep different tokens, each its own rule (row-wise equal to the
    row run alone)."""
    m = llama(layers=1)
    ids = torch.randint(0, 80, (2, 16), generator=torch.Generator().manual_seed(5))
    opts = {"observation_window": 2} if policy != "knorm" else None
    both = SinkCache(m, policy=policy, budget=6, policy_options=opts)
    with torch.no_grad():
        m(ids, cache=both, use_cache=True)
        for b in range(2):
            one = SinkCache(m, policy=policy, budget=6, policy_options=opts)
            m(ids[b : b + 1], cache=one, use_cache=True)
            assert one.layers[0].order[0].tolist() == both.layers[0].order[b].tolist()
    assert both.layers[0].order[0].tolist() != both.layers[0].order[1].tolist()


def test_fresh_copies_keep_the_options_as_given():
    """A row's cache of a padded batch is a fresh copy of the policy: the default observation window
    (32, capped at half the budget: 18 at budget 36) stays the default, an explicit one stays."""
    assert make_policy("snapkv", 36).window == 18 and make_policy("snapkv", 36).fresh().window == 18
    assert make_policy("snapkv", 36, options={"observation_window": 30}).fresh().window == 30
