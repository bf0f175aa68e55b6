"""systemd integration without a dependency: the sd_notify datagram protocol.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET`` (a Unix datagram socket; a
leading ``@`` is the abstract namespace). The daemon sends:

- ``STATUS=...`` lines while starting and whenever the upstream's state changes;
- ``READY=1`` once the proxy is listening and llama-server answers ``/health``;
- ``WATCHDOG=1`` every half ``WatchdogSec`` (``WATCHDOG_USEC``) while its event loop runs,
  so a hung daemon is restarted;
- ``STOPPING=1`` as soon as a stop signal arrives (then it drains and saves).

Without ``NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable, Mapping

from tuner.logs import get_logger

__all__ = ["Notifier", "notify", "watchdog_interval"]

log = get_logger(__name__)


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one notification; False when not under systemd or the socket refuses it."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as exc:
        log.warning("sd_notify_failed", error=str(exc))
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of WatchdogSec), or None when it is off."""
    env = os.environ if env is None else env
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6


class Notifier:
    """A daemon service: readiness, status and watchdog for systemd.

    ``ready()`` says whether the upstream answers; ``listening`` is set once the
    HTTP socket is bound; ``describe`` names what is served (for STATUS).
    """

    def __init__(
        self,
        ready: Callable[[], bool],
        describe: str,
        *,
        restarts: Callable[[], int] = lambda: 0,
        poll_s: float = 0.5,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.ready = ready
        self.describe = describe
        self.restarts = restarts
        self.poll_s = poll_s
        self.env = env
        self.listening = False
        self.stopping = False
        self.sent_ready = False
        self._task: asyncio.Task[None] | None = None

    def send(self, message: str) -> bool:
        return notify(message, self.env)

    async def start(self) -> None:
        self.send("STATUS=starting llama-server")
        self._task = asyncio.create_task(self._run(), name="systemd-notifier")

    def stop_requested(self) -> None:
        """Call from the stop-signal handler: tell systemd at once (no IO beyond one datagram)."""
        if not self.stopping:
            self.stopping = True
            self.send("STOPPING=1\nSTATUS=stopping: draining requests, saving policies")

    async def stop(self) -> None:
        self.stop_requested()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _status(self, up: bool) -> str:
        if up:
            return f"STATUS=serving {self.describe}"
        return f"STATUS=waiting for llama-server (restarts: {self.restarts()})"

    async def _run(self) -> None:
        interval = watchdog_interval(self.env)
        loop = asyncio.get_running_loop()
        next_ping = loop.time()
        last: bool | None = None
        while True:
            up = self.ready()
            if up != last and self.listening and not self.stopping:
                ready = "" if self.sent_ready or not up else "READY=1\n"
                self.send(ready + self._status(up))
                self.sent_ready |= up
                last = up
            if interval is not None and loop.time() >= next_ping:
                self.send("WATCHDOG=1")  # the event loop is alive: this task runs on it
                next_ping = loop.time() + interval
            await asyncio.sleep(self.poll_s if interval is None else min(self.poll_s, interval))
