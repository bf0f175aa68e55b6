"""One variant decoding at a time: requests queue by variant, first come first served.

On a CPU box every llama-server instance wants every core: measured here (2 cores,
Gemma 270M), two instances decoding at once gave 42.7 tok/s in total where one
instance alone gave 106.7, and each request's speed then says nothing about its
variant. The gate admits any number of requests of the active variant; a request
for another variant waits until those in flight finish, and while it waits, new
requests of the active variant queue behind it (no starvation). When the active
variant drains, every queued request of the next variant is admitted together.

``busy`` tells routing which variant a request joins without waiting and how long the
requests that had to wait have waited, so that waiting is priced (``tuner.tuning.pricing
.waiting``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

__all__ = ["VariantGate"]

WAIT_WEIGHT = 0.25  # the moving mean of waits: about the last four


class VariantGate:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.active: str | None = None
        self.in_flight = 0
        self.switches = 0
        self.clock = clock
        self.waits = 0  # requests that waited for another variant
        self.mean_wait_s = 0.0  # how long they waited: a moving mean
        self._waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    def busy(self) -> tuple[str, float] | None:
        """The variant a request joins now without waiting, while one for another variant
        would wait, and how long such waits have lasted (0 before any has: a request may
        still join, where the variant decoding is no slower than its own, or where it opens
        a conversation); None where no request would wait, or where others already wait
        (a request of the variant decoding queues behind them)."""
        if self.active is None or self._waiting:
            return None
        return self.active, self.mean_wait_s

    async def acquire(self, variant: str) -> None:
        if self.active is None or (self.active == variant and not self._waiting):
            self._admit(variant)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (variant, future)
        self._waiting.append(entry)
        queued = self.clock()
        try:
            await future
            waited = self.clock() - queued
            self.waits += 1
            weight = max(WAIT_WEIGHT, 1 / self.waits)
            self.mean_wait_s += weight * (waited - self.mean_wait_s)
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # admitted, then cancelled before it could use its turn
            elif entry in self._waiting:
                self._waiting.remove(entry)
                if self.in_flight == 0:
                    self._next()
            raise

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._next()

    def _admit(self, variant: str) -> None:
        if variant != self.active:
            self.switches += self.active is not None
            self.active = variant
        self.in_flight += 1

    def _next(self) -> None:
        if not self._waiting:
            self.active = None
            return
        variant = self._waiting[0][0]
        keep: deque[tuple[str, asyncio.Future[None]]] = deque()
        for entry in self._waiting:
            if entry[0] == variant and not entry[1].done():
                self._admit(variant)
                entry[1].set_result(None)
            elif entry[0] != variant:
                keep.append(entry)
        self._waiting = keep
        if self.in_flight == 0:  # every waiter of that variant was already cancelled
            self._next()
