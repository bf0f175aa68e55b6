"""The fleet's shared evidence in PostgreSQL: an append-only log of events per writer.

Three tables, keyed by ``scope`` (model fingerprint, hardware class and llama.cpp build:
daemons of another scope never read each other's rows):

- ``spec_tuner_writers``: one row per daemon process (``writer``), with the ``node`` it
  runs as (host and state dir, the same across restarts), when it was last heard from and
  the last sequence number it wrote;
- ``spec_tuner_events``: the events (``tuner.tuning.runtime.events``), numbered 1, 2, ... per
  writer; a batch is written in one transaction with its writer's ``last_seq``, and a
  re-sent batch (a commit whose answer was lost) changes nothing;
- ``spec_tuner_documents``: each node's latest policy file, for ``tuner report``.

A reader keeps, per writer, the last number it has absorbed, and asks only for what is
newer: a primary-key range scan per writer that wrote since.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from tuner.tuning.runtime.events import Event, dump

__all__ = ["Ledger", "Pulled", "Writer", "redact"]

CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 30_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS spec_tuner_writers (
    scope text NOT NULL,
    writer text NOT NULL,
    node text NOT NULL,
    started timestamptz NOT NULL DEFAULT now(),
    seen timestamptz NOT NULL DEFAULT now(),
    last_seq bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, writer)
);
CREATE TABLE IF NOT EXISTS spec_tuner_events (
    scope text NOT NULL,
    writer text NOT NULL,
    seq bigint NOT NULL,
    class_key text NOT NULL,
    event jsonb NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (scope, writer, seq)
);
CREATE TABLE IF NOT EXISTS spec_tuner_documents (
    scope text NOT NULL,
    node text NOT NULL,
    saved timestamptz NOT NULL DEFAULT now(),
    document jsonb NOT NULL,
    PRIMARY KEY (scope, node)
);
"""


def redact(url: str) -> str:
    """The URL without its password, for logs and reports.

    >>> redact("postgresql://tuner:s3cret@db:5432/tuner")
    'postgresql://tuner:***@db:5432/tuner'
    >>> redact("postgresql:///tuner?host=/run/postgresql")
    'postgresql:///tuner?host=/run/postgresql'
    """
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


@dataclass(frozen=True, slots=True)
class Writer:
    writer: str
    node: str
    seen: float  # seconds since the epoch
    last_seq: int


@dataclass(frozen=True, slots=True)
class Pulled:
    writer: str
    seq: int
    event: Any  # as stored; the caller parses it


