"""Verdict of one sweep row against the paper's reported direction, from training seeds.

Each row of a study is trained with S seeds; its Sink_1 is summarised by the seed mean ``m``, the
sample standard deviation ``s`` (ddof = 1) and the standard error ``sem = s / sqrt(S)``. One rule
for every expectation: a claim holds when it holds for the whole interval ``m +- Z sem``
(``Z = 2``), fails when the whole interval contradicts it, and is *inconclusive* otherwise. With
fewer than two seeds there is no standard error, so every verdict is inconclusive.

* ``reference`` / ``sink`` -- the paper finds a sink: *agrees* when ``m - Z sem >= level``,
  *disagrees* when ``m + Z sem < level`` (``level``: the emergence level, 10% by default).
* ``no_sink`` -- the paper finds no (or a near-zero) sink: *agrees* when ``m + Z sem < level``,
  *disagrees* when ``m - Z sem >= level``.
* ``higher`` / ``lower`` -- the paper's Sink_1 is higher / lower than at the study's reference row:
  with ``d = m - m_ref`` and ``se = sqrt(sem^2 + sem_ref^2)``, *agrees* when ``d > Z se`` (higher) or
  ``d < -Z se`` (lower), *disagrees* when ``d`` is beyond ``Z se`` the other way.
* ``similar`` -- about the same as the reference (an equivalence test with margin
  ``SIMILAR_MARGIN`` = 10 points): *agrees* when ``|d| + Z se <= margin``, *disagrees* when
  ``|d| - Z se > margin``.

A row whose validation loss is above the loss of predicting the training unigram distribution
learned less than token frequencies: it is ``degenerate`` and gets no verdict (a relative row whose
reference is degenerate is inconclusive).
"""

from __future__ import annotations

import math

AGREES, DISAGREES, INCONCLUSIVE, DEGENERATE, NONE = "agrees", "disagrees", "inconclusive", "degenerate", ""
EXPECTS = ("reference", "sink", "no_sink", "higher", "lower", "similar")
Z = 2.0
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


def verdict(expect: str, values: list[float] | None, *, ref_values: list[float] | None = None,
            level: float = 10.0, degenerate: bool = False, ref_degenerate: bool = False) -> str:
    """Verdict of one row from its per-seed Sink_1 values (percent).

    Args:
        expect: the paper's expectation (see the module docstring); "" = no paper claim.
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
    if not expect:
        return NONE
    if expect not in EXPECTS:
        raise ValueError(f"unknown expectation {expect!r}")
    if not values:
        return INCONCLUSIVE
    if degenerate:
        return DEGENERATE
    m, _, sem = seed_stats(values)
    if math.isnan(sem):
        return INCONCLUSIVE
    lo, hi = m - Z * sem, m + Z * sem
    if expect in ("reference", "sink"):
        return AGREES if lo >= level else DISAGREES if hi < level else INCONCLUSIVE
    if expect == "no_sink":
        return AGREES if hi < level else DISAGREES if lo >= level else INCONCLUSIVE
    if not ref_values or ref_degenerate:
        return INCONCLUSIVE
    rm, _, rsem = seed_stats(ref_values)
    if math.isnan(rsem):
        return INCONCLUSIVE
    d, se = m - rm, math.sqrt(sem**2 + rsem**2)
    if expect == "similar":
        if abs(d) + Z * se <= SIMILAR_MARGIN:
            return AGREES
        return DISAGREES if abs(d) - Z * se > SIMILAR_MARGIN else INCONCLUSIVE
    above, below = d > Z * se, d < -Z * se
    if expect == "higher":
        return AGREES if above else DISAGREES if below else INCONCLUSIVE
    return AGREES if below else DISAGREES if above else INCONCLUSIVE  # lower
