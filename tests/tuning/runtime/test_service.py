"""TuningService persistence: a state dir that refuses writes, a policy file it cannot restore."""

from __future__ import annotations

import asyncio
import json
from functools import partial
from pathlib import Path

import pytest

from tests.tuning.sim import CODE, HELP, SimUpstream, config, drive, make, schedule, truth
from tuner.tuning.runtime.policy_file import POLICY_FILE, read_document
from tuner.tuning.runtime.service import TuningService
from tuner.upstream.capabilities import parse_capabilities


def _service(tmp_path: Path) -> TuningService:
    """A fresh engine's service on this state dir (not started)."""
    caps = parse_capabilities(HELP.read_text())
    return TuningService(
        partial(make, tmp_path, config(explore_share=0.5), caps), tmp_path, {"model_key": "m"}
    )


def test_an_unwritable_policy_file_is_counted_and_retried(tmp_path: Path) -> None:
    service = _service(tmp_path)
    engine = service.engine
    drive(engine, SimUpstream(truth(list(engine.variants.values()))), schedule(200))
    (tmp_path / POLICY_FILE).mkdir()  # the rename over it fails, as on a full or broken disk
    assert service.save() is False and service.save_errors == 1
    (tmp_path / POLICY_FILE).rmdir()
    assert service.save() is True
    document = read_document(tmp_path / POLICY_FILE)
    assert document is not None and CODE in document["classes"]
    asyncio.run(service.stop())


def _learned(tmp_path: Path) -> tuple[TuningService, dict[str, object]]:
    """A service whose engine learned from 200 requests and saved its policy file."""
    service = _service(tmp_path)
    engine = service.engine
    drive(engine, SimUpstream(truth(list(engine.variants.values()))), schedule(200))
    assert service.save() is True
    document = read_document(tmp_path / POLICY_FILE)
    assert document is not None
    return service, document


def _start_fresh(tmp_path: Path) -> TuningService:
    """A new daemon's service on the same state dir: started, then stopped."""
    service = _service(tmp_path)

    async def run() -> None:
        await service.start()
        await service.stop()

    asyncio.run(run())
    return service


@pytest.mark.parametrize("damage", ["json", "entry"])
def test_a_policy_file_it_cannot_restore_is_set_aside_and_the_daemon_starts_fresh(
    tmp_path: Path, damage: str
) -> None:
    """A hand edit that breaks the file's JSON, or one class entry the engine cannot parse
    (a word where a count belongs), neither stops the daemon from starting nor is lost: the
    file is renamed ``policies.<time>.bad.json`` as it was, and the engine starts fresh,
    with nothing half-restored from it."""
    first, document = _learned(tmp_path)
    asyncio.run(first.stop())
    path = tmp_path / POLICY_FILE
    if damage == "json":
        text = path.read_text()[:-40]  # cut short
    else:
        classes = document["classes"]
        assert isinstance(classes, dict)
        last = sorted(classes)[-1]  # the others would restore before it
        arm = next(iter(classes[last]["arms"].values()))
        arm["served"] = [["many", 1, 2, 0]]
        text = json.dumps(document)
    path.write_text(text)
    service = _start_fresh(tmp_path)
    (aside,) = tmp_path.glob("policies.*.bad.json")
    assert aside.read_text() == text
    assert all(state.seen == 0 for state in service.engine.classes.values())
    fresh = read_document(path)  # what the new daemon saved on stopping
    assert fresh is not None and fresh["classes"] == {}


def test_stopping_is_bounded_when_the_shared_database_hangs(tmp_path: Path) -> None:
    """A fleet database that stops answering holds the last sync; the service still stops
    within its bound, says so, and the policy file saved before it stands."""
    import threading
    import time

    from structlog.testing import capture_logs

    release = threading.Event()

    class HungFleet:
        def sync(self, engine: object) -> bool:
            release.wait(30)
            return False

        def describe(self) -> dict[str, object]:
            return {}

        def restore(self, saved: object) -> None:
            pass

        def put_document(self, document: dict[str, object]) -> None:
            pass

        def close(self) -> None:
            pass

    caps = parse_capabilities(HELP.read_text())
    service = TuningService(
        partial(make, tmp_path, config(explore_share=0.5), caps),
        tmp_path,
        {"model_key": "m"},
        fleet=HungFleet(),
        stop_s=0.5,
    )
    assert service.save()
    started = time.monotonic()
    with capture_logs() as logs:
        asyncio.run(service.stop())
    release.set()
    assert time.monotonic() - started < 5.0
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["tuning_stop_timed_out"]
    assert read_document(tmp_path / POLICY_FILE) is not None


def test_a_service_that_handed_its_file_over_never_writes_it_again(tmp_path: Path) -> None:
    """The service of a topology being replaced saves once more for its successor to load,
    then serves its last requests without touching the file the successor now owns."""
    service, _ = _learned(tmp_path)
    assert asyncio.run(service.hand_over()) is True
    handed = (tmp_path / POLICY_FILE).read_bytes()
    (tmp_path / POLICY_FILE).write_text('{"written": "by the successor"}')
    drive(service.engine, SimUpstream(truth(list(service.engine.variants.values()))), schedule(50))
    assert service.save() is True
    asyncio.run(service.stop())
    assert (tmp_path / POLICY_FILE).read_text() == '{"written": "by the successor"}'
    assert b'"classes"' in handed
