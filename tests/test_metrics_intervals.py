"""t-intervals and paired comparisons over streams (issue 35 part 2), against printed t tables and a
hand-worked example."""

from __future__ import annotations

import math

import pytest

from sinklab.errors import InputError
from sinklab.metrics.intervals import paired_comparison, t_interval, t_quantile


@pytest.mark.parametrize("df,expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (7, 2.3646), (10, 2.2281),
                                         (30, 2.0423), (120, 1.9799)])
def test_t_quantile_matches_the_printed_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_t_quantile_other_levels_and_large_df_tends_to_the_normal():
    assert t_quantile(0.95, 5) == pytest.approx(2.0150, abs=1e-4)
    assert t_quantile(0.995, 3) == pytest.approx(5.8409, abs=1e-4)
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)
    assert t_quantile(0.5, 3) == 0.0


def test_t_interval_hand_worked():
    """1, 2, 3, 4, 5: mean 3, s = sqrt(10 / 4) = 1.5811, s / sqrt(5) = 0.70711, t(0.975, 4) = 2.776445:
    half width 1.963243, interval [1.036757, 4.963243]."""
    iv = t_interval([1, 2, 3, 4, 5])
    assert iv.mean == 3.0 and iv.n == 5
    assert iv.low == pytest.approx(1.036757, abs=1e-6) and iv.high == pytest.approx(4.963243, abs=1e-6)
    one = t_interval([2.5])
    assert (one.mean, one.low, one.high) == (2.5, None, None)
    flat = t_interval([4.0, 4.0, 4.0])
    assert (flat.low, flat.high) == (4.0, 4.0)


def test_paired_comparison_hand_worked():
    """a - b = -1, -1.1, -1.2: mean -1.1, s = 0.1, half width t(0.975, 2) * 0.1 / sqrt(3) = 0.248414:
    [-1.348414, -0.851586] excludes 0, A lower: A better on a loss, B better on a score."""
    a, b = [1.0, 2.0, 3.0], [2.0, 3.1, 4.2]
    c = paired_comparison(a, b, names=("sinks", "window"))
    assert c.difference.mean == pytest.approx(-1.1)
    assert c.difference.low == pytest.approx(-1.348414, abs=1e-6)
    assert c.difference.high == pytest.approx(-0.851586, abs=1e-6)
    assert c.better == "sinks"
    assert paired_comparison(a, b, names=("sinks", "window"), lower_is_better=False).better == "window"
    # unpaired the same values overlap widely; paired, the consistent difference is decided. A difference
    # whose interval straddles 0 is inconclusive:
    assert paired_comparison([1.0, 2.0, 3.0], [1.5, 1.5, 3.2]).better == "inconclusive"
    assert paired_comparison([1.0], [2.0]).better == "inconclusive"  # one stream: no interval


def test_bad_input_names_the_parameter():
    with pytest.raises(InputError, match="values"):
        t_interval([])
    with pytest.raises(InputError, match="finite"):
        t_interval([1.0, math.nan])
    with pytest.raises(InputError, match="level"):
        t_interval([1.0, 2.0], level=1.5)
    with pytest.raises(InputError, match="lengths"):
        paired_comparison([1.0], [1.0, 2.0])
    with pytest.raises(InputError, match="df"):
        t_quantile(0.9, 0)
