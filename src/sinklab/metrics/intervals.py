"""Intervals over a few independent units (streams, documents, seeds): Student's t, computed here.

* :func:`t_quantile` -- the quantile of Student's t distribution (the regularised incomplete beta
  function by its continued fraction, Numerical Recipes 3rd ed. section 6.4, inverted by bisection;
  no scipy).
* :func:`t_interval` -- mean +- t_{(1+level)/2, n-1} s / sqrt(n) of n values (s: the sample standard
  deviation, n - 1 in the denominator).
* :func:`paired_comparison` -- the t-interval of the mean of the per-unit differences a_i - b_i and a
  verdict that names a winner only where that interval excludes zero.

Pure functions of Python floats; float64 throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from sinklab.errors import InputError, param

__all__ = ["t_quantile", "t_interval", "paired_comparison", "Interval", "Comparison"]


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b), x in [0, 1]."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom.

    Args:
        p: probability in (0, 1). df: degrees of freedom > 0.

    Returns:
        t with P(T <= t) = p, to about 1e-12 (bisection on the CDF; e.g. t_quantile(0.975, 4) = 2.776445).

    Raises:
        InputError: ``p`` outside (0, 1) or ``df <= 0``.
    """
    if not 0.0 < p < 1.0:
        raise InputError(f"{param('p')} must lie in (0, 1), got {p}")
    if not df > 0:
        raise InputError(f"{param('df')} must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Interval:
    """A mean over n units and its two-sided t-interval (``low``, ``high`` None for n < 2)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    level: float

    def to_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n, "level": self.level}


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The mean of ``values`` and its t-interval: mean +- t_{(1+level)/2, n-1} * s / sqrt(n).

    Args:
        values: n >= 1 finite numbers (one per unit: stream, document, seed).
        level: coverage in (0, 1).

    Returns:
        :class:`Interval`; n = 1 gives the value and no interval (None bounds); n values all equal give
        a zero-width interval.

    Raises:
        InputError: no values, a NaN or infinite value, or ``level`` outside (0, 1).
    """
    xs = [float(v) for v in values]
    if not xs:
        raise InputError(f"{param('values')} is empty: an interval needs at least one value")
    if not all(math.isfinite(x) for x in xs):
        raise InputError(f"{param('values')} must be finite, got {xs}")
    if not 0.0 < level < 1.0:
        raise InputError(f"{param('level')} must lie in (0, 1), got {level}")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n < 2:
        return Interval(mean, None, None, n, level)
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * s / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level)


@dataclass(frozen=True)
class Comparison:
    """A paired comparison of A and B over the same units: the interval of mean(a_i - b_i) and the verdict
    (``"A"``/``"B"``: that one is better, the interval excluding zero; ``"inconclusive"``: it does not, or
    fewer than 2 units)."""

    a: str
    b: str
    difference: Interval
    better: str

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, **{f"diff_{k}": v for k, v in self.difference.to_dict().items()},
                "better": self.better}


def paired_comparison(a: Sequence[float], b: Sequence[float], *, names: tuple[str, str] = ("A", "B"),
                      lower_is_better: bool = True, level: float = 0.95) -> Comparison:
    """Compare two configurations measured on the same units: the t-interval of the paired differences
    a_i - b_i (unit i the same in both, e.g. the same stream), and which is better only where that interval
    excludes zero.

    Args:
        a, b: n values each, paired by position.
        names: the names of A and B in the verdict.
        lower_is_better: True for losses (NLL, KL), False for scores (top-1 agreement).
        level: coverage of the interval.

    Returns:
        :class:`Comparison` whose ``better`` is a name of ``names`` or ``"inconclusive"``.

    Raises:
        InputError: lengths differ, or as :func:`t_interval`.
    """
    if len(a) != len(b):
        raise InputError(f"paired values of different lengths: {len(a)} and {len(b)}")
    diff = t_interval([float(x) - float(y) for x, y in zip(a, b)], level)
    better = "inconclusive"
    if diff.low is not None and (diff.low > 0 or diff.high < 0):
        a_lower = diff.high < 0
        better = names[0] if a_lower == lower_is_better else names[1]
    return Comparison(names[0], names[1], diff, better)
