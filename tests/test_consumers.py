"""A record is built once and offered to each consumer on its own queue: a slow or full
consumer neither delays the write nor takes the record from another."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from prometheus_client import generate_latest

from tests.test_metrics import value
from tests.test_records import record
from tuner.consumers import Consumer
from tuner.metrics import Metrics, RequestMetrics
from tuner.records import RecordStore, RequestRecord, read_records
from tuner.upstream.client import UpstreamClient


async def _written(directory: Path, n: int, timeout_s: float = 5.0) -> list[RequestRecord]:
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        found = list(read_records(directory))
        if len(found) >= n:
            return found
        await asyncio.sleep(0.02)
    return list(read_records(directory))


async def test_a_stuck_consumer_does_not_delay_the_write_nor_the_others(tmp_path: Path) -> None:
    release = threading.Event()
    stuck: list[str] = []
    seen: list[str] = []

    def slow(r: RequestRecord) -> None:  # a learner busy with a long save
        release.wait(10)
        stuck.append(r.id)

    store = RecordStore(
        tmp_path,
        linger_s=0,
        consumers=[Consumer("learner", slow), Consumer("metrics", lambda r: seen.append(r.id))],
    )
    await store.start()
    try:
        for i in range(5):
            store.submit(record(i))
        written = await _written(tmp_path, 5)
        assert [r.id for r in written] == [f"r{i}" for i in range(5)]
        until = time.monotonic() + 5
        while len(seen) < 5 and time.monotonic() < until:
            await asyncio.sleep(0.02)
        assert seen == [f"r{i}" for i in range(5)] and stuck == []
    finally:
        release.set()
        await store.stop()
    assert stuck == [f"r{i}" for i in range(5)]  # stopping hands it what it was offered


async def test_a_full_queue_drops_for_its_consumer_alone_and_counts(tmp_path: Path) -> None:
    busy, release = threading.Event(), threading.Event()
    took: list[str] = []
    every: list[str] = []

    def learn(r: RequestRecord) -> None:
        busy.set()
        release.wait(10)
        took.append(r.id)

    learner = Consumer("learner", learn, size=2)
    requests = RequestMetrics()
    store = RecordStore(
        tmp_path,
        linger_s=0,
        consumers=[learner, Consumer("metrics", requests.observe), Consumer("all", every.append)],
    )
    upstream = UpstreamClient("http://fake")
    metrics = Metrics(requests, lambda: upstream, store)
    await store.start()
    try:
        store.submit(record(0))
        assert await asyncio.to_thread(busy.wait, 5)  # the learner holds r0
        for i in range(1, 10):
            store.submit(record(i))
        assert len(await _written(tmp_path, 10)) == 10  # every record is written
        until = time.monotonic() + 5
        while len(every) < 10 and time.monotonic() < until:
            await asyncio.sleep(0.02)
        assert len(every) == 10
        # one in the learner's hands, two queued: the rest dropped for it alone
        assert learner.dropped == 7
        text = generate_latest(metrics.registry).decode()
        assert value(text, "tuner_record_consumer_dropped_total", consumer="learner") == 7
        assert value(text, "tuner_record_consumer_dropped_total", consumer="metrics") == 0
        assert value(text, "tuner_requests_total", endpoint="/v1/completions", status="200",
                     class_key="unknown", variant="default") == 10  # fmt: skip
    finally:
        release.set()
        await store.stop()
    assert took == ["r0", "r1", "r2"]


def test_a_consumer_that_raises_keeps_consuming() -> None:
    got: list[int] = []

    def handle(n: int) -> None:
        if n == 1:
            raise ValueError("bad record")
        got.append(n)

    consumer = Consumer("picky", handle)
    consumer.start()
    for n in range(3):
        consumer.offer(n)
    consumer.stop()
    assert got == [0, 2] and consumer.failed == 1
