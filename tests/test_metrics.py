"""Sink metrics against naive float64 loops and hand-worked cases."""

import math

import pytest
import torch

from sinklab.errors import InputError
from sinklab.metrics import (
    attention_mass,
    attention_mass_from_column_sums,
    bootstrap_sink_rate_ci,
    norm_ratio,
    sink_rate,
    sink_rate_per_head,
    sink_rate_per_layer,
)


def random_causal_attention(*shape, T, seed=0, sharpen=3.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(*shape, T, T, generator=g, dtype=torch.float64) * sharpen
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def naive_mass(A, causal=True):
    T = A.shape[-1]
    out = torch.zeros(A.shape[:-2] + (T,), dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(s) for s in A.shape[:-2]]).reshape(-1, A.dim() - 2):
        a = A[tuple(idx.tolist())]
        for j in range(T):
            qs = range(j, T) if causal else range(T)
            out[tuple(idx.tolist()) + (j,)] = sum(float(a[i, j]) for i in qs) / len(qs)
    return out


def naive_sink_rate(mass, eps, K):
    N, L, H, _ = mass.shape
    rates = []
    for k in range(K):
        per_sample = []
        for n in range(N):
            hits = sum(1 for l in range(L) for h in range(H) if mass[n, l, h, k] > eps)
            per_sample.append(100.0 * hits / (L * H))
        rates.append(sum(per_sample) / N)
    return torch.tensor(rates, dtype=torch.float64)


def test_attention_mass_matches_naive_causal():
    A = random_causal_attention(2, 3, T=7)
    torch.testing.assert_close(attention_mass(A), naive_mass(A), rtol=0, atol=1e-12)


def test_attention_mass_bidirectional():
    g = torch.Generator().manual_seed(3)
    A = torch.softmax(torch.randn(2, 6, 6, generator=g, dtype=torch.float64), -1)
    torch.testing.assert_close(attention_mass(A, causal=False), naive_mass(A, causal=False), rtol=0, atol=1e-12)


def test_uniform_causal_attention_closed_form():
    # A[i, j] = 1/(i+1) for j <= i (0-based) => alpha_j = (H_T - H_j) / (T - j), H_n harmonic numbers.
    T = 64
    i = torch.arange(T, dtype=torch.float64)
    A = torch.ones(T, T, dtype=torch.float64).tril() / (i[:, None] + 1)
    harmonic = lambda n: sum(1.0 / m for m in range(1, n + 1))
    expected = torch.tensor([(harmonic(T) - harmonic(j)) / (T - j) for j in range(T)], dtype=torch.float64)
    torch.testing.assert_close(attention_mass(A), expected, rtol=0, atol=1e-12)
    assert math.isclose(float(attention_mass(A)[0]), 0.0741, abs_tol=1e-4)  # DESIGN.md's "about 0.074"
    # the largest mass is on token 1 and still far below eps = 0.3: no sink anywhere
    assert int(attention_mass(A).argmax()) == 0
    rate = sink_rate(attention_mass(A).reshape(1, 1, 1, T), 0.3)
    assert float(rate.max()) == 0.0


