"""Run llama-server as a child: start, wait for /health, restart with backoff, stop.

``ManagedServer`` owns one llama-server process in its own process group. A
supervisor task starts it, polls ``/health`` until it answers 200 (no fixed
sleeps), marks the client ready, waits for the process to exit and, unless we
are stopping, restarts it after an exponential backoff. ``stop`` terminates the
whole process group, then kills it after a grace period.

``ExternalMonitor`` does the readiness part only, for a llama-server the user
runs themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from tuner.errors import ProvisionError, UpstreamError
from tuner.logs import get_logger
from tuner.upstream.client import UpstreamClient

__all__ = [
    "Backoff",
    "ExternalMonitor",
    "ManagedServer",
    "die_with_parent",
    "free_port",
    "kill_instance",
    "signal_group",
]

log = get_logger(__name__)


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> None:
    """In the child, before exec: ask Linux to send it ``sig`` (default SIGKILL) when its
    parent dies (the daemon, for its llama-servers; the bench, for its daemon: SIGTERM).

    Without this, a daemon killed with SIGKILL (or by a crash, or SIGHUP from a
    closed terminal) leaves llama-server running in its own session, holding
    memory and a port. SIGKILL, not SIGTERM: with no daemon left there is nothing
    to drain, and a router-mode llama-server sent SIGTERM moments after it started
    was seen to hang in its own signal handler for good (the router kept running,
    orphaned, with its model instance); its instances end with it when it is
    killed. Elsewhere this is a no-op.
    """
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))


_PR_SET_PDEATHSIG = 1


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal a child's whole process group (it was started in a session of its own);
    one already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def kill_instance(router_pid: int | None, alias: str) -> bool:
    """SIGKILL the router's instance serving the preset ``alias`` (mainline starts each with
    ``--alias <preset>``); whether one was found. The router's own unload asks the instance
    to exit and waits out its stop timeout (10 s) before it kills: a stopped process never
    takes the request, and the preset cannot load again until it is gone."""
    if router_pid is None:
        return False
    try:
        children = psutil.Process(router_pid).children()
    except psutil.Error:
        return False
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if any(a == "--alias" and b == alias for a, b in itertools.pairwise(argv)):
            with contextlib.suppress(psutil.Error):
                child.kill()
                return True
    return False


def free_port(host: str = "127.0.0.1", avoid: Container[int] = ()) -> int:
    """A TCP port that was free a moment ago, not one of ``avoid`` (a port that is spoken
    for but not bound yet, such as the proxy's own before its server starts)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential restart delays: ``initial * factor**n``, capped."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 30.0
    reset_after_s: float = 60.0  # a run this long counts as healthy: start over

    def delay(self, attempt: int) -> float:
        return float(min(self.max_s, self.initial_s * self.factor**attempt))


def _tail(path: Path, size: int = 2000) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - size))
            return handle.read().decode(errors="replace")
    except OSError:
        return "(no log)"


class ManagedServer:
    """A supervised llama-server child process."""

    def __init__(
        self,
        argv: Sequence[str],
        client: UpstreamClient,
        *,
        log_path: Path,
        startup_timeout_s: float = 600.0,
        backoff: Backoff | None = None,
        health_interval_s: float = 0.1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None  # None: this process's
        self.client = client
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.backoff = backoff or Backoff()
        self.health_interval_s = health_interval_s
        self.process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready_event = asyncio.Event()
        self._ever_ready = False
        self.failure: str | None = None  # why the first start failed, for wait_ready

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> None:
        """Start supervising; returns at once (see ``wait_ready``)."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._supervise(), name="llama-server-supervisor")

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        """Block until the server answers /health (or raise on timeout)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ready_event.is_set():
            if self.failure is not None:
                raise UpstreamError(self.failure)
            if deadline is not None and time.monotonic() > deadline:
                raise UpstreamError(f"llama-server not ready after {timeout_s} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready_event.wait(), 0.2)

    async def _supervise(self) -> None:
        attempt = 0
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_once()
            except ProvisionError as exc:
                self.failure = str(exc)
                log.error("llama_server_cannot_start", error=str(exc))
                return
            except Exception:
                log.exception("llama_server_supervise_error")
            if self._stopping:
                break
            if time.monotonic() - started > self.backoff.reset_after_s:
                attempt = 0
            delay = self.backoff.delay(attempt)
            attempt += 1
            restarts = self.client.health.restarted()
            log.warning("llama_server_restart", delay_s=delay, restarts=restarts)
            await asyncio.sleep(delay)

    async def _run_once(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as sink:
            try:
                self.process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    env=self.env,
                    stdout=sink,
                    stderr=sink,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                raise ProvisionError(f"could not start {self.argv[0]}: {exc}") from exc
        log.info("llama_server_started", pid=self.process.pid, log=str(self.log_path))
        if await self._wait_healthy(self.process):
            await self.client.refresh_models()
            self.client.health.answering(True)
            self._ever_ready = True
            self.failure = None
            self._ready_event.set()
        code = await self.process.wait()
        self.client.health.answering(False)
        self._ready_event.clear()
        if not self._stopping:
            log.error("llama_server_exited", code=code, log=str(self.log_path))
            if not self._ever_ready:
                self.failure = (
                    f"llama-server exited with code {code} before it was ready; "
                    f"its log ({self.log_path}) ends with:\n{_tail(self.log_path)}"
                )

    async def _wait_healthy(self, process: asyncio.subprocess.Process) -> bool:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if process.returncode is not None or self._stopping:
                return False
            if await self.client.check_health():
                return True
            await asyncio.sleep(self.health_interval_s)
        log.error("llama_server_startup_timeout", timeout_s=self.startup_timeout_s)
        self._signal_group(signal.SIGKILL)
        return False

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            signal_group(self.process.pid, sig)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Terminate the process group, kill it after ``grace_s``, end supervision."""
        self._stopping = True
        self.client.health.answering(False)
        if self.process is not None and self.process.returncode is None:
            self._signal_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), grace_s)
            except TimeoutError:
                self._signal_group(signal.SIGKILL)
                await self.process.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        log.info("llama_server_stopped")


class ExternalMonitor:
    """Readiness for a llama-server the user runs: poll /health now and then."""

    def __init__(self, client: UpstreamClient, *, interval_s: float = 2.0) -> None:
        self.client = client
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="upstream-monitor")

    async def _poll(self) -> None:
        while True:
            healthy = await self.client.check_health()
            if healthy and not self.client.ready:
                await self.client.refresh_models()
            self.client.health.answering(healthy)
            await asyncio.sleep(self.interval_s)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.client.ready:
            if deadline is not None and time.monotonic() > deadline:
                raise UpstreamError(f"{self.client.base_url} not ready after {timeout_s} s")
            await asyncio.sleep(0.1)

    async def stop(self, grace_s: float = 0.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
