"""sd_notify over a real Unix datagram socket, as systemd listens for it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.systemd import Notifier, notify, watchdog_interval


class Listener:
    """What systemd does: a bound datagram socket whose path is NOTIFY_SOCKET."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def messages(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[Listener, str]]:
    path = str(tmp_path / "notify")
    found = Listener(path)
    yield found, path
    found.sock.close()


def test_notify_sends_one_datagram(listener: tuple[Listener, str]) -> None:
    sock, path = listener
    assert notify("READY=1\nSTATUS=up", {"NOTIFY_SOCKET": path})
    assert sock.messages() == ["READY=1\nSTATUS=up"]


def test_notify_is_a_no_op_outside_systemd() -> None:
    assert notify("READY=1", {}) is False


def test_notify_reaches_the_abstract_namespace() -> None:
    name = f"spec-tuner-test-{os.getpid()}"
    found = Listener("\0" + name)
    try:
        assert notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert found.messages() == ["WATCHDOG=1"]
    finally:
        found.sock.close()


def test_a_missing_socket_is_logged_not_raised(tmp_path: Path) -> None:
    assert notify("READY=1", {"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False


def test_watchdog_interval_is_half_of_watchdog_sec() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())})
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None
    assert watchdog_interval({}) is None


def test_notifier_lifecycle(listener: tuple[Listener, str]) -> None:
    sock, path = listener
    up = {"value": False}
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"}  # pings every 50 ms

    async def scenario() -> list[list[str]]:
        notifier = Notifier(lambda: up["value"], "gemma on :8088", poll_s=0.01, env=env)
        await notifier.start()
        await asyncio.sleep(0.15)
        starting = sock.messages()
        notifier.listening = True
        await asyncio.sleep(0.05)
        waiting = sock.messages()
        up["value"] = True
        await asyncio.sleep(0.05)
        ready = sock.messages()
        up["value"] = False
        await asyncio.sleep(0.05)
        up["value"] = True
        await asyncio.sleep(0.05)
        again = sock.messages()
        await notifier.stop()
        await notifier.stop()  # twice: one STOPPING
        return [starting, waiting, ready, again, sock.messages()]

    starting, waiting, ready, again, stopping = asyncio.run(scenario())
    assert starting[0] == "STATUS=starting llama-server"
    assert "WATCHDOG=1" in starting  # alive while starting, before it is ready
    assert not any("READY=1" in m for m in starting + waiting)
    assert any(m.startswith("STATUS=waiting for llama-server") for m in waiting)
    assert [m for m in ready if "READY" in m] == ["READY=1\nSTATUS=serving gemma on :8088"]
    assert not any("READY=1" in m for m in again)  # READY once; later changes are STATUS only
    assert "STATUS=serving gemma on :8088" in again
    assert [m for m in stopping if "STOPPING" in m] == [
        "STOPPING=1\nSTATUS=stopping: draining requests, saving policies"
    ]
