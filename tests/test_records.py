"""Records are appended off the request path, bounded, and survive torn writes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tuner.records import RecordStore, RequestRecord, Timings, read_records


def record(i: int) -> RequestRecord:
    return RequestRecord(
        id=f"r{i}",
        ts=float(i),
        endpoint="/v1/completions",
        stream=False,
        status=200,
        proxy_ms=2.0,
        upstream_ms=1.5,
        timings=Timings(predicted_n=i, draft_n=4),
    )


async def test_records_round_trip(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    await store.start()
    for i in range(10):
        store.submit(record(i))
    await store.stop()
    back = list(read_records(tmp_path))
    assert [r.id for r in back] == [f"r{i}" for i in range(10)]
    assert back[3].timings == Timings(predicted_n=3, draft_n=4)
    assert back[0].overhead_ms == 0.5


async def test_files_rotate_and_stay_bounded(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, max_file_bytes=600, max_files=3)
    for i in range(60):
        store._write([record(i)])
    files = sorted(tmp_path.glob("records-*.jsonl"))
    assert len(files) == 3
    ids = [r.id for r in read_records(tmp_path)]
    assert ids[-1] == "r59" and len(ids) < 60
    assert ids == sorted(ids, key=lambda x: int(x[1:]))


async def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    store._write([record(1), record(2)])
    path = next(tmp_path.glob("records-*.jsonl"))
    with path.open("ab") as handle:
        handle.write(b'{"id": "r3", "ts": 3.0, "endpo')
    assert [r.id for r in read_records(tmp_path)] == ["r1", "r2"]
    RecordStore(tmp_path)._write([record(4)])  # after a restart: not glued to the torn line
    assert [r.id for r in read_records(tmp_path)] == ["r1", "r2", "r4"]


async def test_a_write_cut_short_by_a_full_disk_leaves_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RecordStore(tmp_path)
    store._write([record(1)])
    real_write = os.write

    def full(fd: int, data: bytes) -> int:  # the disk takes 20 bytes, then is full
        monkeypatch.setattr(os, "write", lambda *_: _raise(OSError(errno.ENOSPC, "full")))
        return real_write(fd, bytes(data)[:20])

    monkeypatch.setattr(os, "write", full)
    store._write([record(2), record(3)])
    assert store.write_errors == 1
    monkeypatch.setattr(os, "write", real_write)
    path = next(tmp_path.glob("records-*.jsonl"))
    assert path.read_bytes().endswith(b"}\n")  # the 20 bytes were cut back
    store._write([record(4)])
    assert [r.id for r in read_records(tmp_path)] == ["r1", "r4"]


def _raise(exc: Exception) -> None:
    raise exc


async def test_unwritable_directory_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = RecordStore(blocker / "records")
    store._write([record(1)])
    assert store.write_errors == 1


async def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, queue_size=2)
    for i in range(5):
        store.submit(record(i))
    assert store.dropped == 3
    await store.start()
    await store.flush()
    assert [r.id for r in store.recent] == ["r0", "r1"]
    await store.stop()


async def test_builders_run_off_the_loop_and_bad_ones_are_counted(tmp_path: Path) -> None:
    store = RecordStore(tmp_path)
    await store.start()

    def broken() -> RequestRecord:
        raise ValueError("bad timings")

    store.submit(lambda: record(1))
    store.submit(broken)
    store.submit(lambda: None)  # a builder may decide there is nothing to record
    store.submit(record(2))
    await store.flush()
    await store.stop()
    assert [r.id for r in read_records(tmp_path)] == ["r1", "r2"]
    assert store.build_errors == 1


async def test_records_submitted_together_are_written_as_one_batch(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, linger_s=0.05)
    writes: list[int] = []
    original = store._write
    store._write = lambda batch: (writes.append(len(batch)), original(batch))[1]  # type: ignore[method-assign]
    await store.start()
    for i in range(20):
        store.submit(record(i))
    await store.flush()
    await store.stop()
    assert writes == [20]
    assert len(list(read_records(tmp_path))) == 20
