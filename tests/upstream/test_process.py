"""The supervisor against a real child process: readiness, restart, group stop, failure."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import patch

import psutil
import pytest

from tuner.errors import UpstreamError
from tuner.upstream.client import UpstreamClient
from tuner.upstream.process import Backoff, ManagedServer, free_port, kill_instance

CHILD = str(Path(__file__).with_name("child_server.py"))
FAST = Backoff(initial_s=0.05, max_s=0.2)


def make(tmp_path: Path, *extra: str) -> tuple[ManagedServer, UpstreamClient]:
    port = free_port()
    client = UpstreamClient(f"http://127.0.0.1:{port}")
    argv = [sys.executable, CHILD, str(port), *extra]
    server = ManagedServer(
        argv, client, log_path=tmp_path / "child.log", startup_timeout_s=20, backoff=FAST
    )
    return server, client


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().split()[2] != "Z"


async def test_ready_only_after_health_answers(tmp_path: Path) -> None:
    server, client = make(tmp_path, "0.5")
    await server.start()
    await asyncio.sleep(0.2)
    assert not client.ready
    await server.wait_ready(20)
    assert client.ready
    assert client.model_ids == ("child",)
    await server.stop()
    assert not client.ready


async def test_killed_child_is_restarted(tmp_path: Path) -> None:
    server, client = make(tmp_path)
    await server.start()
    await server.wait_ready(20)
    first = server.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    for _ in range(200):
        await asyncio.sleep(0.05)
        if client.ready and server.pid != first:
            break
    assert client.ready and server.pid != first
    assert client.health.restarts == 1
    await server.stop()


async def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    server, _ = make(tmp_path, "--grandchild", str(pidfile))
    await server.start()
    await server.wait_ready(20)
    grandchild = int(pidfile.read_text())
    assert alive(grandchild)
    await server.stop(grace_s=5)
    for _ in range(100):
        if not alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not alive(grandchild)


async def test_child_that_dies_at_start_reports_its_log(tmp_path: Path) -> None:
    server, client = make(tmp_path, "--exit", "3")
    await server.start()
    with pytest.raises(UpstreamError, match="cannot load model"):
        await server.wait_ready(20)
    assert not client.ready
    await server.stop()


async def test_missing_binary_fails_fast(tmp_path: Path) -> None:
    client = UpstreamClient("http://127.0.0.1:1")
    server = ManagedServer(["/nonexistent/llama-server"], client, log_path=tmp_path / "l.log")
    await server.start()
    with pytest.raises(UpstreamError, match="could not start"):
        await server.wait_ready(5)
    await server.stop()


def test_backoff_grows_and_is_capped() -> None:
    delays = [Backoff(initial_s=0.5, max_s=4).delay(n) for n in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_free_port_avoids_the_ports_spoken_for() -> None:
    """The daemon picks llama-server's port before its own proxy binds: the two once came
    out the same (the proxy then failed to bind). A port in ``avoid`` is never returned."""
    with patch("tuner.upstream.process.socket.socket") as sockets:
        sockets.return_value.__enter__.return_value.getsockname.side_effect = [
            ("127.0.0.1", 8088),
            ("127.0.0.1", 8088),
            ("127.0.0.1", 9000),
        ]
        assert free_port(avoid={8088}) == 9000
    assert free_port(avoid={8088}) != 8088


def test_kill_instance_kills_the_routers_child_of_that_preset_only() -> None:
    """The router's instances are its children, each started with ``--alias <preset>``."""
    sleeper = "import time; time.sleep(60)"
    spawn = (
        "import subprocess, sys, time\n"
        "for alias in ('none', 'ngram-mod'):\n"
        f"    subprocess.Popen([sys.executable, '-c', {sleeper!r}, '--alias', alias])\n"
        "time.sleep(60)\n"
    )
    router = subprocess.Popen([sys.executable, "-c", spawn])
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(router.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = {c.cmdline()[-1]: c for c in psutil.Process(router.pid).children()}
        assert kill_instance(router.pid, "none")
        while alive(children["none"].pid) and time.monotonic() < deadline:
            time.sleep(0.05)  # a zombie until the router reaps it
        assert not alive(children["none"].pid) and alive(children["ngram-mod"].pid)
        assert not kill_instance(router.pid, "suffix")
        assert not kill_instance(None, "none")
    finally:
        for child in psutil.Process(router.pid).children():
            child.kill()
        router.kill()
        router.wait()
