"""Replacing the topology while the daemon serves, on fake upstreams: a request keeps the
backend it began on, the next one goes to the new one, the old one stops once drained, and
a new one that does not come up leaves the old one serving. The real engines' swap is
``tests/integration/test_swap.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.asgi import post_scope
from tests.fake_llama import FakeLlamaServer
from tuner.daemon.deployment import Deployment, Serving, deploy
from tuner.daemon.topology import Topology
from tuner.errors import UpstreamError
from tuner.proxy.app import create_app
from tuner.records import RecordStore, RequestRecord
from tuner.settings import Settings
from tuner.upstream.client import UpstreamClient
from tuner.upstream.process import ExternalMonitor

COMPLETION = {"prompt": "hi", "max_tokens": 4, "stream": True}


def _topology(fake: FakeLlamaServer, name: str, tmp: Path) -> Topology:
    settings = Settings(upstream_url=f"http://{name}", state_dir=tmp)  # type: ignore[arg-type]
    client = UpstreamClient(f"http://{name}", transport=fake.transport())
    return Topology("external", settings, client, ExternalMonitor(client, interval_s=0.02), name)


@pytest.fixture
async def records(tmp_path: Path) -> AsyncIterator[RecordStore]:
    store = RecordStore(tmp_path / "records", linger_s=0)
    await store.start()
    yield store
    await store.stop()


async def _serving(first: Deployment) -> Serving:
    serving = Serving(first, startup_timeout_s=5, drain_timeout_s=5)
    await serving.start()
    await first.topology.supervisor.wait_ready(5)
    return serving


def _held_stream(app: Any, started: asyncio.Event, chunks: list[bytes]) -> asyncio.Task[None]:
    """A streamed completion driven through the app by hand: httpx's ASGI transport reads
    a whole response before it returns one, so it cannot hold a stream open."""
    body = json.dumps(COMPLETION).encode()
    sent: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            started.set()

    return asyncio.create_task(app(post_scope(), receive, send))


async def test_a_request_finishes_on_the_old_backend_and_the_next_goes_to_the_new(
    tmp_path: Path, records: RecordStore
) -> None:
    hold = asyncio.Event()
    old_fake, new_fake = FakeLlamaServer(hold_stream=hold), FakeLlamaServer()
    first = deploy(_topology(old_fake, "old", tmp_path))
    serving = await _serving(first)
    app = create_app(serving.slot, records)
    started, chunks = asyncio.Event(), list[bytes]()
    held = _held_stream(app, started, chunks)
    await asyncio.wait_for(started.wait(), 5)
    swap = asyncio.create_task(
        serving.replace(lambda: _topology(new_fake, "new", tmp_path), records)
    )
    for _ in range(200):  # the new one is up and serving, the old one drains
        if serving.current is not first:
            break
        await asyncio.sleep(0.01)
    assert serving.current is not first
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as proxy:
        answered = await proxy.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert answered.status_code == 200
    assert not swap.done()  # the held stream keeps the old one up
    assert first.backend.in_flight == 1
    hold.set()
    await asyncio.wait_for(held, 5)
    assert b"[DONE]" in b"".join(chunks)
    assert await asyncio.wait_for(swap, 5) is True
    assert [r["body"]["prompt"] for r in old_fake.requests] == ["hi"]
    # the new one's warm-up, then the request sent after the switch
    assert [r["body"]["prompt"] for r in new_fake.requests] == ["Hello", "x"]
    assert first.backend.in_flight == 0
    assert first.backend.upstream.http.is_closed
    await serving.stop()


async def test_a_new_topology_that_does_not_come_up_leaves_the_old_one_serving(
    tmp_path: Path, records: RecordStore
) -> None:
    first = deploy(_topology(FakeLlamaServer(), "old", tmp_path))
    serving = Serving(first, startup_timeout_s=0.3, drain_timeout_s=5)
    await serving.start()
    await first.topology.supervisor.wait_ready(5)
    sick = FakeLlamaServer(healthy=False)
    assert await serving.replace(lambda: _topology(sick, "sick", tmp_path), records) is False
    assert serving.current is first and serving.slot.backend is first.backend

    def fails() -> Topology:
        raise UpstreamError("llama-server could not be built")

    assert await serving.replace(fails, records) is False
    assert serving.current is first
    assert not first.backend.upstream.http.is_closed
    await serving.stop()


async def test_one_replacement_at_a_time(tmp_path: Path, records: RecordStore) -> None:
    serving = await _serving(deploy(_topology(FakeLlamaServer(), "a", tmp_path)))
    assert serving.request(lambda: _topology(FakeLlamaServer(), "b", tmp_path), records)
    assert not serving.request(lambda: _topology(FakeLlamaServer(), "c", tmp_path), records)
    for _ in range(300):
        if not serving.replacing:
            break
        await asyncio.sleep(0.01)
    assert serving.current.topology.served == "b"
    await serving.stop()


class _Learner:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def observe(self, record: RequestRecord) -> None:
        self.seen.append(record.id)


def _with_engine(tmp: Path, engine: str, learner: _Learner) -> Deployment:
    built = deploy(_topology(FakeLlamaServer(), engine, tmp))
    built.backend.engine = engine
    fake_tuning: Any = learner
    return Deployment(built.topology, built.backend, built.services, (), fake_tuning)


def test_a_record_goes_to_the_learner_of_the_engine_that_served_it(tmp_path: Path) -> None:
    ik, mainline = _Learner(), _Learner()
    serving = Serving(
        _with_engine(tmp_path, "llama.cpp", mainline), startup_timeout_s=1, drain_timeout_s=1
    )
    serving._live = (_with_engine(tmp_path, "ik_llama.cpp", ik), serving.current)
    base = {"ts": 0.0, "endpoint": "/v1/completions", "stream": False, "status": 200}
    for engine, rid in (("ik_llama.cpp", "a"), ("llama.cpp", "b"), (None, "c")):
        serving.observe(RequestRecord(id=rid, proxy_ms=1.0, engine=engine, **base))
    assert ik.seen == ["a"] and mainline.seen == ["b"]
