"""What the proxy sends requests to: one upstream and the tuner's calls for it.

A ``Backend`` is one way of serving as the request path sees it (``tuner.daemon.topology``
builds the rest). The app holds one by a single reference; a request keeps the backend
it started on to its last byte, so replacing the reference serves the next request on a
new backend while the old one drains (``drained``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tuner.proxy.gate import VariantGate
from tuner.proxy.trace import Keep
from tuner.sessions.prefix import Prompt
from tuner.upstream.client import UpstreamClient

__all__ = ["Backend", "BackendSlot", "Fallback", "Router", "Routing"]


class Routing(Protocol):
    """What the tuner decided for one request (see ``tuner.tuning.runtime.service.Routed``)."""

    @property
    def variant(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def trial(self) -> int | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def session(self) -> str | None: ...


# a request's class and prompt -> what to send it to
Router = Callable[[str | None, Prompt], Routing]
# a routed request's variant failed on the server: the routing for a second try, or None
# (given the variant, the request's id, the error's message and the request's class)
Fallback = Callable[[str, str, str, str | None], Routing | None]


@dataclass(eq=False, slots=True)
class Backend:
    """One upstream with the tuner's calls for it (none: proxied as it is).

    ``public_models``: the model ids ``/v1/models`` shows where the upstream's own are
    variants (router and pool); ``engine``: the llama-server engine beneath (None: one
    the user runs); ``keep`` gets each answered request the tuner routed (the replayer).
    """

    upstream: UpstreamClient
    router: Router | None = None
    fallback: Fallback | None = None
    gate: VariantGate | None = None
    keep: Keep | None = None
    public_models: Sequence[str] = ()
    engine: str | None = None
    infill: bool | None = None  # the model has fill-in-the-middle tokens (None: not known)
    in_flight: int = 0  # requests begun on it that have not ended
    # per variant, routed requests sent to it that have not ended: its instance's batch
    running: dict[str, int] = field(default_factory=dict)
    _idle: asyncio.Event | None = field(default=None, repr=False)

    def sent(self, variant: str) -> int:
        """A routed request goes to ``variant``'s instance: how many of that variant's are
        in flight now, itself included."""
        self.running[variant] = self.running.get(variant, 0) + 1
        return self.running[variant]

    def done(self, variant: str) -> None:
        left = self.running.pop(variant, 1) - 1
        if left > 0:
            self.running[variant] = left

    def begin(self) -> None:
        self.in_flight += 1

    def end(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is on this backend (at most ``timeout_s``); whether none is."""
        if self.in_flight == 0:
            return True
        self._idle = asyncio.Event()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return self.in_flight == 0
        return True

    @property
    def shown_model(self) -> str | None:
        """The model name answers carry (router and pool: the model, not the variant's)."""
        return self.public_models[0] if self.public_models else None


class BackendSlot:
    """The backend serving now: replaced whole by ``swap``, while the requests begun on
    the one it replaces run on it to their end."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def swap(self, backend: Backend) -> Backend:
        """Serve the next request on ``backend``; the one replaced (to drain)."""
        old, self.backend = self.backend, backend
        return old
