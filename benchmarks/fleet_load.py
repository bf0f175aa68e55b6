"""What one PostgreSQL serves: simulated daemons writing and reading evidence at a real rate.

    python benchmarks/fleet_load.py --daemons 5,20,50 --rate 2 --seconds 60 \
        --out benchmarks/results/fleet_load.json

Each simulated daemon is a ``FleetSync`` (the daemon's own code) that publishes what one
request makes (a ``served`` event and a ``replayed`` event with six variants' counts) at
``--rate`` requests per second and syncs every 2 s, as the daemon does: it writes its
outbox in one transaction and reads every other daemon's new events. Its engine only
counts what it absorbs (the real engine's cost is the daemon's, not the database's). The
database is a fresh local server (``tests.pg_server``) unless ``--url`` names one.
Reported per fleet size: events written and read per second, sync latency, and the
database's CPU seconds (its processes, from /proc) per 1,000 events written and read; and
what one Optuna trial (ask and tell on a shared study) costs in transactions and rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import emit
from tests.pg_server import PgServer
from tuner.fleet.ledger import Ledger
from tuner.fleet.sync import FleetSync
from tuner.tuning.runtime import events as pooling

SYNC_S = 2.0
VARIANTS = [f"ngram-simple.n{n}.m{m}" for n in (3, 6) for m in (8, 16, 48)]


class Counter:
    """An engine that only counts what it absorbs."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.events = 0

    def absorb(self, events: list[pooling.Event]) -> int:
        self.events += len(events)
        return len(events)

    def locked(self) -> threading.RLock:
        return self.lock


def daemon(
    url: str, scope: str, i: int, rate: float, stop: threading.Event, latencies: list[float]
) -> FleetSync:
    sync = FleetSync(Ledger(url), scope, f"sim-{i}:/state")
    engine = Counter()
    next_sync = time.monotonic() + SYNC_S * (i % 10) / 10  # not all at once
    n = 0
    start = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        while n < due:
            n += 1
            key = ("code/echo/greedy", "text/fresh/sampled")[n % 2]
            sync.publish(pooling.served(key, VARIANTS[n % 6], 40.0 + n % 7, (64, 30, 20)))
            sync.publish(pooling.replayed(key, {v: (64, 24, 12) for v in VARIANTS}))
        if time.monotonic() >= next_sync:
            t = time.perf_counter()
            sync.sync(engine)
            latencies.append(time.perf_counter() - t)
            next_sync += SYNC_S
        time.sleep(0.05)
    return sync


def pg_cpu() -> float:
    """CPU seconds of every PostgreSQL process on this machine (ours, on a test box)."""
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "postgres" in cmd:
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    return total


def run(url: str, daemons: int, rate: float, seconds: float) -> dict[str, Any]:
    scope = f"load-{daemons}-{time.time_ns()}"
    stop = threading.Event()
    latencies: list[float] = []
    syncs: list[FleetSync] = []
    threads = [
        threading.Thread(
            target=lambda i=i: syncs.append(daemon(url, scope, i, rate, stop, latencies))
        )
        for i in range(daemons)
    ]
    cpu0, own0, t0 = pg_cpu(), time.process_time(), time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - t0
    cpu, own = pg_cpu() - cpu0, time.process_time() - own0
    written = sum(s.written for s in syncs)
    read = sum(s.absorbed for s in syncs)
    for s in syncs:
        s.ledger.close()
    lat = sorted(latencies)
    return {
        "daemons": daemons,
        "requests_per_s_each": rate,
        "seconds": round(elapsed, 1),
        "events_written_per_s": round(written / elapsed, 1),
        "events_read_per_s": round(read / elapsed, 1),
        "pending_at_end": sum(len(s.outbox) for s in syncs),
        "sync_ms_p50": round(1000 * statistics.median(lat), 1) if lat else None,
        "sync_ms_p99": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
        "db_cpu_s": round(cpu, 2),
        "db_cpu_share_of_one_core": round(cpu / elapsed, 3),
        "db_cpu_ms_per_1000_events": round(1000 * cpu / max(written + read, 1), 2),
        "client_cpu_share_of_one_core": round(own / elapsed, 3),
    }


def trial_cost(url: str, trials: int = 20) -> dict[str, float]:
    """What one Optuna trial (ask, heartbeat, tell) costs the database: transactions and
    rows written, from ``pg_stat_database`` around ``trials`` of them on a shared study."""
    import psycopg

    from tuner.tuning.search.studies import StudyBook

    space = {"ngram-simple": {"size_n": [3, 6, 12], "size_m": [8, 16, 48]}}
    book = StudyBook(url, f"trial-cost-{time.time_ns()}")
    study = book.open("code", space)  # the study and Optuna's tables exist before counting
    study.next()

    def stats() -> tuple[int, int]:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted"
                " FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
            time.sleep(0.6)  # the statistics collector's delay
            row = conn.execute(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted"
                " FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    x0, w0 = stats()
    for _ in range(trials):
        number, _ = study.next()
        study.tell(number, 1.1)
    x1, w1 = stats()
    book.close()
    return {
        "transactions_per_trial": round((x1 - x0 - 2) / trials, 1),
        "rows_written_per_trial": round((w1 - w0) / trials, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--daemons", default="5,20,50")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per daemon")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--url", help="an existing PostgreSQL (default: start one)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    server = None
    if args.url is None:
        server = PgServer(Path(tempfile.mkdtemp(prefix="spec-tuner-pg-")))
        server.start()
    url = args.url or (server.url if server else "")
    try:
        rows = [run(url, int(n), args.rate, args.seconds) for n in args.daemons.split(",")]
        trial = trial_cost(url)
    finally:
        if server is not None:
            server.stop()
    emit({"machine_cores": psutil.cpu_count(), "rows": rows, "optuna_trial": trial}, args.out)


if __name__ == "__main__":
    main()
