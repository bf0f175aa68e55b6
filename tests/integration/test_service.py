"""The real daemon as systemd runs it: sd_notify readiness, watchdog, SIGHUP reload, stop."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningDaemon, shipped_tuning, start_daemon
from tests.test_systemd import Listener
from tests.tuning.runtime.test_crash import intact_trials
from tuner.records import read_records

pytestmark = pytest.mark.llama

PIN = "ngram-simple.n3.m8"
SPACE = "[search.ngram-simple]\nsize_n = [3]\nsize_m = [8]\n"  # the pin is a running preset


def _until(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def _complete(url: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120)


def _record_write_errors_counted(url: str) -> bool:
    metrics = httpx.get(url + "/metrics", timeout=10).text
    return "tuner_record_write_errors_total 0.0" not in metrics


def test_notify_reload_and_stop_under_systemd_protocol(tmp_path: Path) -> None:
    notify = Listener(str(tmp_path / "notify"))
    tuning = tmp_path / "tuning.toml"
    off = "[overrides.all]\noff = true\n"  # plain until the reload pins the variant
    tuning.write_text("[budget]\nexplore_share = 0.0\n" + SPACE + off)
    config = tmp_path / "spec-tuner.toml"
    config.write_text(f'tuning_file = "{tuning}"\n')
    env = {
        "NOTIFY_SOCKET": str(tmp_path / "notify"),
        "WATCHDOG_USEC": "2000000",  # WatchdogSec=2: a ping every second
        "TUNER_CONFIG": str(config),
    }
    state = tmp_path / "state"
    state.mkdir()
    running = start_daemon(state, env=env)
    try:
        seen: list[str] = []
        assert _until(lambda: bool(seen.extend(notify.messages())) or "READY=1" in "".join(seen))
        assert seen[0] == "STATUS=starting llama-server"
        ready = next(m for m in seen if "READY=1" in m)
        assert "STATUS=serving gemma-3-270m" in ready
        assert _until(lambda: bool(seen.extend(notify.messages())) or seen.count("WATCHDOG=1") >= 3)

        first = _complete(running.url)
        assert first.status_code == 200 and first.headers["x-spec-variant"] == "none"

        # Edit the configuration: an API key and a pinned variant; SIGHUP applies both.
        pin = f'[overrides.all]\npin = "{PIN}"\n'
        tuning.write_text("[budget]\nexplore_share = 0.0\n" + SPACE + pin)
        config.write_text(f'tuning_file = "{tuning}"\napi_keys = ["sesame"]\n')
        running.process.send_signal(signal.SIGHUP)
        assert _until(lambda: _complete(running.url).status_code == 401)
        pinned = _complete(running.url, "sesame")
        assert pinned.status_code == 200, pinned.text
        assert pinned.headers["x-spec-variant"] == PIN
        assert any("STATUS=reloaded configuration" in m for m in notify.messages())

        # A broken edit is refused as a whole: the daemon keeps the last good configuration.
        config.write_text("api_keys = [unterminated\n")
        running.process.send_signal(signal.SIGHUP)
        assert _until(lambda: "reload_failed" in running.log.read_text())
        assert _complete(running.url).status_code == 401
        assert _complete(running.url, "sesame").headers["x-spec-variant"] == PIN
    finally:
        code = running.stop()
    assert code == 0
    stopping = [m for m in notify.messages() if "STOPPING=1" in m]
    assert len(stopping) == 1 and "draining" in stopping[0]
    notify.sock.close()


def _serve_through_write_errors(running: RunningDaemon, requests: int) -> int:
    """Each of ``requests`` completions answered 200 while the state dir refuses writes,
    and the failed record writes counted; then stop: the daemon's exit code."""
    try:
        for _ in range(requests):
            assert _complete(running.url).status_code == 200
        assert _until(lambda: _record_write_errors_counted(running.url))
    finally:
        code = running.stop()
    return code


def test_a_state_dir_that_refuses_writes_keeps_serving(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "records").write_text("a file where the records directory should be")
    (state / "policies.json").mkdir()  # the policy file cannot be replaced
    running = start_daemon(state)
    assert _serve_through_write_errors(running, 3) == 0
    log = running.log.read_text()
    assert "policies_write_failed" in log and "policies_unreadable" in log


