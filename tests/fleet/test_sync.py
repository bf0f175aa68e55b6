"""Daemons' engines pooling evidence through a real PostgreSQL server (``FleetSync``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import PgServer
from tests.tuning.sim import CODE, SimUpstream, config, drive, evidence, make, schedule, truth
from tuner.fleet.ledger import Ledger
from tuner.fleet.sync import FleetSync
from tuner.transfer import Machine, export_policies, import_policies
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.policy_file import (
    POLICY_FILE,
    load_policies,
    read_document,
    save_policies,
)
from tuner.upstream.capabilities import Capabilities

SCOPE = "gemma@cpu-2@0c1e570"
META = {"model": "gemma", "model_key": "gemma-abc", "hardware_key": "cpu-2", "build": "0c1e570"}


class Daemons:
    """Engines wired to their fleet's sync, as ``plan_tuning`` wires them."""

    def __init__(self, url: str, tmp: Path, caps: Capabilities) -> None:
        self.url, self.tmp, self.caps = url, tmp, caps
        self.syncs: list[FleetSync] = []

    def start(self, name: str, scope: str = SCOPE, **kw: int) -> tuple[Engine, FleetSync]:
        sync = FleetSync(Ledger(self.url), scope, f"host:{name}", **kw)
        self.syncs.append(sync)
        engine = make(self.tmp / name, config(explore_share=0.5), self.caps, publish=sync.publish)
        return engine, sync


@pytest.fixture
def daemons(pg_url: str, tmp_path: Path, caps: Capabilities) -> Iterator[Daemons]:
    made = Daemons(pg_url, tmp_path, caps)
    yield made
    for sync in made.syncs:
        sync.ledger.close()


def test_two_daemons_end_with_the_evidence_of_both(daemons: Daemons) -> None:
    a, sync_a = daemons.start("a")
    b, sync_b = daemons.start("b")
    sim = SimUpstream(truth(list(a.variants.values())))
    drive(a, sim, schedule(300, seed=1))
    assert sync_a.sync(a) and sync_b.sync(b)
    assert evidence(b) == evidence(a)  # b learned everything a served
    drive(b, sim, schedule(200, seed=2))
    drive(a, sim, schedule(100, seed=3))
    for _ in range(2):
        assert sync_a.sync(a) and sync_b.sync(b)
    assert evidence(a) == evidence(b)
    assert a.classes[CODE].arms["none"].requests > 0
    assert sum(s.requests for s in a.classes["all"].arms.values()) == 600
    assert sync_a.up and sync_a.outages == 0 and not sync_a.outbox


def test_another_model_or_build_never_mixes(daemons: Daemons) -> None:
    a, sync_a = daemons.start("a")
    other, sync_other = daemons.start("o", scope="gemma@cpu-2@another-build")
    drive(a, SimUpstream(truth(list(a.variants.values()))), schedule(50))
    assert sync_a.sync(a) and sync_other.sync(other)
    assert other.classes == {} and sync_other.absorbed == 0


def test_a_database_outage_loses_nothing(pg: PgServer, daemons: Daemons) -> None:
    a, sync_a = daemons.start("a")
    b, sync_b = daemons.start("b")
    sim = SimUpstream(truth(list(a.variants.values())))
    drive(a, sim, schedule(50, seed=1))
    assert sync_a.sync(a)
    pg.stop()
    drive(a, sim, schedule(150, seed=2))  # a keeps serving and learning
    assert not sync_a.sync(a) and not sync_a.sync(a)
    assert sync_a.up is False and sync_a.outages == 1  # one outage, however many tries
    assert len(sync_a.outbox) >= 150
    pg.start()
    assert sync_a.sync(a) and not sync_a.outbox
    assert sync_b.sync(b)
    assert evidence(b) == evidence(a)


def test_a_crash_between_saves_neither_loses_nor_doubles(daemons: Daemons) -> None:
    """The policy file holds the evidence with the numbers it includes; what was written
    after it is read back from the database by the restarted daemon."""
    a, sync_a = daemons.start("a")
    sim = SimUpstream(truth(list(a.variants.values())))
    drive(a, sim, schedule(120, seed=1))
    assert sync_a.sync(a)
    drive(a, sim, schedule(30, seed=2))  # in the outbox when the file is saved
    with a.locked():
        saved, cursors = a.snapshot(), sync_a.describe()
    drive(a, sim, schedule(40, seed=3))  # written to the database, not to the file
    assert sync_a.sync(a)
    # -9 here; the restart: a new writer, the file's evidence, its cursors and outbox
    again, sync_again = daemons.start("a")
    again.restore(saved)
    sync_again.restore(cursors)
    assert len(sync_again.outbox) >= 30  # sent again: the database keeps one copy
    assert sync_again.sync(again)
    assert evidence(again) == evidence(a)


def test_a_long_outage_drops_the_oldest_events_and_says_so(pg: PgServer, daemons: Daemons) -> None:
    a, sync_a = daemons.start("a", outbox=20)
    pg.stop()
    drive(a, SimUpstream(truth(list(a.variants.values()))), schedule(30))
    assert not sync_a.sync(a)
    assert len(sync_a.outbox) == 20 and sync_a.dropped >= 10
    pg.start()
    assert sync_a.sync(a) and sync_a.written == 20


def test_an_export_imported_into_another_member_counts_nothing_twice(
    daemons: Daemons, tmp_path: Path
) -> None:
    """``tuner policies export`` on a member carries its cursors and unsent events: the
    member it is imported into reads from the fleet only what the file does not hold."""
    a, sync_a = daemons.start("a")
    b, sync_b = daemons.start("b")
    sim = SimUpstream(truth(list(a.variants.values())))
    drive(a, sim, schedule(120, seed=1))
    drive(b, sim, schedule(80, seed=2))
    assert sync_b.sync(b) and sync_a.sync(a)  # a holds b's first 80
    drive(a, sim, schedule(30, seed=3))  # still in a's outbox when exported
    with a.locked():
        save_policies(
            tmp_path / "a" / POLICY_FILE, META, a.snapshot(), extra={"fleet": sync_a.describe()}
        )
    export_policies(tmp_path / "a", tmp_path / "export.json")
    import_policies(
        tmp_path / "export.json",
        tmp_path / "c",
        Machine(
            META["model"], META["model_key"], META["hardware_key"], {"llama.cpp": META["build"]}
        ),
    )
    drive(b, sim, schedule(40, seed=4))
    assert sync_b.sync(b)
    # c starts on the imported file, as ``TuningService.start`` does, a long after
    c, sync_c = daemons.start("c")
    c.restore(load_policies(tmp_path / "c" / POLICY_FILE, META))
    sync_c.restore((read_document(tmp_path / "c" / POLICY_FILE) or {}).get("fleet"))
    assert sync_c.sync(c) and sync_a.sync(a) and sync_b.sync(b)
    assert evidence(c) == evidence(a) == evidence(b)
    assert sum(s.requests for s in c.classes["all"].arms.values()) == 120 + 80 + 30 + 40
