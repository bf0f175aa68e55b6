"""Live measurement from request records: acceptance, tokens per step, speedup. Pure.

For each (class, variant) arm:

- ``alpha``: accepted / drafted tokens, with a Wilson 95 % interval;
- ``tokens_per_step``: tokens per target forward pass. A step either decodes one
  token or verifies a draft and yields its accepted tokens plus one, so
  ``steps = predicted_n - accepted`` and this is ``predicted_n / steps``;
- ``mean_draft``: drafted tokens per step (the effective draft length times the
  share of steps that drafted at all);
- decode tok/s (llama-server's ``predicted_per_second``) with a 95 % interval.

``compare`` sets an arm against its class's baseline arm (the no-speculation
variant): the measured speedup is the ratio of mean decode speeds, its interval
from the delta method on the log ratio, and ``effective_c`` the draft cost that
makes Leviathan's formula reproduce it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tuner.model.speedup import effective_draft_cost
from tuner.records import RequestRecord

__all__ = [
    "Z90", "Z95", "ArmStats", "Comparison", "Interval", "arm_stats", "compare", "mean_interval",
    "ratio_interval", "wilson",
]  # fmt: skip

BASELINE = "none"
DEFAULT_CLASS = "all"
DEFAULT_VARIANT = "default"
Z95 = 1.959964
Z90 = statistics.NormalDist().inv_cdf(0.95)  # two-sided 90 %: the guard's default level


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


@dataclass(frozen=True, slots=True)
class ArmStats:
    class_key: str
    variant: str
    requests: int
    tokens: int
    drafted: int
    accepted: int
    alpha: Interval | None
    tokens_per_step: float
    mean_draft: float
    tok_s: Interval
    tok_s_samples: tuple[float, ...]


def _key(record: RequestRecord) -> tuple[str, str]:
    return (record.class_key or DEFAULT_CLASS, record.variant or DEFAULT_VARIANT)


def arm_stats(records: Iterable[RequestRecord]) -> dict[tuple[str, str], ArmStats]:
    """Aggregate successful generation records by (class, variant)."""
    groups: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for record in records:
        t = record.timings
        if record.status == 200 and record.error is None and t and t.predicted_per_second:
            groups[_key(record)].append(record)
    out: dict[tuple[str, str], ArmStats] = {}
    for (class_key, variant), rows in groups.items():
        tokens = sum(r.timings.predicted_n or 0 for r in rows if r.timings)
        drafted = sum(r.timings.draft_n or 0 for r in rows if r.timings)
        accepted = sum(r.timings.draft_n_accepted or 0 for r in rows if r.timings)
        steps = max(tokens - accepted, 1)
        speeds = [float(r.timings.predicted_per_second or 0) for r in rows if r.timings]
        out[(class_key, variant)] = ArmStats(
            class_key=class_key,
            variant=variant,
            requests=len(rows),
            tokens=tokens,
            drafted=drafted,
            accepted=accepted,
            alpha=wilson(accepted, drafted),
            tokens_per_step=tokens / steps,
            mean_draft=drafted / steps,
            tok_s=mean_interval(speeds),
            tok_s_samples=tuple(speeds),
        )
    return out


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


@dataclass(frozen=True, slots=True)
class Comparison:
    arm: ArmStats
    baseline: ArmStats
    speedup: Interval
    effective_c: float | None


def compare(arm: ArmStats, baseline: ArmStats) -> Comparison:
    """Measured speedup of ``arm`` over ``baseline`` (ratio of mean decode speeds)."""
    interval = ratio_interval(arm.tok_s_samples, baseline.tok_s_samples)
    ratio = interval.value
    effective = None
    if arm.alpha is not None and arm.mean_draft > 0:
        effective = effective_draft_cost(ratio, min(arm.alpha.value, 0.999), arm.mean_draft)
    return Comparison(arm, baseline, interval, effective)
