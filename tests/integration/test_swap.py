"""Swapping the engine under a serving daemon, on the real builds: the configuration names
ik_llama.cpp instead of llama.cpp, SIGHUP, and the daemon brings the new engine up beside
the old one, sends the next request to it, lets the old one finish what it serves and
stops it. Clients streaming and not streaming all through see no failed request."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest

from tests.integration.conftest import Clients, RunningDaemon, start_daemon
from tuner.records import read_records

pytestmark = pytest.mark.llama

SPACE = "[search.ngram-simple]\nsize_n = [3]\nsize_m = [8]\n"


def _engine(running: RunningDaemon) -> str | None:
    try:
        found = httpx.get(running.url + "/ready", timeout=5)
    except httpx.HTTPError:
        return None
    engine: str | None = found.json().get("engine") if found.status_code == 200 else None
    return engine


def _servers(running: RunningDaemon) -> list[psutil.Process]:
    children = psutil.Process(running.process.pid).children(recursive=True)
    return [c for c in children if "llama-server" in c.name()]


def _events(running: RunningDaemon) -> str:
    """The daemon's log without its request lines, and its requests that failed: what a
    failure of this test is explained by."""
    kept = []
    for line in running.log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            kept.append(line)
            continue
        if event.get("event") != "request" or event.get("status") != 200:
            kept.append(line)
    return "\n".join(kept)[-6000:]


def test_sighup_swaps_the_engine_without_a_failed_request(tmp_path: Path) -> None:
    tuning = tmp_path / "tuning.toml"
    tuning.write_text(SPACE)
    config = tmp_path / "spec-tuner.toml"
    config.write_text(f'engine = "llama.cpp"\ntuning_file = "{tuning}"\n')
    state = tmp_path / "state"
    state.mkdir()
    running = start_daemon(state, env={"TUNER_CONFIG": str(config), "TUNER_ENGINE": None})
    try:
        assert _engine(running) == "llama.cpp"
        before = {p.pid for p in _servers(running)}
        with Clients(running) as clients:
            time.sleep(3)
            config.write_text(f'engine = "ik_llama.cpp"\ntuning_file = "{tuning}"\n')
            running.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 300
            while _engine(running) != "ik_llama.cpp" and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _engine(running) == "ik_llama.cpp", running.log.read_text()[-3000:]
            # served on the new engine for a while: the two requests in flight at the switch
            # end on the old one (seconds each on a loaded machine), the next ones begin here
            served_after = clients.answered_more(4)
        assert clients.failures == [], _events(running)
        assert served_after and min(clients.done.values()) > 0
        # the old engine drains (its last answers may take a while on a loaded machine) and
        # is gone: the only llama-server left is a new process
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            {p.pid for p in _servers(running)} & before
            or "topology_retired" not in running.log.read_text()
        ):
            time.sleep(0.5)
        assert _servers(running) and not {p.pid for p in _servers(running)} & before
        assert "topology_replaced" in running.log.read_text(), _events(running)
        assert "topology_retired" in running.log.read_text(), _events(running)
    finally:
        assert running.stop() == 0
    records = sorted(read_records(state / "records"), key=lambda r: r.ts)
    engines = Counter(r.engine for r in records)
    assert engines["llama.cpp"] > 0 and engines["ik_llama.cpp"] > 0, engines
    assert records[-1].engine == "ik_llama.cpp"
    errors = [r.model_dump(mode="json") for r in records if r.status != 200 or r.error]
    assert errors == [], json.dumps(errors)[:2000]
