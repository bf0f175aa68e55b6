"""One variant decoding at a time: requests queue by variant, first come first served.

On a CPU box every llama-server instance wants every core: measured here (2 cores,
Gemma 270M), two instances decoding at once gave 42.7 tok/s in total where one
instance alone gave 106.7, and each request's speed then says nothing about its
variant. The gate admits any number of requests of the active variant; a request
for another variant waits until those in flight finish, and while it waits, new
requests of the active variant queue behind it (no starvation). When the active
variant drains, every queued request of the next variant is admitted together.
"""

from __future__ import annotations

import asyncio
from collections import deque

__all__ = ["VariantGate"]


class VariantGate:
    def __init__(self) -> None:
        self.active: str | None = None
        self.in_flight = 0
        self.switches = 0
        self._waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    async def acquire(self, variant: str) -> None:
        if self.active is None or (self.active == variant and not self._waiting):
            self._admit(variant)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (variant, future)
        self._waiting.append(entry)
        try:
            await future
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
