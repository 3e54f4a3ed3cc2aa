"""Verdicts of a study's rows against the expected direction and the paper's effect, from
training seeds, with exact tests and a family-wise error control.

Each row of a study is trained with S seeds; a quantity (Sink_1, or the attention mass on token 1:
the co-endpoint) is summarised by the seed mean ``m``, the sample standard deviation ``s``
(ddof = 1) and the two-sided 95% Student-t interval ``m +- t(0.975, S-1) s / sqrt(S)``. Every row
gets its **effect size** ``d = m - m_ref`` against the study's reference row with the Welch 95%
interval (Welch-Satterthwaite degrees of freedom).

**Tests: exact permutation tests on the seed values** (no normal model, no convention for a
zero spread). Every row with an expectation gets one test:

* ``reference`` / ``sink`` / ``no_sink`` -- the seed values against the emergence level ``L``
  (10% by default): the exact sign-flip test of ``mean(x - L) = 0`` (under H0 each deviation
  ``x_i - L`` is symmetric about 0; all ``2^S`` sign patterns are enumerated, statistic
  ``|sum(x_i - L)|``, two-sided). Supports "sink" when ``m > L``, "no_sink" when ``m < L``.
  Smallest attainable p: ``2 / 2^S`` (1/16 at S = 5: **no one-sample claim can reach 0.05 with
  5 seeds**; S >= 6 can).
* ``higher`` / ``lower`` -- the exact two-sample permutation test of the difference of means
  (all ``C(S + S_ref, S)`` splits of the pooled seeds, statistic ``|mean - mean_ref|``,
  two-sided). Smallest attainable p: ``2 / C(S + S_ref, S)`` with equal seed counts (2/252 =
  0.0079 at 5 + 5), ``1 / C(S + S_ref, S)`` otherwise.
* ``similar`` -- equivalence within ``SIMILAR_MARGIN`` (10 points): two one-sided permutation
  tests under the shift model (row values shifted by ``-+margin``), p = the larger (TOST); when
  ``|d| >= margin`` the one-sided permutation test of ``|d| > margin``, contradicting.

A statistic equal to the observed one (within 1e-9 of the data's scale) counts as "as extreme",
so ties (e.g. every seed 0.0 in both rows) give p = 1, never 0. Up to :data:`EXACT_LIMIT`
arrangements are enumerated; beyond that :data:`MC_DRAWS` random arrangements from a fixed seed
give the Monte Carlo permutation p-value ``(b + 1) / (M + 1)`` (Phipson & Smyth 2010), which is
a valid p-value (never below its own rejection rate) and is reported as such (``p_method``).

The p-values of a study's tested rows are adjusted with Holm's step-down method (family-wise
error rate ``ALPHA`` = 0.05 over the rows; one family per endpoint). Because Holm's adjustment
is monotone in every p, :func:`holm` of the rows' smallest attainable p-values is the smallest
adjusted p each row could reach (``p_holm_min``); a row whose ``p_holm_min >= ALPHA`` cannot be
decided at its seed count whatever the data (**n too small**).

**Four outcomes** (plus ``degenerate`` and "" for rows without an expectation):

* *agrees* -- Holm-adjusted p < ALPHA and the estimate on the claim's side;
* *disagrees* -- Holm-adjusted p < ALPHA and the estimate on the other side;
* *excludes the paper's effect* -- not significant, and the row's 95% interval excludes the
  paper's effect size both in points and scaled to our reference level (:func:`excludes_paper`);
  a *disagrees* row excludes it too (``excludes_paper`` column), and keeps *disagrees*;
* *inconclusive* -- none of these (also with fewer than two seeds).

The paper's effect of a row with a paper value: ``paper - paper_ref`` (points), and scaled to
our reference level ``(paper - paper_ref) * m_ref / paper_ref``; it is compared with the Welch
interval of our effect ``d``. A row whose reference has no paper value is compared on its own
t-interval with the paper value (points only). An interval of zero width (every seed equal in
both rows) is no interval: it excludes nothing.

A row whose validation loss is above the loss of predicting the training unigram distribution
learned less than token frequencies: it is ``degenerate`` and gets no test (a relative row whose
reference is degenerate is inconclusive).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from sinklab.errors import require

_st = require("scipy.stats", "studies", "the studies' verdicts (sinklab sweep | report)")

AGREES, DISAGREES, INCONCLUSIVE, DEGENERATE, NONE = "agrees", "disagrees", "inconclusive", "degenerate", ""
EXCLUDES = "excludes the paper's effect"
OUTCOMES = (AGREES, DISAGREES, EXCLUDES, INCONCLUSIVE)
EXPECTS = ("reference", "sink", "no_sink", "higher", "lower", "similar")
ALPHA = 0.05
CONFIDENCE = 0.95
SIMILAR_MARGIN = 10.0
#: most arrangements (sign patterns or splits) enumerated exactly; beyond it a Monte Carlo test
EXACT_LIMIT = 1 << 20
#: random arrangements of the Monte Carlo permutation test (fixed generator seed MC_SEED)
MC_DRAWS = 200_000
MC_SEED = 0


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


def _tol(*arrays) -> float:
    """Tolerance under which two statistics count as equal (rounding of sums of the data)."""
    scale = max([1.0] + [float(np.max(np.abs(a))) for a in arrays if len(a)])
    return 1e-9 * scale


def _check_sided(sided: str) -> None:
    if sided not in ("two", "greater", "less"):
        raise ValueError(f"sided must be 'two', 'greater' or 'less', got {sided!r}")


def sign_flip_p(values: list[float], mu0: float = 0.0, sided: str = "two") -> float:
    """p-value of the exact sign-flip (one-sample permutation) test of ``mean = mu0``.

    Under H0 the deviations ``x_i - mu0`` are symmetric about 0, so each of the ``2^n`` sign
    patterns is equally likely; p is the share of patterns whose statistic ``sum(+-(x_i - mu0))``
    is at least as extreme as the observed one (``sided``: "two" ``|T| >= |t|``, "greater"
    ``T >= t``, "less" ``T <= t``). ``n > 20`` uses :data:`MC_DRAWS` random patterns,
    ``(b + 1) / (M + 1)``. nan with fewer than two values or a non-finite one.

    Raises:
        ValueError: unknown ``sided``.
    """
    _check_sided(sided)
    dev = np.asarray(values, dtype=np.float64) - mu0
    n = len(dev)
    if n < 2 or not np.isfinite(dev).all():
        return math.nan
    t = float(dev.sum())
    tol = _tol(dev)
    if 2**n <= EXACT_LIMIT:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1)  # (2^n, n) of +-1
        stats_ = signs @ dev
        return float(np.mean(_extreme(stats_, t, tol, sided)))
    rng = np.random.default_rng(MC_SEED)
    stats_ = (rng.integers(0, 2, size=(MC_DRAWS, n)) * 2 - 1) @ dev
    return float((np.sum(_extreme(stats_, t, tol, sided)) + 1) / (MC_DRAWS + 1))


def _extreme(stats_: np.ndarray, t: float, tol: float, sided: str) -> np.ndarray:
    if sided == "two":
        return np.abs(stats_) >= abs(t) - tol
    return stats_ >= t - tol if sided == "greater" else stats_ <= t + tol


def permutation_p(values: list[float], ref: list[float], delta: float = 0.0, sided: str = "two") -> float:
    """p-value of the exact two-sample permutation test of ``mean(values) - mean(ref) = delta``.

    Under H0 (shift model) ``values - delta`` and ``ref`` are exchangeable: every split of the
    pooled ``n + n_ref`` values into groups of ``n`` and ``n_ref`` is equally likely; p is the
    share of the ``C(n + n_ref, n)`` splits whose statistic ``mean(group) - mean(rest)`` is at
    least as extreme as the observed (``sided`` as in :func:`sign_flip_p`; "greater": H1
    ``d > delta``). More than :data:`EXACT_LIMIT` splits: :data:`MC_DRAWS` random ones,
    ``(b + 1) / (M + 1)``. nan with fewer than two values in either group, or a non-finite one.

    Raises:
        ValueError: unknown ``sided``.
    """
    _check_sided(sided)
    x = np.asarray(values, dtype=np.float64) - delta
    y = np.asarray(ref, dtype=np.float64)
    n, k = len(x), len(y)
    if n < 2 or k < 2 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return math.nan
    pooled = np.concatenate([x, y])
    total = pooled.sum()
    # statistic mean(g) - mean(rest) is increasing in sum(g): compare sums of the first group
    def stat(sum_g):
        return sum_g / n - (total - sum_g) / k
    t = stat(x.sum())
    tol = _tol(pooled)
    if math.comb(n + k, n) <= EXACT_LIMIT:
        idx = np.array(list(itertools.combinations(range(n + k), n)), dtype=np.int64)
        stats_ = stat(pooled[idx].sum(axis=1))
        return float(np.mean(_extreme(stats_, t, tol, sided)))
    rng = np.random.default_rng(MC_SEED)
    perm = np.argsort(rng.random((MC_DRAWS, n + k)), axis=1)[:, :n]
    stats_ = stat(pooled[perm].sum(axis=1))
    return float((np.sum(_extreme(stats_, t, tol, sided)) + 1) / (MC_DRAWS + 1))


def p_method(n: int, n_ref: int | None = None) -> str:
    """How the p-value of a row with ``n`` seeds (and ``n_ref`` reference seeds for a two-sample
    test) is computed: "exact" (every arrangement enumerated) or "monte carlo"."""
    count = 2**n if n_ref is None else math.comb(n + n_ref, n)
    return "exact" if count <= EXACT_LIMIT else "monte carlo"


def min_p(expect: str, n: int, n_ref: int = 0) -> float:
    """The smallest p-value the row's test can give with ``n`` seeds (``n_ref`` in the reference
    row): ``2 / 2^n`` for the one-sample claims (the observed pattern and its mirror), for higher /
    lower ``2 / C(n + n_ref, n)`` with equal group sizes (the mirror split has the same |statistic|)
    and ``1 / C(n + n_ref, n)`` otherwise, ``1 / C(n + n_ref, n)`` for similar (the larger of two
    one-sided p-values); where the test draws :data:`MC_DRAWS` random arrangements instead
    (:func:`p_method` "monte carlo"), at least ``1 / (MC_DRAWS + 1)``, the smallest ``(b + 1) / (M + 1)``;
    nan when the test cannot run (fewer than two seeds, no expectation)."""
    floor = 1.0 / (MC_DRAWS + 1)  # a Monte Carlo p is (b + 1) / (M + 1): never below this
    if expect in ("reference", "sink", "no_sink"):
        if n < 2:
            return math.nan
        exact = 2.0 / 2**n
        return exact if p_method(n) == "exact" else max(exact, floor)
    if expect in ("higher", "lower", "similar"):
        if n < 2 or n_ref < 2:
            return math.nan
        exact = (2.0 if expect != "similar" and n == n_ref else 1.0) / math.comb(n + n_ref, n)
        return exact if p_method(n, n_ref) == "exact" else max(exact, floor)
    return math.nan


def one_sample_p(values: list[float], mu0: float, sided: str = "two") -> float:
    """p-value of the one-sample test of ``mean = mu0``: :func:`sign_flip_p`."""
    return sign_flip_p(values, mu0, sided)


@dataclass(frozen=True)
class Difference:
    """Welch comparison of a row with the reference row: ``d = m - m_ref`` (percentage points),
    its 95% interval ``[lo, hi]``, standard error ``se`` and degrees of freedom ``df``."""

    d: float
    lo: float
    hi: float
    se: float
    df: float


def welch(values: list[float], ref: list[float], confidence: float = CONFIDENCE) -> Difference:
    """Welch's comparison of two sets of per-seed values (nan fields with fewer than two of either;
    a zero standard error gives the zero-width interval ``[d, d]``)."""
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
                    level: float = 10.0, degenerate: bool = False, ref_degenerate: bool = False,
                    margin: float = SIMILAR_MARGIN) -> tuple[float, bool | None, str | None]:
    """The hypothesis test of one row (see the module docstring): (p, supports, status).

    ``status`` is None when the row is tested (p may still be nan with fewer than two seeds), else
    the verdict itself: :data:`NONE` with ``expect`` empty, :data:`DEGENERATE` or :data:`INCONCLUSIVE`.
    ``supports``: whether the estimate lies on the claim's side (None when untested). ``level``
    and ``margin`` are in the unit of the values (percent for Sink_1).

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
    if not all(math.isfinite(v) for v in [*values, *(ref_values or [])]):
        return math.nan, None, INCONCLUSIVE  # a NaN seed value: every comparison with it is False (p would read 0)
    m = sum(values) / len(values)
    if expect in ("reference", "sink", "no_sink"):
        above = m > level
        return sign_flip_p(values, level), above if expect != "no_sink" else (m < level), None
    if not ref_values or ref_degenerate:
        return math.nan, None, INCONCLUSIVE
    d = m - sum(ref_values) / len(ref_values)
    if expect == "similar":
        if abs(d) < margin:  # TOST: both one-sided tests must reject
            p = max(permutation_p(values, ref_values, -margin, "greater"),
                    permutation_p(values, ref_values, margin, "less"))
            return p, True, None
        return (permutation_p(values, ref_values, margin, "greater") if d > 0
                else permutation_p(values, ref_values, -margin, "less")), False, None
    return permutation_p(values, ref_values), (d > 0) if expect == "higher" else (d < 0), None