@contextlib.contextmanager
def _small_filesystem(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where`` (needs root; skips otherwise)."""
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem is full (ENOSPC); returns it."""
    filler = directory / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as out:
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    assert shutil.disk_usage(directory).free < 65536
    return filler


def test_a_full_disk_keeps_serving_and_loses_nothing(tmp_path: Path) -> None:
    """The state dir on a real filesystem that fills up while the daemon runs."""
    with _small_filesystem(tmp_path / "state", "8m") as state:
        log = tmp_path / "daemon.log"
        running = start_daemon(state, log=log, env=shipped_tuning(tmp_path, 1.0))
        for _ in range(3):
            assert _complete(running.url).status_code == 200
        assert running.stop() == 0
        policies = (state / "policies.json").read_text()
        json.loads(policies)
        trials = intact_trials(state / "studies.db")
        assert trials > 0

        running = start_daemon(state, log=log, env=shipped_tuning(tmp_path, 1.0))
        filler = _fill(state)
        assert _serve_through_write_errors(running, 4) == 0
        assert "policies_write_failed" in log.read_text()
        assert "tuning_ask_failed" in log.read_text()  # the trial was not started; served as usual
        assert (state / "policies.json").read_text() == policies  # the last good file, whole
        assert not list(state.glob("*.tmp*"))  # no half-written temporary left behind

        assert intact_trials(state / "studies.db") >= trials

        filler.unlink()  # space again: everything loads, requests are recorded again
        log.write_text("")
        running = start_daemon(state, log=log, env=shipped_tuning(tmp_path, 1.0))
        try:
            response = _complete(running.url)
            assert response.status_code == 200
        finally:
            assert running.stop() == 0
        assert "policies_unreadable" not in log.read_text()
        assert "tuning_ask_failed" not in log.read_text()
        assert any(
            r.id == response.headers["x-request-id"] for r in read_records(state / "records")
        )


def test_kill_9_of_the_real_daemon_under_tuning_traffic(tmp_path: Path) -> None:
    """SIGKILL at random moments while every request is a trial: the state stays whole."""
    state = tmp_path / "state"
    state.mkdir()
    rng = random.Random(7)
    trials = 0
    for round_ in range(3):
        log = tmp_path / f"daemon{round_}.log"
        running = start_daemon(state, env=shipped_tuning(tmp_path, 1.0), log=log)
        if (state / "policies.json").exists():
            assert "policies_restored" in log.read_text()
        stop = threading.Event()

        def traffic(url: str = running.url, stop: threading.Event = stop) -> None:
            while not stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    _complete(url)

        sender = threading.Thread(target=traffic)
        sender.start()
        time.sleep(rng.uniform(3, 8))
        running.process.kill()
        running.process.wait(10)
        stop.set()
        sender.join(30)
        if (state / "policies.json").exists():
            json.loads((state / "policies.json").read_text())
        now = intact_trials(state / "studies.db")
        assert now >= trials
        trials = now
    assert trials > 0
    log = tmp_path / "daemon.log"
    running = start_daemon(state, env=shipped_tuning(tmp_path, 1.0), log=log)
    try:
        assert _complete(running.url).status_code == 200
    finally:
        assert running.stop() == 0
    assert "policies_unreadable" not in log.read_text()
    assert not list(state.glob("*.tmp*"))
    json.loads((state / "policies.json").read_text())


def test_a_policy_file_it_cannot_read_is_set_aside_and_the_real_daemon_serves(
    tmp_path: Path,
) -> None:
    """A policy file a hand edit broke (its JSON cut short) neither stops the real daemon
    from starting nor is overwritten: it is renamed ``policies.<time>.bad.json`` as it was,
    the daemon answers, and it writes its own new file."""
    state = tmp_path / "state"
    state.mkdir()
    broken = '{"version": 1, "classes": {"code/echo/greedy": {"seen": 3'
    (state / "policies.json").write_text(broken)
    running = start_daemon(state)
    try:
        assert _complete(running.url).status_code == 200
    finally:
        assert running.stop() == 0
    (aside,) = state.glob("policies.*.bad.json")
    assert aside.read_text() == broken
    assert "policies_set_aside" in running.log.read_text()
    json.loads((state / "policies.json").read_text())  # the new daemon's own, whole