def test_head_always_on_first_token_has_sink_rate_100():
    T = 10
    A = torch.zeros(T, T, dtype=torch.float64)
    A[:, 0] = 1.0
    mass = attention_mass(A).reshape(1, 1, 1, T).expand(3, 2, 4, T)
    rate = sink_rate(mass, 0.3, positions=4)
    torch.testing.assert_close(rate, torch.tensor([100.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_sink_rate_matches_naive_and_breakdowns():
    A = random_causal_attention(5, 3, 4, T=9, seed=1)  # (N, L, H, T, T)
    mass = attention_mass(A)
    for eps in (0.1, 0.3, 0.5):
        torch.testing.assert_close(sink_rate(mass, eps, 6), naive_sink_rate(mass, eps, 6))
    per_layer = sink_rate_per_layer(mass, 0.3, 6)
    per_head = sink_rate_per_head(mass, 0.3, 6)
    assert per_layer.shape == (3, 6) and per_head.shape == (3, 4, 6)
    # averaging the breakdowns recovers the overall rate
    torch.testing.assert_close(per_layer.mean(0), sink_rate(mass, 0.3, 6))
    torch.testing.assert_close(per_head.mean((0, 1)), sink_rate(mass, 0.3, 6))
    # a hand-checked entry
    l, h, k = 1, 2, 0
    expected = 100.0 * sum(float(mass[n, l, h, k]) > 0.3 for n in range(5)) / 5
    assert per_head[l, h, k].item() == pytest.approx(expected)


def test_threshold_is_strict_and_per_sample():
    # sample 0 has mass exactly eps (not counted), sample 1 above
    mass = torch.tensor([0.3, 0.31], dtype=torch.float64).reshape(2, 1, 1, 1)
    assert sink_rate(mass, 0.3).tolist() == [50.0]


def test_column_sums_route_equals_attention_mass():
    A = random_causal_attention(2, 2, T=8, seed=4)
    torch.testing.assert_close(attention_mass_from_column_sums(A.sum(-2)), attention_mass(A))


def test_bootstrap_ci():
    A = random_causal_attention(40, 2, 3, T=6, seed=5, sharpen=2.0)
    mass = attention_mass(A)
    ci = bootstrap_sink_rate_ci(mass, 0.3, 4, n_boot=500, seed=0)
    rate = sink_rate(mass, 0.3, 4)
    assert ci.shape == (4, 2)
    assert torch.all(ci[:, 0] <= rate + 1e-9) and torch.all(rate <= ci[:, 1] + 1e-9)
    assert torch.equal(ci, bootstrap_sink_rate_ci(mass, 0.3, 4, n_boot=500, seed=0))  # reproducible
    # identical samples: the interval collapses to the point estimate
    same = mass[:1].expand(10, -1, -1, -1)
    ci_same = bootstrap_sink_rate_ci(same, 0.3, 4, n_boot=100)
    torch.testing.assert_close(ci_same[:, 0], sink_rate(same, 0.3, 4))
    torch.testing.assert_close(ci_same[:, 1], sink_rate(same, 0.3, 4))
    # one sample: no interval (NaN), not [x, x]
    assert torch.isnan(bootstrap_sink_rate_ci(mass[:1], 0.3, 4)).all()


def test_bootstrap_ci_covers_the_true_rate_95_percent_of_the_time():
    """Known sampling distribution: masses uniform on [0, 1], so each (sample, layer, head) is above eps = 0.3
    with probability 0.7 and the true sink rate is 70% at every position. Over 300 repeated probe sets of
    N = 40 samples (64 heads each, 4 positions: 1200 intervals) the 95% interval must contain 70% about 95% of
    the time, and its width must match the normal theory's 2 * 1.96 * sigma / sqrt(N), with sigma the per-sample
    rate's standard deviation 100 * sqrt(0.7 * 0.3 / 64). A stub that returns the point estimate as both
    bounds covers ~0%, one that returns [0, 100] covers 100%: both fail."""
    g = torch.Generator().manual_seed(0)
    R, N, H, K, eps, true = 300, 40, 64, 4, 0.3, 70.0
    covered, widths = 0, []
    for r in range(R):
        mass = torch.rand(N, 1, H, K, generator=g, dtype=torch.float64)
        ci = bootstrap_sink_rate_ci(mass, eps, K, n_boot=400, seed=r)
        covered += int(((ci[:, 0] <= true) & (true <= ci[:, 1])).sum())
        widths.append(ci[:, 1] - ci[:, 0])
    coverage = covered / (R * K)
    assert 0.92 <= coverage <= 0.975, coverage  # binomial sd of the coverage over 1200 intervals: 0.6 points
    sigma = 100 * math.sqrt(0.7 * 0.3 / H)
    assert float(torch.cat(widths).mean()) == pytest.approx(2 * 1.96 * sigma / math.sqrt(N), rel=0.08)


def test_norm_ratio_naive():
    g = torch.Generator().manual_seed(2)
    h = torch.rand(3, 4, 5, generator=g, dtype=torch.float64) + 0.1
    ref = torch.zeros(3, 5, dtype=torch.float64)
    ref_med = torch.zeros(3, 5, dtype=torch.float64)
    for n in range(3):
        for t in range(5):
            ref[n, t] = sum(h[n, l, t] / (sum(h[n, l]) / 5) for l in range(4)) / 4
            ref_med[n, t] = sum(h[n, l, t] / sorted(h[n, l].tolist())[2] for l in range(4)) / 4
    torch.testing.assert_close(norm_ratio(h, "mean"), ref)
    torch.testing.assert_close(norm_ratio(h, "median"), ref_med)


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.1, 1.5])
def test_eps_outside_unit_interval(eps):
    with pytest.raises(InputError, match="eps"):
        sink_rate(torch.zeros(1, 1, 1, 4), eps)


def test_bad_shapes():
    with pytest.raises(InputError):
        attention_mass(torch.zeros(3, 4))
    with pytest.raises(InputError):
        sink_rate(torch.zeros(3, 4), 0.3)
    with pytest.raises(InputError):
        norm_ratio(torch.ones(1, 1, 2), "max")


def test_top_sink_ignores_keys_seen_by_few_queries():
    """The last key is seen only by the last query; a self-attending last token is not a 'sink'."""
    from sinklab.capture.stats import ProbeStats
    from sinklab.metrics import summarize
    from sinklab.metrics.summary import rankable_positions

    T = 20
    A = torch.zeros(T, T, dtype=torch.float64)  # causal, rows sum to 1
    for i in range(T):
        if i < 3:
            A[i, i] = 1.0
        elif i == 3:
            A[3, 3] = 1.0
        else:
            A[i, 3], A[i, i] = 0.4, 0.6  # a real sink at position 3 for every query i > 3
    assert torch.equal(A, A.tril()) and torch.allclose(A.sum(-1), torch.ones(T, dtype=torch.float64))
    mass = attention_mass(A).reshape(1, 1, 1, T)
    # mass on the last key is A[T-1, T-1] = 0.6 > eps; position 3 has (1 + 16 * 0.4) / 17 = 0.4 + 0.6/17
    assert float(mass[0, 0, 0, -1]) == pytest.approx(0.6)
    assert float(mass[0, 0, 0, 3]) == pytest.approx(0.4 + 0.6 / 17)
    stats = ProbeStats(mass=mass, hidden_norms=torch.ones(1, 1, T), max_abs=torch.ones(1, 1),
                       median_abs=torch.ones(1, 1), max_position=torch.zeros(1, 1, dtype=torch.long),
                       max_channel=torch.zeros(1, 1, dtype=torch.long))
    s = summarize(stats, 0.3, 4, n_boot=10)
    assert rankable_positions(T, True) == 19 and rankable_positions(T, False) == T
    assert s["top_sink_position"] == 3 and s["top_sink_rate"] == 100.0


# ---------------------------------------------------------------- mask-aware metrics and Sink*
def brute_force_counts(T, *, causal=True, prefix_len=0, window=None):
    """Queries that may attend each key, by enumerating every (query, key) pair."""
    out = []
    for j in range(T):
        n = 0
        for i in range(T):
            ok = (j <= i or j < prefix_len) if causal else True
            if window is not None:
                ok = ok and abs(i - j) < window
            n += ok
        out.append(float(n))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("T,causal,p,w", [(9, True, 0, None), (9, True, 4, None), (9, True, 0, 3), (9, True, 4, 2),
                                         (9, False, 0, None), (9, False, 0, 4), (5, True, 5, None), (6, True, 0, 10)])
def test_visible_key_counts_brute_force(T, causal, p, w):
    from sinklab.attention_masks import MaskSpec
    from sinklab.metrics import visible_key_counts

    torch.testing.assert_close(visible_key_counts(T, MaskSpec(causal=causal, prefix_len=p, window=w)),
                               brute_force_counts(T, causal=causal, prefix_len=p, window=w), rtol=0, atol=0)


def test_visible_mass_equals_paper_mass_for_plain_causal():
    from sinklab.metrics import attention_mass_visible_from_column_sums, visible_key_counts

    A = random_causal_attention(3, 2, T=10, seed=7)
    vis = attention_mass_visible_from_column_sums(A.sum(-2), visible_key_counts(10))
    torch.testing.assert_close(vis, attention_mass(A), rtol=0, atol=0)


def test_sliding_window_sink_is_invisible_to_the_paper_formula():
    """A head whose every query puts all its weight on key 0 whenever key 0 is in its window (w = 8, T = 64):
    the paper's mass on key 0 is 8/64 = 0.125 < eps (Sink_1 = 0 by construction), the visible mass is 1."""
    from sinklab.attention_masks import MaskSpec
    from sinklab.metrics import attention_mass_visible_from_column_sums, visible_key_counts

    T, w = 64, 8
    A = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        if i < w:
            A[i, 0] = 1.0
        else:  # key 0 out of the window: uniform over the window
            A[i, i - w + 1 : i + 1] = 1.0 / w
    paper = attention_mass(A)
    vis = attention_mass_visible_from_column_sums(A.sum(-2), visible_key_counts(T, MaskSpec(window=w)))
    assert float(paper[0]) == pytest.approx(8 / 64)
    assert float(vis[0]) == pytest.approx(1.0)
    assert sink_rate(paper.reshape(1, 1, 1, T), 0.3)[0] == 0.0
    assert sink_rate(vis.reshape(1, 1, 1, T), 0.3)[0] == 100.0


def test_sink_rate_virtual_hand_worked():
    from sinklab.metrics import sink_rate_virtual

    extra = torch.tensor([[[0.9, 0.1], [0.31, 0.3]], [[0.0, 0.0], [1.0, 0.5]]], dtype=torch.float64)  # (N=2, L=2, H=2)
    # sample 0: 0.9 and 0.31 exceed 0.3 (0.3 does not: strict) -> 2 of 4; sample 1: 1.0 and 0.5 -> 2 of 4
    assert sink_rate_virtual(extra, 0.3) == pytest.approx(50.0)
    assert sink_rate_virtual(extra, 0.95) == pytest.approx(12.5)
    with pytest.raises(InputError):
        sink_rate_virtual(extra[0], 0.3)


def test_per_layer_and_per_head_check_shapes():
    with pytest.raises(InputError, match="N, L, H, T"):
        sink_rate_per_layer(torch.zeros(3, 4), 0.3)
    with pytest.raises(InputError, match="N, L, H, T"):
        sink_rate_per_head(torch.zeros(2, 3, 4), 0.3)


def test_attention_mass_of_a_prefix_lm_counts_only_queries_at_or_after_the_key():
    """Eq. 2 averages A[i, j] over the queries i >= j. A prefix LM's earlier queries also see the prefix keys; summing
    them too gave key 1 a "mass" of 1.0857 (> 1) in an audit. Reference: a float64 loop over i >= j (as measure)."""
    from sinklab.attention_masks import MaskSpec, build_mask

    T, p = 8, 4
    g = torch.Generator().manual_seed(0)
    vis = build_mask(T, T, MaskSpec(causal=True, prefix_len=p))  # (T, T) bool
    a = torch.rand(2, 3, T, T, generator=g, dtype=torch.float64).masked_fill(~vis, 0.0)
    a = a / a.sum(-1, keepdim=True)
    want = torch.stack([torch.stack([a[..., j:, j].mean(-1)]) for j in range(T)], -1)[0]  # (2, 3, T)
    got = attention_mass(a, causal=True)
    assert torch.allclose(got, want, atol=1e-15) and bool((got <= 1).all())
    causal = a.masked_fill(~build_mask(T, T, MaskSpec(causal=True)), 0.0)  # plain causal: unchanged
    assert torch.equal(attention_mass(causal), causal.sum(-2) / torch.arange(T, 0, -1, dtype=torch.float64))


def test_a_nan_attention_mass_is_refused_not_counted_as_no_sink():
    """(mass > eps) is False for NaN: one NaN sample of four, all sinks, gave Sink_1 75.0 instead of an error."""
    from sinklab.errors import InputError
    from sinklab.metrics import bootstrap_sink_rate_ci, sink_rate_per_layer, sink_rate_virtual

    mass = torch.full((4, 2, 3, 5), 0.05, dtype=torch.float64)
    mass[..., 0] = 0.9
    assert sink_rate(mass)[0].item() == 100.0
    mass[2, 1, 0, 3] = float("nan")
    for f in (sink_rate, sink_rate_per_layer, bootstrap_sink_rate_ci):
        with pytest.raises(InputError, match="NaN in 1 of 4 samples"):
            f(mass)
    with pytest.raises(InputError, match="NaN in 1 of 4 samples"):
        sink_rate_virtual(mass[..., 3])


def test_a_prefix_longer_than_the_sequence_makes_every_key_a_prefix_key():
    from sinklab.attention_masks import MaskSpec
    from sinklab.metrics import visible_key_counts

    assert visible_key_counts(3, MaskSpec(causal=True, prefix_len=4)).tolist() == [3.0, 3.0, 3.0]
    assert visible_key_counts(3, MaskSpec(causal=True, prefix_len=3)).tolist() == [3.0, 3.0, 3.0]
