"""Intervals for the measurements everything else reports: proportions, means, ratios. Pure."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Z90", "Z95", "Interval", "mean_interval", "ratio_interval", "wilson", "z_for"]

Z95 = 1.959964
Z90 = statistics.NormalDist().inv_cdf(0.95)  # two-sided 90 %: the guard's default level


def z_for(confidence: float) -> float:
    """The normal quantile of a two-sided interval at ``confidence``.

    >>> round(z_for(0.90), 3)
    1.645
    """
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


@dataclass(frozen=True, slots=True)
class Interval:
    value: float
    low: float
    high: float

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high


def wilson(successes: int, trials: int, z: float = Z95) -> Interval | None:
    """Wilson score interval for a proportion.

    >>> w = wilson(80, 100)
    >>> round(w.value, 2), round(w.low, 3), round(w.high, 3)
    (0.8, 0.711, 0.867)
    """
    if trials <= 0:
        return None
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    # min/max guard against rounding at p = 0 or 1, where the bound equals p exactly
    return Interval(p, max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def mean_interval(values: Sequence[float], z: float = Z95) -> Interval:
    """The mean with a normal interval (``z`` standard errors); a point for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half)


def _mean_var(sample: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance (0 for one value), in floats: this runs per request."""
    n = len(sample)
    mean = math.fsum(sample) / n
    if n < 2:
        return mean, 0.0
    return mean, math.fsum((x - mean) ** 2 for x in sample) / (n - 1)


def ratio_interval(a: Sequence[float], b: Sequence[float], z: float = Z95) -> Interval:
    """Ratio of the means of two samples, with a delta-method interval on the log ratio.

    >>> r = ratio_interval([120, 125, 130], [100, 100, 100])
    >>> round(r.value, 2), r.low < 1.25 < r.high
    (1.25, True)
    """
    (mean_a, var_a), (mean_b, var_b) = _mean_var(a), _mean_var(b)
    ratio = mean_a / mean_b
    rel = var_a / (len(a) * mean_a**2) + var_b / (len(b) * mean_b**2)
    half = z * math.sqrt(rel)
    return Interval(ratio, ratio * math.exp(-half), ratio * math.exp(half))
