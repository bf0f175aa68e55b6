"""Drift: has the variant a converged class holds changed what it delivers? Pure.

The held variant's last ``drift_window`` requests are compared with its earlier ones, by
their counts priced at one drafted-token cost (what moves is what the prompts accept and
draft) and by acceptance per request, each at 99 %: drift when the two intervals part,
not when the recent point estimate leaves the older interval (a few requests make it
noisy). A drifted class re-opens its search.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.stats import z_for
from tuner.tuning.evidence.classes import Arm
from tuner.tuning.evidence.counts import alpha_interval, count_speedup

__all__ = ["DRIFT_Z", "Drift", "drift"]

DRIFT_Z = z_for(0.99)  # checked again and again, so wider than the guard's


@dataclass(frozen=True, slots=True)
class Drift:
    speedup_now: float
    alpha_now: float | None


def drift(arm: Arm, cost: float, window: int) -> Drift | None:
    """The held variant's drift (its recent speedup and acceptance), or None when its last
    ``window`` requests agree with the earlier ones or there are too few of them.

    >>> from tuner.tuning.evidence.counts import Counts
    >>> arm = Arm()
    >>> for i in range(48):
    ...     arm.add(100.0, Counts(100, 50, 45 if i < 24 else 5))
    >>> found = drift(arm, 0.4, 24)
    >>> round(found.speedup_now, 2), round(found.alpha_now, 2)
    (0.87, 0.1)
    >>> drift(arm, 0.4, 40) is None  # too few requests before the window
    True
    """
    if len(arm.samples) < window + window // 2:
        return None
    counts = arm.counts
    before = count_speedup(counts[:-window], cost, 0.0, DRIFT_Z)
    recent = count_speedup(counts[-window:], cost, 0.0, DRIFT_Z)
    if before is None or recent is None:
        return None
    # per request, not per token: a prompt's drafts are accepted together
    old_alpha = alpha_interval(counts[:-window], DRIFT_Z)
    recent_alpha = alpha_interval(counts[-window:], DRIFT_Z)
    left_speedup = recent.high < before.low or recent.low > before.high
    left_alpha = (
        recent_alpha is not None
        and old_alpha is not None
        and (recent_alpha.high < old_alpha.low or recent_alpha.low > old_alpha.high)
    )
    if not (left_speedup or left_alpha):
        return None
    return Drift(recent.value, recent_alpha.value if recent_alpha else None)