def paper_effects(paper: float | None, paper_ref: float | None, ref_mean: float | None) -> tuple[float, ...]:
    """The paper's effect of a row: ``(paper - paper_ref, (paper - paper_ref) * ref_mean / paper_ref)``
    (points, and scaled to our reference level), or ``(paper,)`` when the reference has no paper
    value; ``()`` without a paper value. The scaled effect is left out when ``paper_ref`` is 0 or
    ``ref_mean`` is missing."""
    if paper is None:
        return ()
    if paper_ref is None:
        return (float(paper),)
    eff = float(paper) - float(paper_ref)
    if ref_mean is None or not paper_ref:
        return (eff,)
    return (eff, eff * float(ref_mean) / float(paper_ref))


def excludes_paper(lo: float | None, hi: float | None, effects: tuple[float, ...]) -> bool:
    """Whether the 95% interval ``[lo, hi]`` excludes every one of the paper's ``effects``
    (:func:`paper_effects`); False without effects, without an interval, or for a zero-width
    interval (no spread over seeds: not an interval)."""
    if not effects or lo is None or hi is None or math.isnan(lo) or math.isnan(hi) or hi <= lo:
        return False
    return all(e < lo or e > hi for e in effects)


def decide(p_adjusted: float, supports: bool | None, status: str | None, excludes: bool = False) -> str:
    """The verdict of a row from its Holm-adjusted p-value, side (``status``: from
    :func:`hypothesis_test`) and whether its interval excludes the paper's effect."""
    if status is not None:
        return status
    if supports is not None and not math.isnan(p_adjusted) and p_adjusted < ALPHA:
        return AGREES if supports else DISAGREES
    return EXCLUDES if excludes else INCONCLUSIVE


