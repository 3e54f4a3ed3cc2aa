"""Intervals for a proportion: k successes out of n independent trials (accuracies of tasks, cloze items)."""

from __future__ import annotations

import math

#: the 0.975 quantile of the standard normal: a two-sided 95% interval
Z95 = 1.959963984540054


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of the proportion k / n (Wilson 1927; Brown, Cai & DasGupta 2001, Eq. 4).

    ``(p + z^2 / 2n -/+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)`` with ``p = k / n``:
    it stays inside [0, 1], is not empty at k = 0 or k = n, and covers close to 95% even for small n
    (where the normal interval ``p +/- z sqrt(p (1 - p) / n)`` collapses to a point).

    Args:
        k: successes, 0 <= k <= n.
        n: trials.
        z: the normal quantile (default 1.96: 95%).

    Returns:
        (low, high) as fractions in [0, 1] (low exactly 0 at k = 0, high exactly 1 at k = n); (nan, nan)
        when n = 0.
    """
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, mid - half)  # exactly 0 and 1 at the ends (not a rounding away)
    hi = 1.0 if k == n else min(1.0, mid + half)
    return (lo, hi)


__all__ = ["Z95", "wilson_interval"]
