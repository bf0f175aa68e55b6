"""A record's consumers: each finished request, built once, handed to every part that reads
it (metrics, the learner), each on a thread of its own behind a bounded queue.

The record writer (``tuner.records.RecordStore``) offers each record it builds to every
consumer and goes on to write it: a consumer that is slow, or whose queue is full, neither
delays the write nor drops the record for another. A full queue drops the record for
that consumer alone, and counts it (``tuner_record_consumer_dropped_total{consumer}``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.logs import get_logger

__all__ = ["Consumer", "ConsumersCollector"]

log = get_logger(__name__)

T = TypeVar("T")
_STOP = object()


class Consumer(Generic[T]):
    """One reader of the records: ``handle`` runs on the consumer's own thread, for each
    item offered, in order."""

    def __init__(self, name: str, handle: Callable[[T], None], *, size: int = 10_000) -> None:
        self.name = name
        self.handle = handle
        self.dropped = 0  # offered while the queue was full
        self.failed = 0  # raised in ``handle``
        self._queue: queue.Queue[object] = queue.Queue(maxsize=size)
        self._thread: threading.Thread | None = None

    def offer(self, item: T) -> bool:
        """Queue one item; never blocks. False (and counted) when the queue is full."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"consumer-{self.name}", daemon=True
            )
            self._thread.start()

    def join(self) -> None:
        """Wait until every item offered so far is handled (blocks: call off the loop)."""
        self._queue.join()

    def stop(self) -> None:
        """Handle what is queued, then end the thread (blocks)."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self.handle(item)  # type: ignore[arg-type]
            except Exception:  # a consumer must never stop on one bad item
                self.failed += 1
                log.exception("record_consumer_failed", consumer=self.name)
            finally:
                self._queue.task_done()


class ConsumersCollector(Collector):
    """Each consumer's queue and what it dropped, read when Prometheus scrapes."""

    def __init__(self, consumers: Sequence[Consumer[Any]]) -> None:
        self.consumers = consumers

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            "tuner_record_consumer_dropped",
            "Request records a consumer did not get because its queue was full "
            "(the record was still written)",
            labels=["consumer"],
        )
        failed = CounterMetricFamily(
            "tuner_record_consumer_failed",
            "Request records a consumer raised on",
            labels=["consumer"],
        )
        pending = GaugeMetricFamily(
            "tuner_record_consumer_pending", "Records queued for a consumer", labels=["consumer"]
        )
        for consumer in self.consumers:
            dropped.add_metric([consumer.name], consumer.dropped)
            failed.add_metric([consumer.name], consumer.failed)
            pending.add_metric([consumer.name], consumer.pending)
        yield from (dropped, failed, pending)
