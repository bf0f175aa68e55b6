"""Variants that cannot run: taken out of routing and of the search for a while.

A variant whose requests fail on the server side (its preset does not load, its instance
crashes or stalls) ``after`` times in a row is quarantined: classes choose among the others
(their next best, or no speculation) and no trial asks for it. The quarantine lasts
``first_s``, doubling with each episode up to ``max_s``; then one request may try it again,
and a success clears its record. ``none`` is never quarantined: it is what remains.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.logs import get_logger
from tuner.tuning.variants import BASELINE

__all__ = ["Quarantine"]

log = get_logger(__name__)


@dataclass
class Quarantine:
    after: int = 2  # server-side failures in a row
    first_s: float = 30.0
    max_s: float = 3600.0
    clock: Callable[[], float] = time.time
    _failures: dict[str, int] = field(default_factory=dict)
    _episodes: dict[str, int] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)
    _reason: dict[str, str] = field(default_factory=dict)
    _counted: dict[str, str] = field(default_factory=dict)  # the last request counted
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def failed(self, variant: str, reason: str, request_id: str | None = None) -> bool:
        """Count one server-side failure; True when it starts a quarantine. A request is
        counted once: the proxy reports it as it falls back, its record again later.

        >>> q = Quarantine(clock=lambda: 100.0)
        >>> q.failed("v", "failed to load"), q.failed("v", "failed to load"), q.blocks("v")
        (False, True, True)
        >>> q.describe()["v"]["until"], q.failed("none", "x"), q.blocks("none")
        (130.0, False, False)
        >>> q.clock = lambda: 131.0  # over; tried again, it fails once: twice as long
        >>> q.failed("v", "crashed"), q.describe()["v"]["until"]
        (True, 191.0)
        >>> q.clock = lambda: 200.0
        >>> q.failed("w", "a", "r1"), q.failed("w", "b", "r1"), q.failed("w", "c", "r2")
        (False, False, True)
        """
        if variant == BASELINE.name:
            return False
        with self._lock:
            self._reason[variant] = reason[:300]  # the record's reason says more
            if request_id is not None:
                if self._counted.get(variant) == request_id:
                    return False
                self._counted[variant] = request_id
            count = self._failures[variant] = self._failures.get(variant, 0) + 1
            # once quarantined, and not cleared by a success since, one failure is enough
            needed = 1 if self._episodes.get(variant) else self.after
            if count < needed or self._blocked(variant):
                return False
            episode = self._episodes[variant] = self._episodes.get(variant, 0) + 1
            pause = min(self.max_s, self.first_s * 2 ** (episode - 1))
            self._until[variant] = self.clock() + pause
            self._failures[variant] = 0
        log.warning("variant_quarantined", variant=variant, seconds=pause, reason=reason[:300])
        return True

    def succeeded(self, variant: str) -> None:
        """A request it served completed: its record is clear."""
        with self._lock:
            if variant in self._failures or variant in self._episodes:
                self._failures.pop(variant, None)
                self._episodes.pop(variant, None)
                self._reason.pop(variant, None)

    def blocks(self, variant: str) -> bool:
        """Whether the variant is quarantined now. Takes no lock: routing asks it, and
        reading one entry of ``_until`` is atomic."""
        return self._blocked(variant)

    def _blocked(self, variant: str) -> bool:
        until = self._until.get(variant)
        return until is not None and self.clock() < until

    def describe(self) -> dict[str, dict[str, Any]]:
        """The quarantined variants now, with why and until when (epoch seconds)."""
        with self._lock:
            return {
                name: {
                    "reason": self._reason.get(name, ""),
                    "until": round(until, 1),
                    "episodes": self._episodes.get(name, 0),
                }
                for name, until in sorted(self._until.items())
                if self._blocked(name)
            }
