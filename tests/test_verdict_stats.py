"""Study statistics (sinklab.sweep.verdict): Student-t intervals, Welch differences, TOST, Holm, against
hand-worked values and scipy's own tests."""

import math

import pytest
from scipy import stats

from sinklab.sweep.summary import add_verdicts
from sinklab.sweep.verdict import holm, hypothesis_test, one_sample_p, t_interval, verdict, welch


def test_t_interval_hand_worked():
    m, lo, hi = t_interval([1.0, 2.0, 6.0])
    # mean 3, s = sqrt(7), sem = sqrt(7/3) = 1.527525; t(0.975, 2) = 4.302653
    assert m == 3.0
    assert hi - 3.0 == pytest.approx(4.302653 * math.sqrt(7 / 3), rel=1e-6)
    assert lo == pytest.approx(6.0 - hi)
    assert math.isnan(t_interval([5.0])[1])


def test_one_sample_and_welch_match_scipy():
    a, b = [12.0, 15.5, 9.0, 20.0, 14.0], [30.0, 22.0, 41.0, 35.5, 28.0]
    assert one_sample_p(a, 10.0) == pytest.approx(stats.ttest_1samp(a, 10.0).pvalue, rel=1e-9)
    d = welch(b, a)
    ref = stats.ttest_ind(b, a, equal_var=False)
    assert d.p() == pytest.approx(ref.pvalue, rel=1e-9)
    ci = ref.confidence_interval(0.95)
    assert (d.lo, d.hi) == (pytest.approx(ci.low, rel=1e-9), pytest.approx(ci.high, rel=1e-9))
    assert d.d == pytest.approx(sum(b) / 5 - sum(a) / 5)


def test_holm_hand_worked():
    # sorted 0.01, 0.03, 0.04 -> 3 * 0.01, max(., 2 * 0.03), max(., 1 * 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, math.nan, 0.2]) == pytest.approx([0.5, math.nan, 0.4], nan_ok=True)
    assert holm([0.9, 0.8]) == [1.0, 1.0]


def test_tost_similar_and_zero_spread():
    ref = [18.0, 20.0, 16.0, 19.0, 17.0]
    p, supports, status = hypothesis_test("similar", [19.0, 18.0, 20.0, 17.0, 18.5], ref_values=ref)
    assert status is None and supports is True and p < 0.05
    d = welch([19.0, 18.0, 20.0, 17.0, 18.5], ref)
    assert p == pytest.approx(max(d.p(-10.0, "greater"), d.p(10.0, "less")))
    assert verdict("similar", [50.0, 52.0, 48.0, 51.0, 49.0], ref_values=ref) == "disagrees"
    # every seed at 0: a zero spread decides (p = 0) when the null value is elsewhere
    assert one_sample_p([0.0] * 5, 10.0) == 0.0
    assert verdict("no_sink", [0.0] * 5) == "agrees"


def test_holm_makes_a_marginal_row_inconclusive():
    """One row alone would agree at p < 0.05; among five tested rows its Holm-adjusted p does not
    (it is second largest: its p is doubled)."""
    lvl = 10.0
    marginal = [11.0, 13.0, 16.0, 10.5, 14.0]  # one-sample p about 0.045 against 10
    p = one_sample_p(marginal, lvl)
    assert 0.025 < p < 0.05
    rows = [{"label": "ref", "expect": "reference", "sink1_seeds": "40;42;44;41;43"},
            {"label": "m", "expect": "sink", "sink1_seeds": ";".join(map(str, marginal))},
            {"label": "x", "expect": "no_sink", "sink1_seeds": "0;0;0;0;0"},
            {"label": "y", "expect": "higher", "sink1_seeds": "80;82;84;81;83"},
            {"label": "w", "expect": "sink", "sink1_seeds": "5;15;25;0;10"},  # p = 0.83: undecided
            {"label": "z", "sink1_seeds": "30;31;29;30;30"}]
    add_verdicts(rows, lvl)
    by = {r["label"]: r for r in rows}
    assert verdict("sink", marginal, level=lvl) == "agrees"  # alone
    assert by["m"]["verdict"] == "inconclusive" and by["m"]["p_holm"] == pytest.approx(2 * p, rel=1e-4)
    assert by["w"]["verdict"] == "inconclusive"
    assert by["ref"]["verdict"] == by["x"]["verdict"] == by["y"]["verdict"] == "agrees"
    assert by["z"]["verdict"] == "" and by["z"]["effect"] == pytest.approx(30.0 - 42.0)
    d = welch([80, 82, 84, 81, 83], [40, 42, 44, 41, 43])
    assert (by["y"]["effect_lo"], by["y"]["effect_hi"]) == (pytest.approx(d.lo, abs=1e-4), pytest.approx(d.hi, abs=1e-4))
    assert by["ref"]["effect"] is None