def verdict(expect: str, values: list[float] | None, *, ref_values: list[float] | None = None,
            level: float = 10.0, degenerate: bool = False, ref_degenerate: bool = False,
            paper: float | None = None, paper_ref: float | None = None) -> str:
    """Verdict of a single row on its own (a family of one: no Holm adjustment).

    Args:
        expect: the expectation (see the module docstring); "" = no claim.
        values: the row's per-seed Sink_1 (percent); None or empty when no run finished.
        ref_values: the reference row's per-seed Sink_1 (needed for higher/lower/similar and for
            the paper's effect).
        level: the emergence level (percent).
        degenerate: the row's validation loss is above the unigram baseline.
        ref_degenerate: the same for the reference row.
        paper, paper_ref: the paper's value of the row and of the reference row (percent).

    Returns:
        "agrees", "disagrees", "excludes the paper's effect", "inconclusive", "degenerate", or ""
        when there is no expectation.

    Raises:
        ValueError: unknown ``expect``.
    """
    p, supports, status = hypothesis_test(expect, values, ref_values=ref_values, level=level, degenerate=degenerate,
                                          ref_degenerate=ref_degenerate)
    exc = False
    if values and paper is not None:
        if ref_values and paper_ref is not None:
            diff = welch(values, ref_values)
            exc = excludes_paper(diff.lo, diff.hi, paper_effects(paper, paper_ref, sum(ref_values) / len(ref_values)))
        else:
            _, lo, hi = t_interval(values)
            exc = excludes_paper(lo, hi, paper_effects(paper, None, None))
    return decide(p, supports, status, exc)


