"""TUNER_ENGINE=auto on the real builds of both engines: a daemon started on mainline
measures both side by side in the background while a client streams to it, and ends
serving on the one measured faster with no failed request while it switches (two clients
through a switch: ``test_swap.py``); what it found is in ``/ready``, ``/metrics``,
``tuner report`` and ``tuner engines``. ``tuner engines --measure`` runs the same
measurement (``tuner.engines.auto.measure_now``; its wiring: ``tests/cli/test_engines.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Clients, report_json, start_daemon
from tuner.engines.choice import CHOICE_FILE, EngineResult, load_choice, new_choice, save_choice
from tuner.records import read_records
from tuner.upstream.provision import built_engines
from tuner.upstream.sources import ENGINES

pytestmark = pytest.mark.llama


@pytest.fixture(autouse=True)
def _both_engines_built() -> None:
    from tuner.settings import Settings

    built = built_engines(Settings().cache_dir)
    if len(built) < 2:
        pytest.skip(f"both engines are needed (built: {built}); make provision builds them")


def _engines(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", "engines", "--state-dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _measured_side_by_side(state: Path) -> str:
    """What the daemon measured, as ``tuner engines`` shows it: every engine with its speed
    without speculation and with at least one n-gram setting, idle and loaded; the engine."""
    done = _engines(state, "--format", "json")
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    speeds = {r["engine"]: r["tok_s"] for r in found["results"]}
    assert set(speeds) == set(ENGINES) and all(s and s > 0 for s in speeds.values())
    for result in found["results"]:
        assert "none" in result["settings"] and len(result["settings"]) >= 2
        assert result["prompt_tok_s"] > 0 and result["decode_tok_s"] > 0
        assert result["loaded_tok_s"] > 0 and result["loaded_setting"] in result["settings"]
    # the clients-at-once figures are in the reason, unless mainline was kept within the margin
    assert "clients at once" in found["why"] or found["why"].endswith("kept"), found["why"]
    table = _engines(state)
    assert table.returncode == 0 and f"*{found['engine']}" in table.stdout
    assert "clients at once" in table.stdout
    return str(found["engine"])


def test_auto_switches_to_the_engine_measured_faster_without_a_failed_request(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    # a measurement of other builds that chose mainline: it starts there, then measures again
    stale = (
        EngineResult(engine="llama.cpp", build="old", tok_s=100.0, setting="none"),
        EngineResult(engine="ik_llama.cpp", build="old", tok_s=10.0, setting="none"),
    )
    save_choice(state / CHOICE_FILE, new_choice("m", "h", stale, None))
    running = start_daemon(state, env={"TUNER_ENGINE": "auto"})
    try:
        assert httpx.get(running.url + "/ready").json()["engine"] == "llama.cpp"
        # one client: streaming back to back through the switch, pausing while the engines
        # are measured (their threads and the serving instance's share two cores)
        with Clients(running, streams=(True,), pause_s=0.2) as clients:
            deadline = time.monotonic() + 900
            ready: dict[str, object] = {}
            while time.monotonic() < deadline:
                ready = httpx.get(running.url + "/ready", timeout=10).json()
                measuring = ready.get("engine_selection") == "measuring"
                clients.pause_s = 5.0 if measuring else 0.2
                choice = load_choice(state / CHOICE_FILE)
                if (
                    ready.get("engine_selection") == "done"
                    and choice is not None
                    and ready.get("engine") == choice.engine
                ):
                    break
                time.sleep(1)
            # served on the chosen engine a while: the request in flight at the switch ends
            # on the old one, the next ones begin on the chosen
            clients.answered_more(3)
        assert clients.failures == [], clients.failures[:5]
        choice = load_choice(state / CHOICE_FILE)
        assert choice is not None and choice.builds() != {"llama.cpp": "old"}
        assert ready.get("engine") == choice.engine, ready
        engines = ready["engines"]
        assert isinstance(engines, dict)
        assert all(engines[e]["tok_s"] > 0 for e in ENGINES), engines
        assert ready["engine_why"] == choice.why
        metrics = httpx.get(running.url + "/metrics").text
        assert 'tuner_engine_tokens_per_second{engine="ik_llama.cpp"' in metrics
        log = running.log.read_text()
        assert "engine_chosen" in log
        if choice.engine != "llama.cpp":
            assert "topology_replaced" in log
    finally:
        assert running.stop() == 0
    served = {r.engine for r in read_records(state / "records")}
    assert choice.engine in served
    errors = [r.id for r in read_records(state / "records") if r.status != 200]
    assert errors == []
    report = report_json(state)
    assert report["engines"]["engine"] == choice.engine
    assert _measured_side_by_side(state) == choice.engine