class Ledger:
    """One connection to the fleet's database, opened on first use and again after an
    error; every method raises ``psycopg.Error`` (or ``OSError``) while it is down.
    Thread-safe: one lock around the connection."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection[Any] | None = None
        self._schema = False
        self._lock = threading.Lock()

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            conn = self._conn = psycopg.connect(
                self.url,
                connect_timeout=CONNECT_TIMEOUT_S,
                options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            )
        if not self._schema:
            with conn.transaction():
                # concurrent CREATE TABLE IF NOT EXISTS can still collide: one at a time
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('spec_tuner_schema'))")
                conn.execute(SCHEMA)
            self._schema = True
        return conn

    def _run(self, work: Any) -> Any:
        with self._lock:
            try:
                return work(self._connection())
            except BaseException:
                conn = self._conn
                if conn is not None and (conn.broken or conn.closed):
                    conn.close()
                    self._conn = None
                elif conn is not None:
                    conn.rollback()
                raise

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def append(
        self, scope: str, writer: str, node: str, batch: Sequence[tuple[int, Event]]
    ) -> None:
        """Write one writer's events (its sequence numbers, ascending) in one transaction;
        with an empty batch, only say the writer is alive."""

        def work(conn: psycopg.Connection[Any]) -> None:
            last = max((seq for seq, _ in batch), default=0)
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(
                    "INSERT INTO spec_tuner_writers (scope, writer, node, last_seq)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (scope, writer) DO UPDATE SET"
                    " seen = now(),"
                    " last_seq = GREATEST(spec_tuner_writers.last_seq, EXCLUDED.last_seq)",
                    (scope, writer, node, last),
                )
                cur.executemany(
                    "INSERT INTO spec_tuner_events (scope, writer, seq, class_key, event)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [(scope, writer, seq, e.class_key, Jsonb(dump(e))) for seq, e in batch],
                )

        self._run(work)

    def writers(self, scope: str) -> list[Writer]:
        def work(conn: psycopg.Connection[Any]) -> list[Writer]:
            rows = conn.execute(
                "SELECT writer, node, extract(epoch FROM seen), last_seq"
                " FROM spec_tuner_writers WHERE scope = %s ORDER BY started, writer",
                (scope,),
            ).fetchall()
            conn.commit()
            return [Writer(w, n, float(s), int(q)) for w, n, s, q in rows]

        result: list[Writer] = self._run(work)
        return result

    def pull(
        self, scope: str, since: dict[str, int], *, skip: str = "", limit: int = 20_000
    ) -> list[Pulled]:
        """Events newer than ``since`` (last number absorbed, per writer), writer by writer
        in order, at most ``limit`` (the rest at the next call); ``skip``: a writer not to
        read (this daemon)."""
        newer = [
            w
            for w in self.writers(scope)
            if w.writer != skip and w.last_seq > since.get(w.writer, 0)
        ]

        def work(conn: psycopg.Connection[Any]) -> list[Pulled]:
            out: list[Pulled] = []
            for w in newer:
                if len(out) >= limit:
                    break
                rows = conn.execute(
                    "SELECT seq, event FROM spec_tuner_events"
                    " WHERE scope = %s AND writer = %s AND seq > %s ORDER BY seq LIMIT %s",
                    (scope, w.writer, since.get(w.writer, 0), limit - len(out)),
                ).fetchall()
                out.extend(Pulled(w.writer, int(seq), event) for seq, event in rows)
            conn.commit()
            return out

        result: list[Pulled] = self._run(work)
        return result

    def put_document(self, scope: str, node: str, document: dict[str, Any]) -> None:
        def work(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction():
                conn.execute(
                    "INSERT INTO spec_tuner_documents (scope, node, document) VALUES (%s, %s, %s)"
                    " ON CONFLICT (scope, node) DO UPDATE SET saved = now(),"
                    " document = EXCLUDED.document",
                    (scope, node, Jsonb(document)),
                )

        self._run(work)

    def documents(self, scope: str | None = None) -> list[tuple[str, str, float, Any]]:
        """(scope, node, saved, document), newest first; of every scope when None."""

        def work(conn: psycopg.Connection[Any]) -> list[tuple[str, str, float, Any]]:
            rows = conn.execute(
                "SELECT scope, node, extract(epoch FROM saved), document"
                " FROM spec_tuner_documents WHERE %s::text IS NULL OR scope = %s"
                " ORDER BY saved DESC",
                (scope, scope),
            ).fetchall()
            conn.commit()
            return [(s, n, float(t), d) for s, n, t, d in rows]

        result: list[tuple[str, str, float, Any]] = self._run(work)
        return result

    def contributors(self, scope: str) -> dict[str, set[str]]:
        """Per leaf class, the nodes whose requests are in its evidence."""

        def work(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
            rows = conn.execute(
                "SELECT DISTINCT e.class_key, w.node FROM spec_tuner_events e"
                " JOIN spec_tuner_writers w ON w.scope = e.scope AND w.writer = e.writer"
                " WHERE e.scope = %s AND coalesce(e.event->>'kind', e.event->>'k') = 'served'",
                (scope,),
            ).fetchall()
            conn.commit()
            out: dict[str, set[str]] = {}
            for key, node in rows:
                out.setdefault(key, set()).add(node)
            return out

        result: dict[str, set[str]] = self._run(work)
        return result
