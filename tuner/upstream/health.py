"""What is known of the upstream's health, written through methods named for what
happened: the supervisor says it is up, down or restarted; the relay says an instance
stalled, is being reloaded, answered again; the client that a pooled connection was
re-sent. Everything else (``/ready``, the metrics, the systemd notifier, the tuner's
routing around a reloading instance) only reads it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tuner.logs import get_logger

__all__ = ["RECOVERY_S", "Health"]

log = get_logger(__name__)

RECOVERY_S = 60.0  # how long a reloaded instance is routed around, at most


class Health:
    def __init__(self, url: str = "", *, clock: Callable[[], float] = time.time) -> None:
        self.url = url
        self.clock = clock
        self._ready = False
        self.restarts = 0  # of the managed llama-server
        self.stalls = 0  # requests cut because their instance stopped answering
        self.reconnects = 0  # requests re-sent after the server closed a pooled connection
        # instances (router presets) reloaded after a stall (when), until one answers
        self._reloading: dict[str, float] = {}

    # -- the supervisor ------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    def answering(self, ready: bool) -> None:
        """What the last health check found: it answers (True), or not yet, or no more."""
        if ready != self._ready:
            log.info("upstream_ready" if ready else "upstream_not_ready", url=self.url)
        self._ready = ready

    def restarted(self) -> int:
        """The managed server was started again; how many times so far."""
        self.restarts += 1
        return self.restarts

    # -- the relay and the client --------------------------------------------------------

    def stalled(self) -> None:
        """A request was cut: its instance stopped answering."""
        self.stalls += 1

    def reloading(self, instance: str) -> None:
        """The instance is being unloaded after a stall (it loads again on next use)."""
        self._reloading[instance] = self.clock()

    def answered(self, instance: str) -> None:
        """An answer of the instance completed: it has recovered."""
        self._reloading.pop(instance, None)

    def reconnected(self) -> None:
        self.reconnects += 1

    # -- readers -------------------------------------------------------------------------

    def is_recovering(self, instance: str) -> bool:
        """Whether the instance was reloaded after a stall within ``RECOVERY_S``: requests
        are better sent elsewhere meanwhile."""
        since = self._reloading.get(instance)
        return since is not None and self.clock() - since < RECOVERY_S

    def recovering_now(self) -> list[str]:
        return sorted(m for m in list(self._reloading) if self.is_recovering(m))
