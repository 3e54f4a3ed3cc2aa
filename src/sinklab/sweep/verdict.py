"""Verdicts of a study's rows against the expected direction, from training seeds, with a
family-wise error control.

Each row of a study is trained with S seeds (5 or more in the committed studies); its Sink_1 is
summarised by the seed mean ``m``, the sample standard deviation ``s`` (ddof = 1) and the
two-sided 95% Student-t interval ``m +- t(0.975, S-1) s / sqrt(S)``. Every row with an
expectation gets one hypothesis test, a p-value and the side its estimate falls on:

* ``reference`` / ``sink`` -- a sink: one-sample t-test of ``m = level`` (the emergence level,
  10% by default); the estimate supports the claim when ``m > level``.
* ``no_sink`` -- no (or a near-zero) sink: the same test; supports when ``m < level``.
* ``higher`` / ``lower`` -- Sink_1 above / below the study's reference row: Welch's t-test of
  ``d = m - m_ref = 0`` (Welch-Satterthwaite degrees of freedom); supports when ``d > 0`` / ``d < 0``.
* ``similar`` -- within ``SIMILAR_MARGIN`` (10 points) of the reference: when ``|d| < margin``
  the two one-sided tests (TOST) of equivalence, supporting; otherwise the one-sided Welch test
  of ``|d| > margin``, contradicting.

The p-values of a study's rows are adjusted with Holm's step-down method (family-wise error rate
``ALPHA`` = 0.05 over the rows). A row *agrees* when its adjusted p-value is below ``ALPHA`` and
its estimate supports the claim, *disagrees* when the adjusted p-value is below ``ALPHA`` and the
estimate contradicts it, and is *inconclusive* otherwise (including rows with fewer than two
seeds). A row whose validation loss is above the loss of predicting the training unigram
distribution learned less than token frequencies: it is ``degenerate`` and gets no test (a
relative row whose reference is degenerate is inconclusive).

Every row also gets its **effect size**: ``d = m - m_ref`` with the Welch 95% interval.

A zero standard deviation (every seed the same value, e.g. Sink_1 0.0 everywhere) gives p = 0
when the means differ from the null value and p = 1 when they are equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sinklab.errors import require

_st = require("scipy.stats", "studies", "the studies' verdicts (sinklab sweep | report)")

AGREES, DISAGREES, INCONCLUSIVE, DEGENERATE, NONE = "agrees", "disagrees", "inconclusive", "degenerate", ""
EXPECTS = ("reference", "sink", "no_sink", "higher", "lower", "similar")
ALPHA = 0.05
CONFIDENCE = 0.95
SIMILAR_MARGIN = 10.0


def seed_stats(values: list[float]) -> tuple[float, float, float]:
    """(mean, sample std with ddof = 1, standard error) of per-seed values; std and sem are
    ``nan`` for one value. Raises ValueError for an empty list."""
    if not values:
        raise ValueError("no values")
    n = len(values)
    m = sum(values) / n
    if n < 2:
        return m, math.nan, math.nan
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, s, s / math.sqrt(n)


def t_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, lo, hi): the two-sided Student-t interval of the mean over seeds (lo = hi = nan with
    fewer than two values). Raises ValueError for an empty list."""
    m, _, sem = seed_stats(values)
    if math.isnan(sem):
        return m, math.nan, math.nan
    h = float(_st.t.ppf(0.5 + confidence / 2, len(values) - 1)) * sem
    return m, m - h, m + h


def _p_from_t(t: float, df: float, sided: str) -> float:
    """p-value of a t statistic: ``sided`` "two", "greater" (H1: t > 0) or "less"."""
    if sided == "two":
        return float(2 * _st.t.sf(abs(t), df))
    return float(_st.t.sf(t, df) if sided == "greater" else _st.t.cdf(t, df))


def one_sample_p(values: list[float], mu0: float, sided: str = "two") -> float:
    """p-value of the one-sample t-test of ``mean = mu0`` (nan with fewer than two values)."""
    m, _, sem = seed_stats(values)
    if math.isnan(sem):
        return math.nan
    if sem == 0:
        return 1.0 if m == mu0 else 0.0
    return _p_from_t((m - mu0) / sem, len(values) - 1, sided)


@dataclass(frozen=True)
class Difference:
    """Welch comparison of a row with the reference row: ``d = m - m_ref`` (percentage points),
    its 95% interval ``[lo, hi]``, standard error ``se`` and degrees of freedom ``df``."""

    d: float
    lo: float
    hi: float
    se: float
    df: float

    def p(self, delta: float = 0.0, sided: str = "two") -> float:
        """p-value of ``d = delta`` against ``sided`` ("two", "greater": d > delta, "less": d < delta)."""
        if math.isnan(self.se):
            return math.nan
        if self.se == 0:
            return 1.0 if self.d == delta else 0.0 if (sided == "two" or (self.d > delta) == (sided == "greater")) else 1.0
        return _p_from_t((self.d - delta) / self.se, self.df, sided)


