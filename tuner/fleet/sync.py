"""One daemon's side of a fleet: publish its evidence, absorb everyone else's.

The engine calls ``publish`` (under its lock) for each event it applies to its own
evidence; the event is numbered and queued in the outbox. ``sync`` (the tuning service's
IO thread, every few seconds) writes the outbox to the ledger and absorbs what the other
writers wrote since the numbers in ``since``. The evidence, ``since`` and the outbox are
saved together in the policy file (``describe`` is read under the engine's lock with the
snapshot), so after a crash a restarted daemon re-sends what it had not written and reads
back what it had written but not saved: nothing is counted twice or lost.

While the database is down the daemon serves on what it knows; the outbox keeps up to
``OUTBOX`` events (about half as many requests), then drops the oldest, counted and logged.
Every process writes as a new writer; its node (host and state dir) stays the same.
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import Any, Protocol

import psycopg

from tuner.fleet.ledger import Ledger, redact
from tuner.logs import get_logger
from tuner.tuning.runtime.events import Event, dump, parse

__all__ = ["OUTBOX", "FleetSync"]

log = get_logger(__name__)

OUTBOX = 50_000  # events kept while the database is down
BATCH = 5_000  # events written per transaction


class Absorber(Protocol):
    def absorb(self, events: list[Event]) -> int: ...
    def locked(self) -> threading.RLock: ...


class FleetSync:
    def __init__(self, ledger: Ledger, scope: str, node: str, *, outbox: int = OUTBOX) -> None:
        self.ledger = ledger
        self.scope = scope
        self.node = node
        self.writer = uuid.uuid4().hex[:16]
        self.seq = 0
        self.since: dict[str, int] = {}  # per writer, the last event absorbed (or own)
        self.outbox: deque[tuple[str, int, Event]] = deque()
        self.bound = outbox
        self.up: bool | None = None  # None until the first sync
        self.outages = self.dropped = self.written = self.absorbed = self.bad = 0
        self._lock = threading.Lock()

    # -- the engine's side (its lock held) -------------------------------------------------

    def publish(self, event: Event) -> None:
        with self._lock:
            self.seq += 1
            if len(self.outbox) >= self.bound:
                self.outbox.popleft()
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.error("fleet_events_dropped", dropped=self.dropped, kept=self.bound)
            self.outbox.append((self.writer, self.seq, event))

    def describe(self) -> dict[str, Any]:
        """What the policy file keeps beside the evidence (read under the engine's lock)."""
        with self._lock:
            since = dict(self.since)
            if self.seq:
                since[self.writer] = self.seq
            return {
                "scope": self.scope,
                "node": self.node,
                "since": since,
                "outbox": [[w, s, dump(e)] for w, s, e in self.outbox],
            }

    def restore(self, saved: object) -> None:
        """Take back what a policy file kept (of this scope; anything else is ignored)."""
        if not isinstance(saved, dict) or saved.get("scope") != self.scope:
            return
        since, outbox = saved.get("since"), saved.get("outbox")
        with self._lock:
            if isinstance(since, dict):
                self.since = {str(w): int(s) for w, s in since.items() if isinstance(s, int)}
            if isinstance(outbox, list):
                for item in outbox[-self.bound :]:
                    event = parse(item[2]) if isinstance(item, list) and len(item) == 3 else None
                    if event is not None:  # one of an older version is migrated
                        self.outbox.append((str(item[0]), int(item[1]), event))

    # -- the IO thread -------------------------------------------------------------------

    def sync(self, engine: Absorber) -> bool:
        """Write the outbox, absorb what is new; False (logged, counted) when the database
        cannot be reached."""
        try:
            self._write()
            pulled = self.ledger.pull(self.scope, self.since, skip=self.writer)
        except (psycopg.Error, OSError) as exc:
            if self.up is not False:
                self.outages += 1
                log.error(
                    "fleet_storage_down",
                    url=redact(self.ledger.url),
                    error=str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                    detail="serving on what this daemon knows; its evidence is kept to write later",
                )
            self.up = False
            return False
        events = []
        for row in pulled:
            event = parse(row.event)
            if event is None:
                self.bad += 1
            else:
                events.append(event)
        with engine.locked():  # the evidence and ``since`` change together
            self.absorbed += engine.absorb(events) if events else 0
            with self._lock:
                for row in pulled:
                    self.since[row.writer] = max(self.since.get(row.writer, 0), row.seq)
        if self.up is not True:
            log.info(
                "fleet_storage_up",
                url=redact(self.ledger.url),
                absorbed=len(events),
                pending=len(self.outbox),
            )
        self.up = True
        return True

    def _write(self) -> None:
        """The outbox, oldest first, one writer's batch per transaction."""
        while True:
            with self._lock:
                head = list(self.outbox)[:BATCH]
            if not head:
                self.ledger.append(self.scope, self.writer, self.node, [])  # alive
                return
            writer = head[0][0]
            batch = [(seq, e) for w, seq, e in head if w == writer]
            self.ledger.append(self.scope, writer, self.node, batch)
            sent = {(writer, seq) for seq, _ in batch}
            with self._lock:
                while self.outbox and (self.outbox[0][0], self.outbox[0][1]) in sent:
                    self.outbox.popleft()
                    self.written += 1
            if len(head) < BATCH and len(batch) == len(head):
                return

    def put_document(self, document: dict[str, Any]) -> None:
        """The node's latest policy file, for the fleet's report (skipped while down)."""
        if self.up:
            try:
                self.ledger.put_document(self.scope, self.node, document)
            except (psycopg.Error, OSError) as exc:
                log.warning("fleet_document_not_written", error=str(exc).strip()[:200])

    def close(self) -> None:
        """Close the connection to the shared database."""
        self.ledger.close()
