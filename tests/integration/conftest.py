"""Fixtures that run the real daemon (``python -m tuner serve``) on the real Gemma model.

These tests need the llama-server build (``tuner provision`` makes and caches it)
and are marked ``llama``; ``make test`` runs them, ``make unit`` leaves them out.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from openai import OpenAI

from tuner.settings import Settings
from tuner.tuning.config import tuning_text
from tuner.upstream.capabilities import Capabilities, probe_capabilities
from tuner.upstream.launch import prepare, server_argv
from tuner.upstream.process import free_port
from tuner.upstream.provision import locate_llama_server
from tuner.upstream.sources import ENGINES


@dataclass
class RunningDaemon:
    url: str
    process: subprocess.Popen[bytes]
    state_dir: Path
    log: Path

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def llama_server(self) -> psutil.Process:
        children = psutil.Process(self.process.pid).children(recursive=True)
        servers = [c for c in children if "llama-server" in c.name()]
        assert servers, f"no llama-server child of the daemon: {children}"
        return servers[0]

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"daemon exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"daemon not ready in {timeout_s} s: {self.log.read_text()[-3000:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


# the engine the suite runs beneath the daemon (TUNER_ENGINE=ik_llama.cpp make integration
# for the other); a test of TUNER_ENGINE=auto sets it itself
TEST_ENGINE = os.environ.get("TUNER_ENGINE", "llama.cpp")


@functools.cache
def engine_caps() -> Capabilities:
    """What the build beneath the suite's daemons can do (``TUNER_ENGINE``'s)."""
    engine = next(e for e in ENGINES if e == TEST_ENGINE)
    binary = locate_llama_server(None, Settings().cache_dir, engine=engine, build=False)
    return probe_capabilities(binary)


@contextlib.contextmanager
def plain_server(
    log_dir: Path, engine: str = TEST_ENGINE, ctx_size: int = 4096, extra: Sequence[str] = ()
) -> Iterator[str]:
    """One llama-server of ``engine`` on the default model, as a user runs it (no daemon;
    ``extra``: its flags, no speculation without them): its URL while the block runs."""
    settings = Settings(engine=engine, ctx_size=ctx_size)  # type: ignore[call-arg]
    prepared = prepare(settings)
    port = free_port()
    argv = server_argv(
        prepared.binary,
        settings,
        prepared.capabilities,
        model=prepared.model,
        draft=None,
        port=port,
    ) + list(extra)
    with (log_dir / f"llama-server-{port}.log").open("wb") as sink:
        server = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"llama-server did not start: {argv}")
        yield url
    finally:
        server.terminate()
        server.wait(30)


def require(spec_type: str, *flags: str) -> None:
    """Skip the test where the engine beneath the suite cannot run ``spec_type`` or lacks
    one of ``flags``: a test of what only one engine has is skipped on the other by
    capability, not by name."""
    caps = engine_caps()
    missing = [f for f in flags if not caps.has_flag(f)]
    if not caps.supports_spec_type(spec_type) or missing:
        lacks = ", ".join([spec_type] if not caps.supports_spec_type(spec_type) else missing)
        pytest.skip(f"{TEST_ENGINE} {caps.commit} has no {lacks}")


class Clients:
    """Clients sending completions until stopped, each ``pause_s`` after its last answer
    (one streams, one does not; ``streams``: which run); every answer that was not a whole
    200 is kept."""

    def __init__(
        self, running: RunningDaemon, streams: tuple[bool, ...] = (False, True), pause_s: float = 0
    ) -> None:
        self.client = OpenAI(base_url=running.v1, api_key="none", timeout=120, max_retries=0)
        self.stop = threading.Event()
        self.pause_s = pause_s
        self.done = Counter[str]()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._loop, args=(s,)) for s in streams]

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)

    def answered_more(self, more: int, within_s: float = 120) -> bool:
        """Wait until ``more`` answers beyond those so far have come (at most ``within_s``):
        after a switch, the ones in flight end where they began, the later ones begin on the
        new server. Whether they came."""
        wanted = sum(self.done.values()) + more
        deadline = time.monotonic() + within_s
        while sum(self.done.values()) < wanted and time.monotonic() < deadline:
            time.sleep(0.2)
        return sum(self.done.values()) >= wanted

    def _loop(self, stream: bool) -> None:
        while not self.stop.is_set():
            try:
                self._one(stream)
                self.done["stream" if stream else "plain"] += 1
            except Exception as exc:  # every failure is the finding
                self.failures.append(f"{'stream' if stream else 'plain'}: {exc!r}")
            self.stop.wait(self.pause_s)

    def _one(self, stream: bool) -> None:
        messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
        if not stream:
            answer = self.client.chat.completions.create(
                model="gemma",
                messages=messages,
                max_tokens=24,
                temperature=0,  # type: ignore[arg-type]
            )
            assert answer.choices[0].message.content
            return
        chunks = self.client.chat.completions.create(
            model="gemma",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=24,
            temperature=0,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text


_STARTED: list[RunningDaemon] = []  # started by the running test (``_stop_daemons``)


@pytest.fixture(autouse=True)
def _stop_daemons() -> Iterator[None]:
    """Stop (and reap) the daemons a test started, however it ended: a failed test must
    not leave one running for the next test to trip over."""
    mark = len(_STARTED)
    yield
    for running in _STARTED[mark:]:
        running.stop()
    del _STARTED[mark:]


def start_daemon(
    tmp: Path,
    *args: str,
    env: Mapping[str, str | None] | None = None,
    log: Path | None = None,
    owned: bool = True,
) -> RunningDaemon:
    """The daemon on state dir ``tmp``, its output in ``log`` (default ``tmp/daemon.log``);
    ``owned``: stopped when the test that started it ends (a session fixture passes False
    and stops its own)."""
    port = free_port()
    log = log or tmp / "daemon.log"
    merged = {**os.environ, "TUNER_LOG_FORMAT": "json", "TUNER_ENGINE": TEST_ENGINE, **(env or {})}
    full_env = {k: v for k, v in merged.items() if v is not None}  # None: unset it
    with log.open("wb") as sink:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner",
                "serve",
                "--port",
                str(port),
                "--state-dir",
                str(tmp),
                "--host",
                "127.0.0.1",
                *args,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    daemon = RunningDaemon(f"http://127.0.0.1:{port}", process, tmp, log)
    if owned:
        _STARTED.append(daemon)
    daemon.wait_ready()
    return daemon


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """One daemon on the default model, shared by the read-only tests."""
    running = start_daemon(tmp_path_factory.mktemp("daemon"), owned=False)
    yield running
    running.stop()


def shipped_tuning(tmp: Path, explore_share: float) -> dict[str, str]:
    """The daemon's environment for the shipped tuning file at another exploration share."""
    shipped = "explore_share = 0.01 "
    text = tuning_text()
    assert shipped in text, "the shipped tuning file's share moved"
    path = tmp / f"tuning-share-{explore_share}.toml"
    path.write_text(text.replace(shipped, f"explore_share = {explore_share} ", 1))
    return {"TUNER_TUNING_FILE": str(path)}


def report_json(state: Path) -> dict[str, Any]:
    """``tuner report --format json`` of a state dir, as a user runs it."""
    report = subprocess.run(
        [sys.executable, "-m", "tuner", "report", "--state-dir", str(state), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    document: dict[str, Any] = json.loads(report.stdout)
    return document