def welch(values: list[float], ref: list[float], confidence: float = CONFIDENCE) -> Difference:
    """Welch's comparison of two sets of per-seed values (nan fields with fewer than two of either)."""
    m, s, _ = seed_stats(values)
    rm, rs, _ = seed_stats(ref)
    d = m - rm
    if math.isnan(s) or math.isnan(rs):
        return Difference(d, math.nan, math.nan, math.nan, math.nan)
    a, b = s**2 / len(values), rs**2 / len(ref)
    se = math.sqrt(a + b)
    if se == 0:
        return Difference(d, d, d, 0.0, math.inf)
    df = (a + b) ** 2 / ((a**2 / (len(values) - 1) if a else 0.0) + (b**2 / (len(ref) - 1) if b else 0.0))
    h = float(_st.t.ppf(0.5 + confidence / 2, df)) * se
    return Difference(d, d - h, d + h, se, df)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order; nan stays nan and is not counted)."""
    idx = sorted((i for i, p in enumerate(pvalues) if not math.isnan(p)), key=lambda i: pvalues[i])
    n = len(idx)
    out = [math.nan] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (n - rank) * pvalues[i]))
        out[i] = running
    return out


def hypothesis_test(expect: str, values: list[float] | None, *, ref_values: list[float] | None = None,
             level: float = 10.0, degenerate: bool = False,
             ref_degenerate: bool = False) -> tuple[float, bool | None, str | None]:
    """The hypothesis test of one row (see the module docstring): (p, supports, status).

    ``status`` is None when the row is tested (p may still be nan with fewer than two seeds), else
    the verdict itself: :data:`NONE` with ``expect`` empty, :data:`DEGENERATE` or :data:`INCONCLUSIVE`.
    ``supports``: whether the estimate lies on the claim's side (None when untested).

    Raises:
        ValueError: unknown ``expect``.
    """
    if not expect:
        return math.nan, None, NONE
    if expect not in EXPECTS:
        raise ValueError(f"unknown expectation {expect!r}")
    if not values:
        return math.nan, None, INCONCLUSIVE
    if degenerate:
        return math.nan, None, DEGENERATE
    m = sum(values) / len(values)
    if expect in ("reference", "sink", "no_sink"):
        above = m > level
        return one_sample_p(values, level), above if expect != "no_sink" else (m < level), None
    if not ref_values or ref_degenerate:
        return math.nan, None, INCONCLUSIVE
    diff = welch(values, ref_values)
    if expect == "similar":
        if abs(diff.d) < SIMILAR_MARGIN:  # TOST: both one-sided tests must reject
            p = max(diff.p(-SIMILAR_MARGIN, "greater"), diff.p(SIMILAR_MARGIN, "less"))
            return p, True, None
        side = "greater" if diff.d > 0 else "less"
        return diff.p(SIMILAR_MARGIN if diff.d > 0 else -SIMILAR_MARGIN, side), False, None
    return diff.p(), (diff.d > 0) if expect == "higher" else (diff.d < 0), None


def decide(p_adjusted: float, supports: bool | None, status: str | None) -> str:
    """The verdict of a row from its Holm-adjusted p-value and side (``status``: from :func:`hypothesis_test`)."""
    if status is not None:
        return status
    if supports is None or math.isnan(p_adjusted) or p_adjusted >= ALPHA:
        return INCONCLUSIVE
    return AGREES if supports else DISAGREES


def verdict(expect: str, values: list[float] | None, *, ref_values: list[float] | None = None,
            level: float = 10.0, degenerate: bool = False, ref_degenerate: bool = False) -> str:
    """Verdict of a single row on its own (a family of one: no Holm adjustment).

    Args:
        expect: the expectation (see the module docstring); "" = no claim.
        values: the row's per-seed Sink_1 (percent); None or empty when no run finished.
        ref_values: the reference row's per-seed Sink_1 (needed for higher/lower/similar).
        level: the emergence level (percent).
        degenerate: the row's validation loss is above the unigram baseline.
        ref_degenerate: the same for the reference row.

    Returns:
        "agrees", "disagrees", "inconclusive", "degenerate", or "" when there is no expectation.

    Raises:
        ValueError: unknown ``expect``.
    """
    p, supports, status = hypothesis_test(expect, values, ref_values=ref_values, level=level, degenerate=degenerate,
                                   ref_degenerate=ref_degenerate)
    return decide(p, supports, status)
