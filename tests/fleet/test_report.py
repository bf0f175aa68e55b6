"""``tuner report --storage-url``: the fleet's view, read from a real PostgreSQL server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tuning.sim import SimUpstream, config, drive, make, truth
from tuner.fleet.ledger import Ledger
from tuner.fleet.sync import FleetSync
from tuner.report.fleet import load_fleet_report
from tuner.upstream.capabilities import Capabilities

SCOPE = "gemma@cpu-2@0c1e570"


@pytest.fixture
def fleet(pg_url: str, tmp_path: Path, caps: Capabilities) -> Iterator[str]:
    """Two daemons of one scope, each with its own classes, and one of another scope."""
    syncs = []
    for name, scope, key in (
        ("a", SCOPE, "code/echo/greedy"),
        ("b", SCOPE, "prose/fresh/sampled"),
        ("c", "other@hw@b", "code/echo/greedy"),
    ):
        sync = FleetSync(Ledger(pg_url), scope, f"host-{name}:/state")
        engine = make(tmp_path / name, config(explore_share=0.5), caps, publish=sync.publish)
        drive(engine, SimUpstream(truth(list(engine.variants.values()))), [key] * 40)
        assert sync.sync(engine) and sync.sync(engine)
        document = {
            "version": 1,
            "model": "gemma",
            "build": "0c1e570",
            "saved": 1.0,
            "classes": engine.snapshot(),
        }
        sync.put_document(document)
        syncs.append(sync)
    yield pg_url
    for sync in syncs:
        sync.ledger.close()


def test_each_class_says_how_many_daemons_its_evidence_is_from(fleet: str) -> None:
    report = load_fleet_report(fleet, SCOPE)
    rows = {row.class_key: row for row in report.classes}
    assert rows["code/echo/greedy"].daemons == 1  # only a served it (c is another scope)
    assert rows["prose/fresh/sampled"].daemons == 1
    assert rows["all"].daemons == 2
    assert report.fleet is not None
    assert report.fleet["scope"] == SCOPE and report.fleet["other_scopes"] == ["other@hw@b"]
    assert {d["node"] for d in report.fleet["daemons"]} == {"host-a:/state", "host-b:/state"}


def test_the_command_prints_the_same_classes_as_json_and_as_a_table(fleet: str) -> None:
    def tuner(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tuner", "report", "--storage-url", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    # the newest document is another scope's (c saved last): that is the one shown
    shown = json.loads(tuner(fleet, "--format", "json").stdout)
    assert shown["fleet"]["scope"] == "other@hw@b"
    assert shown["classes"][0]["class"] == "all"
    assert all(row["daemons"] == 1 for row in shown["classes"])
    table = tuner(fleet).stdout
    assert "fleet: postgresql://" in table and "daemons" in table
    down = tuner("postgresql://tuner@127.0.0.1:9/none")
    assert down.returncode == 2 and "cannot read the fleet's database" in down.stderr
