"""Per-request records: what the tuner learns from.

Every proxied request yields one ``RequestRecord`` (ids, endpoint, proxy timing,
llama-server's ``timings``, and the class/variant/trial that the classifier and
tuner fill in). ``RecordStore`` takes records without blocking the request path:
the proxy submits a record, or a cheap closure that builds one, to an in-memory
queue; a background task builds the records in a worker thread (parsing the
response body, validating, logging) and appends them as JSON lines to rotating
files in ``<state>/records/``, bounded in size and count, with fsync per batch.
A crash can at most tear the last line, which readers skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tuner.consumers import Consumer
from tuner.logs import get_logger

__all__ = [
    "CLIENT_GONE",
    "RecordSource",
    "RecordStore",
    "RequestRecord",
    "Timings",
    "read_records",
    "requested_tokens",
]

log = get_logger(__name__)

# a record's error where its client closed the connection before its answer's end
CLIENT_GONE = "client disconnected"


class Timings(BaseModel):
    """llama-server's ``timings`` object. Missing draft keys mean nothing was drafted."""

    model_config = ConfigDict(extra="allow", frozen=True)

    cache_n: int | None = None
    prompt_n: int | None = None
    prompt_ms: float | None = None
    prompt_per_second: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _cached_from_n_past(cls, data: Any) -> Any:
        """ik_llama.cpp gives no ``cache_n``, but ``n_past`` (the slot's tokens after the
        answer): the prompt's cached part is what the prompt and answer do not account for.

        >>> Timings.model_validate({"prompt_n": 1, "predicted_n": 64, "n_past": 1064}).cache_n
        999
        """
        if not isinstance(data, dict) or data.get("cache_n") is not None:
            return data
        past, prompt, predicted = (data.get(k) for k in ("n_past", "prompt_n", "predicted_n"))
        if isinstance(past, int) and isinstance(prompt, int) and isinstance(predicted, int):
            return {**data, "cache_n": max(0, past - prompt - predicted)}
        return data


def requested_tokens(body: dict[str, Any]) -> int | None:
    """The answer's length limit a request body sets: OpenAI's ``max_tokens`` or
    ``max_completion_tokens``, llama.cpp's ``n_predict`` (-1: none); None when unset.

    >>> requested_tokens({"max_completion_tokens": 9}), requested_tokens({"n_predict": "x"})
    (9, None)
    """
    value = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict")))
    return value if isinstance(value, int) else None


class RequestRecord(BaseModel):
    """One request as the proxy saw it."""

    model_config = ConfigDict(frozen=True)

    id: str
    ts: float  # unix time the request arrived
    endpoint: str
    stream: bool
    status: int
    error: str | None = None
    model: str | None = None  # as the client asked
    max_tokens: int | None = None
    temperature: float | None = None
    proxy_ms: float  # arrival to last byte handed back
    upstream_ms: float | None = None  # request sent upstream to last byte received
    ttfb_ms: float | None = None  # request sent upstream to response headers
    wait_ms: float | None = None  # queued behind another variant (exclusive variants)
    active: int | None = None  # generation requests in flight as it arrived, itself included
    # routed: its variant's requests in flight as it was sent (past the gate), itself
    # included; the batch its instance decoded it in, where an instance serves one variant
    batch: int | None = None
    timings: Timings | None = None
    # Filled in by the classifier and the tuner.
    class_key: str | None = None
    features: dict[str, Any] | None = None
    variant: str | None = None
    role: str | None = None  # exploit, trial, control, pinned, fallback, held or joined
    trial: int | None = None
    # a conversation's turn: new, stayed (on the instance holding its history) or
    # moved:<reason>; and the prompt's length in characters (routing's unit)
    session: str | None = None
    prompt_chars: int | None = None
    engine: str | None = None  # llama.cpp or ik_llama.cpp (None: a server the user runs)
    replay: bool = False  # an idle-time replay of a sampled prompt, not a live request

    @property
    def overhead_ms(self) -> float | None:
        """Time the proxy itself added: everything not spent on upstream or in the queue."""
        if self.upstream_ms is None:
            return None
        return self.proxy_ms - self.upstream_ms - (self.wait_ms or 0.0)


RecordSource = RequestRecord | Callable[[], "RequestRecord | None"]