def power(kind: str, effect: float, sd: float, n: int, *, sd_ref: float | None = None, alpha: float = ALPHA,
          margin: float = SIMILAR_MARGIN) -> float:
    """Approximate power of a row's test with ``n`` seeds (and ``n`` in the reference row) when the
    true effect is ``effect`` and the per-seed spreads are ``sd`` (``sd_ref``): the noncentral-t power
    of the t-test that the exact permutation test approximates (a planning number, not a verdict).

    ``kind``: "one_sample" (``effect`` = true mean - level, two-sided, df n-1), "two_sample"
    (``effect`` = true difference, two-sided, Welch-like se with df 2n-2), "equivalence" (TOST within
    ``margin``: ``P(both one-sided tests reject)`` >= ``P1 + P2 - 1``, the bound used here). Values
    and spreads in one unit (points). Returns 0 when the exact test's smallest attainable p
    (:func:`min_p`) is not below ``alpha`` at this ``n``.

    Raises:
        ValueError: unknown ``kind``, ``n < 2`` or a spread that is not positive.
    """
    if kind not in ("one_sample", "two_sample", "equivalence"):
        raise ValueError(f"unknown kind {kind!r}")
    if n < 2 or not sd > 0 or (kind != "one_sample" and not (sd_ref or 0) > 0):
        raise ValueError(f"power needs n >= 2 and positive spreads, got n={n}, sd={sd}, sd_ref={sd_ref}")
    expect = {"one_sample": "sink", "two_sample": "higher", "equivalence": "similar"}[kind]
    if min_p(expect, n, n) >= alpha:
        return 0.0
    if kind == "one_sample":
        se, df = sd / math.sqrt(n), n - 1
    else:
        se, df = math.sqrt((sd**2 + sd_ref**2) / n), 2 * n - 2
    if kind == "equivalence":
        tc = float(_st.t.ppf(1 - alpha, df))
        p1 = float(_st.nct.sf(tc, df, (effect + margin) / se))  # H1: d > -margin
        p2 = float(_st.nct.cdf(-tc, df, (effect - margin) / se))  # H1: d < margin
        return max(0.0, p1 + p2 - 1.0)
    tc = float(_st.t.ppf(1 - alpha / 2, df))
    ncp = effect / se
    return float(_st.nct.sf(tc, df, ncp) + _st.nct.cdf(-tc, df, ncp))


def seeds_for_power(kind: str, effect: float, sd: float, *, sd_ref: float | None = None, alpha: float = ALPHA,
                    target: float = 0.8, margin: float = SIMILAR_MARGIN, max_n: int = 500) -> int | None:
    """The smallest number of seeds per row (reference included) whose :func:`power` reaches
    ``target``; None when ``max_n`` seeds do not (e.g. an effect of 0)."""
    for n in range(2, max_n + 1):
        if power(kind, effect, sd, n, sd_ref=sd_ref, alpha=alpha, margin=margin) >= target:
            return n
    return None
