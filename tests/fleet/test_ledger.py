"""The fleet's event log on a real PostgreSQL server."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from tests.pg_server import PgServer
from tuner.fleet.ledger import Ledger
from tuner.tuning.runtime import events as pooling


@pytest.fixture
def ledger(pg_url: str) -> Iterator[Ledger]:
    found = Ledger(pg_url)
    yield found
    found.close()


A = pooling.served("code/echo/greedy", "ngram-mod.match12.max16", 40.0, (64, 30, 20))
B = pooling.replayed("text/fresh/sampled", {"ngram-simple.n3.m16": (32, 8, 2)})


def test_events_come_back_per_writer_in_order_and_only_what_is_newer(ledger: Ledger) -> None:
    ledger.append("m@hw@b", "w1", "host-a:/s", [(1, A), (2, B)])
    ledger.append("m@hw@b", "w2", "host-b:/s", [(1, B)])
    ledger.append("other@hw@b", "w3", "host-c:/s", [(1, A)])  # another model: never mixed
    pulled = ledger.pull("m@hw@b", {})
    assert [(p.writer, p.seq, pooling.parse(p.event)) for p in pulled] == [
        ("w1", 1, A),
        ("w1", 2, B),
        ("w2", 1, B),
    ]
    assert [(p.writer, p.seq) for p in ledger.pull("m@hw@b", {"w1": 1})] == [("w1", 2), ("w2", 1)]
    assert ledger.pull("m@hw@b", {"w1": 2, "w2": 1}) == []
    assert [p.writer for p in ledger.pull("m@hw@b", {}, skip="w1")] == ["w2"]
    assert len(ledger.pull("m@hw@b", {}, limit=2)) == 2  # the rest at the next call
    # contributors: per leaf class, the nodes that served requests of it
    assert ledger.contributors("m@hw@b") == {"code/echo/greedy": {"host-a:/s"}}


def test_a_batch_sent_again_changes_nothing(ledger: Ledger) -> None:
    ledger.append("s", "w1", "n", [(1, A), (2, A)])
    ledger.append("s", "w1", "n", [(2, A), (3, B)])  # its commit's answer was lost: re-sent
    assert [p.seq for p in ledger.pull("s", {})] == [1, 2, 3]
    assert [w.last_seq for w in ledger.writers("s")] == [3]
    ledger.append("s", "w1", "n", [(1, A)])  # an old outbox: the last number stays
    assert [w.last_seq for w in ledger.writers("s")] == [3]


def test_daemons_starting_together_create_the_tables_once(pg_url: str) -> None:
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            mine = Ledger(pg_url)
            mine.append("s", f"w{i}", f"n{i}", [(1, A)])
            mine.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    check = Ledger(pg_url)
    assert len(check.pull("s", {})) == 8
    check.close()


def test_documents_newest_first(ledger: Ledger) -> None:
    ledger.put_document("s", "n1", {"classes": {"a": 1}})
    ledger.put_document("s", "n2", {"classes": {"b": 2}})
    ledger.put_document("s", "n1", {"classes": {"a": 3}})
    assert [(n, d) for _, n, _, d in ledger.documents("s")] == [
        ("n1", {"classes": {"a": 3}}),
        ("n2", {"classes": {"b": 2}}),
    ]
    assert ledger.documents("other") == []


def test_a_restarted_database_is_reached_again(pg: PgServer, ledger: Ledger) -> None:
    ledger.append("s", "w1", "n", [(1, A)])
    pg.stop()
    with pytest.raises((psycopg.Error, OSError)):
        ledger.append("s", "w1", "n", [(2, A)])
    with pytest.raises((psycopg.Error, OSError)):
        ledger.writers("s")
    pg.start()
    ledger.append("s", "w1", "n", [(2, A)])
    assert [p.seq for p in ledger.pull("s", {})] == [1, 2]
