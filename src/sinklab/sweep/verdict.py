"""Verdict of one sweep row against the paper's reported direction.

Each row of a study carries an expectation taken from the paper (Gu et al. 2025), relative to
the study's ``reference`` row (the default setting) or absolute:

* ``reference`` -- the default setting; the paper finds a sink there. *agrees* when our Sink_1
  reaches the emergence level, *disagrees* when its whole 95% CI is below it.
* ``sink`` -- the paper reports a clear sink. Same rule as ``reference``.
* ``no_sink`` -- the paper reports no (or a near-zero) sink. *agrees* when the whole CI is below
  the emergence level, *disagrees* when the whole CI is at or above it.
* ``higher`` / ``lower`` -- the paper's Sink_1 is higher / lower than at the reference setting.
  *agrees* when the CIs are separated in that direction, *disagrees* when they are separated the
  other way.
* ``similar`` -- about the same as the reference: *agrees* when the CIs overlap, *disagrees* when
  they are separated.

Anything else is *inconclusive at this scale* (CIs overlap the decision line, the run did not
finish, or, for a relative expectation, the reference run has no sink to compare with: a
direction cannot be read off two zeros). The CIs are bootstrap intervals over probe samples of
one training run each (one seed), so they do not include seed-to-seed variation.
"""

from __future__ import annotations

AGREES, DISAGREES, INCONCLUSIVE, NONE = "agrees", "disagrees", "inconclusive", ""


def verdict(expect: str, sink: float | None, ci: tuple[float, float] | None, *,
            ref_sink: float | None = None, ref_ci: tuple[float, float] | None = None, level: float = 10.0) -> str:
    """Verdict of one row.

    Args:
        expect: the paper's expectation (see the module docstring); "" = no paper claim.
        sink, ci: our final Sink_1 and its 95% CI (percent); None when the run has no result.
        ref_sink, ref_ci: the reference row's Sink_1 and CI (needed for higher/lower/similar).
        level: the emergence level (percent).

    Returns:
        "agrees", "disagrees", "inconclusive", or "" when there is no expectation.

    Raises:
        ValueError: unknown ``expect``.
    """
    if not expect:
        return NONE
    if expect not in ("reference", "sink", "no_sink", "higher", "lower", "similar"):
        raise ValueError(f"unknown expectation {expect!r}")
    if sink is None:
        return INCONCLUSIVE
    lo, hi = ci if ci is not None else (sink, sink)
    if expect in ("reference", "sink"):
        if sink >= level:
            return AGREES
        return DISAGREES if hi < level else INCONCLUSIVE
    if expect == "no_sink":
        if hi < level:
            return AGREES
        return DISAGREES if lo >= level else INCONCLUSIVE
    if ref_sink is None or ref_sink < level:
        return INCONCLUSIVE  # no sink at the reference setting: no direction to compare with
    rlo, rhi = ref_ci if ref_ci is not None else (ref_sink, ref_sink)
    above, below = lo > rhi, hi < rlo
    if expect == "higher":
        return AGREES if above else DISAGREES if below else INCONCLUSIVE
    if expect == "lower":
        return AGREES if below else DISAGREES if above else INCONCLUSIVE
    return DISAGREES if (above or below) else AGREES  # similar