class RecordStore:
    """Queue records in memory; a background task builds and appends them to JSONL files."""

    def __init__(
        self,
        directory: Path,
        *,
        max_file_bytes: int = 32 * 1024 * 1024,
        max_files: int = 8,
        recent: int = 4096,
        queue_size: int = 10_000,
        linger_s: float = 0.2,
        consumers: Sequence[Consumer[RequestRecord]] = (),
    ) -> None:
        self.directory = directory
        # Wait this long after a record arrives so a batch gathers: one thread hop and one
        # fsync per batch, not per request (each cost the request path GIL time).
        self.linger_s = linger_s
        self._current: Path | None = None
        self._current_size = 0
        # Each built record is offered to these (metrics, the learner), then written.
        self.consumers = tuple(consumers)
        self.max_file_bytes = max_file_bytes
        self.max_files = max_files
        self.recent: deque[RequestRecord] = deque(maxlen=recent)
        self.dropped = 0
        self.write_errors = 0
        self.build_errors = 0
        self._queue: asyncio.Queue[RecordSource] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None

    def submit(self, record: RecordSource) -> None:
        """Take a record (or a function that builds one, run off the event loop); never blocks.

        Drops (and counts) when the queue is full.
        """
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self.dropped += 1

    async def flush(self) -> None:
        """Wait until everything submitted so far is built, written and consumed."""
        await self._queue.join()
        for consumer in self.consumers:
            await asyncio.to_thread(consumer.join)

    async def start(self) -> None:
        if self._task is None:
            for consumer in self.consumers:
                consumer.start()
            self._task = asyncio.create_task(self._drain(), name="record-writer")

    async def stop(self) -> None:
        """Write what is queued, then stop."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        batch = self._take_all()
        if batch:
            await asyncio.to_thread(self._write, batch)
        for consumer in self.consumers:  # each handles what it was offered, then ends
            await asyncio.to_thread(consumer.stop)

    def _take_all(self) -> list[RecordSource]:
        batch: list[RecordSource] = []
        while not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            if self.linger_s > 0:
                await asyncio.sleep(self.linger_s)
            batch.extend(self._take_all())
            try:
                await asyncio.to_thread(self._write, batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _build(self, batch: list[RecordSource]) -> list[RequestRecord]:
        records = []
        for item in batch:
            try:
                record = item if isinstance(item, RequestRecord) else item()
            except Exception:  # a bad record must never stop the writer
                self.build_errors += 1
                log.exception("record_build_failed")
                continue
            if record is not None:
                records.append(record)
                self.recent.append(record)
                for consumer in self.consumers:  # never blocks: a full queue drops for it
                    consumer.offer(record)
        return records

    def _write(self, batch: list[RecordSource]) -> None:
        records = self._build(batch)
        if not records:
            return
        data = "".join(r.model_dump_json(exclude_none=True) + "\n" for r in records).encode()
        try:
            path = self._current_file(len(data))
            self._current_size = _append_lines(path, data)
        except OSError as exc:
            self._current = None  # look again next time (the directory may be back)
            self.write_errors += 1
            log.error("record_write_failed", error=str(exc), records=len(records))

    def _files(self) -> list[Path]:
        return sorted(self.directory.glob("records-*.jsonl"), key=_file_number)

    def _current_file(self, incoming: int) -> Path:
        """The file to append to; the directory is listed only at start and on rotation."""
        if self._current is not None and self._current_size + incoming <= self.max_file_bytes:
            return self._current
        self.directory.mkdir(parents=True, exist_ok=True)
        files = self._files()
        if files and files[-1].stat().st_size + incoming <= self.max_file_bytes:
            self._current, self._current_size = files[-1], files[-1].stat().st_size
            return files[-1]
        number = _file_number(files[-1]) + 1 if files else 0
        for old in files[: max(0, len(files) + 1 - self.max_files)]:
            old.unlink(missing_ok=True)
        self._current = self.directory / f"records-{number:06d}.jsonl"
        self._current_size = 0
        return self._current


def _append_lines(path: Path, data: bytes) -> int:
    """Append whole lines to ``path``, fsynced; returns the file's new size.

    A write that fails half-way (a full disk) is cut back to where it started, so the
    file ends at a line boundary; a file that ends in a torn line (a crash, or a cut
    that failed too) gets a newline first: the next record is never glued to garbage.
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
        return start + len(data)
    finally:
        os.close(fd)


def _file_number(path: Path) -> int:
    try:
        return int(path.stem.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def read_records(directory: Path) -> Iterator[RequestRecord]:
    """Every stored record, oldest first; torn or foreign lines are skipped."""
    for path in sorted(directory.glob("records-*.jsonl"), key=_file_number):
        with path.open("rb") as handle:
            for line in handle:
                with contextlib.suppress(ValidationError, ValueError):
                    yield RequestRecord.model_validate_json(line)
