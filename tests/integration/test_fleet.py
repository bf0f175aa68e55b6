"""A fleet on a real PostgreSQL server: real daemons, the real llama-server and Gemma."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import RunningDaemon, start_daemon
from tests.integration.test_daemon import CODE_EDIT
from tests.integration.test_tuning import TUNING, _send, _tuned, _tuner
from tests.pg_server import PgServer

pytestmark = pytest.mark.llama


def edit(n: int) -> tuple[str, dict[str, object]]:
    return "/v1/completions", {"prompt": CODE_EDIT, "max_tokens": 48, "temperature": 0.0, "seed": n}


def metric(daemon: RunningDaemon, name: str) -> float:
    text = httpx.get(daemon.url + "/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


def until(check: object, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


# One n-gram setting a type: on the edits, ngram-simple's m8 and m16 tie within the timing
# noise, and a policy may move between two tied settings as evidence comes in; the fleet's
# claims are about what it shares.
FLEET_TUNING = TUNING.replace("size_m = [8, 16]", "size_m = [16]")
assert FLEET_TUNING != TUNING


def evidence_requests(state: Path) -> int:
    """Requests in the evidence of all traffic (the root class), from the policy file."""
    classes = json.loads((state / "policies.json").read_text())["classes"]
    return sum(arm["requests"] for arm in classes["all"]["arms"].values())


def test_a_fleet_learns_once_and_survives_its_database_and_a_kill(
    tmp_path: Path, pg: PgServer, pg_url: str
) -> None:
    (tmp_path / "a").mkdir()
    state_a, env = _tuned(tmp_path / "a", FLEET_TUNING, TUNER_STORAGE_URL=pg_url)
    a = start_daemon(state_a, env=env)
    for n in range(20):  # the edits' class converges (3 trials of 4 requests)
        _send(a.url, edit(n))
    until(lambda: metric(a, "tuner_fleet_events_pending") == 0)
    time.sleep(3)  # one more sync, then killed without a last save
    a.process.send_signal(signal.SIGKILL)
    a.process.wait()

    # B joins with an empty state dir: the fleet's policy from its first request, no trial.
    state_b = tmp_path / "b" / "state"
    state_b.mkdir(parents=True)
    b = start_daemon(state_b, env=env)
    first = _send(b.url, edit(100))
    assert first.headers["x-spec-role"] == "exploit", first.headers
    learned = first.headers["x-spec-variant"]
    assert learned != "none", first.headers
    for n in range(3):
        response = _send(b.url, edit(101 + n))
        assert response.headers["x-spec-role"] == "exploit"
        assert response.headers["x-spec-variant"] == learned

    # The database goes away: B answers on, counts the outage, and writes once it is back.
    pg.stop()
    for n in range(3):
        assert _send(b.url, edit(200 + n)).status_code == 200
    until(lambda: metric(b, "tuner_fleet_storage_up") == 0)
    assert metric(b, "tuner_fleet_storage_outages_total") == 1
    assert metric(b, "tuner_fleet_events_pending") > 0
    pg.start()
    until(lambda: metric(b, "tuner_fleet_events_pending") == 0)
    assert metric(b, "tuner_fleet_storage_up") == 1
    assert metric(b, "tuner_fleet_events_dropped_total") == 0
    assert b.stop() == 0

    # A comes back on its own state dir after the -9: what it wrote after its last save is
    # read back, B's requests are added, and nothing is counted twice.
    a = start_daemon(state_a, env=env)
    until(lambda: metric(a, "tuner_fleet_events_pending") == 0)
    assert a.stop() == 0
    assert evidence_requests(state_a) == 20 + 4 + 3 == evidence_requests(state_b)

    report = json.loads(_tuner("report", "--storage-url", pg_url, "--format", "json"))
    rows = {row["class"]: row for row in report["classes"]}
    code = next(key for key in rows if key.startswith("code/echo/"))
    assert rows[code]["daemons"] == 2 and rows["all"]["daemons"] == 2
    assert rows[code]["variant"] == learned
    assert len(report["fleet"]["daemons"]) == 2
    assert report["fleet"]["scope"].count("@") == 2  # model, hardware, build
