"""API keys, the concurrency limit, and clean-up when a client leaves before its stream starts."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.asgi import post_scope
from tests.fake_llama import FakeLlamaServer
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient

BODY = {"prompt": "Hi", "max_tokens": 2}


def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")


async def test_api_keys_guard_everything_but_health(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    app = create_app(Backend(upstream), store, api_keys=["k1", "k2"])
    async with client_for(app) as c:
        for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic k1"}):
            response = await c.post("/v1/completions", json=BODY, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        ok = await c.post("/v1/completions", json=BODY, headers={"authorization": "Bearer k2"})
        assert ok.status_code == 200
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).status_code == 200
        import openai

        sdk = openai.AsyncOpenAI(api_key="k1", base_url="http://p/v1", http_client=c)
        assert (await sdk.completions.create(model="m", prompt="Hi", max_tokens=2)).choices
        wrong = openai.AsyncOpenAI(
            api_key="bad", base_url="http://p/v1", http_client=c, max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            await wrong.completions.create(model="m", prompt="Hi", max_tokens=2)


async def test_requests_beyond_the_limit_get_429_and_slots_come_back(store: RecordStore) -> None:
    gate = asyncio.Event()
    fake = FakeLlamaServer()

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/"):
            await gate.wait()
        return fake.handle(request)

    upstream = UpstreamClient("http://fake", transport=httpx.MockTransport(slow))
    upstream.health.answering(True)
    app = create_app(Backend(upstream), store, max_concurrent=1)
    async with client_for(app) as c:
        first = asyncio.create_task(c.post("/v1/completions", json=BODY))
        await asyncio.sleep(0.05)
        second = await c.post("/v1/completions", json=BODY)
        assert second.status_code == 429
        assert second.headers["retry-after"] == "1"
        assert second.json()["error"]["code"] == "rate_limit_exceeded"
        gate.set()
        assert (await first).status_code == 200
        streamed = await c.post("/v1/completions", json={**BODY, "stream": True})
        assert streamed.status_code == 200
    assert app.state.handlers.in_flight == 0
    await upstream.aclose()


async def test_client_gone_before_the_stream_starts(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    app = create_app(Backend(upstream), store, max_concurrent=4)
    body = json.dumps({**BODY, "stream": True}).encode()
    messages = [
        {"type": "http.request", "body": body, "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            raise OSError("client went away")

    with pytest.raises(Exception):  # noqa: B017 - Starlette turns the OSError into ClientDisconnect
        await app(post_scope(), receive, send)
    assert app.state.handlers.in_flight == 0
    await store.flush()
    assert store.recent[-1].error == "client disconnected before the stream started"


@pytest.mark.parametrize("at_done", [True, False])
async def test_a_client_that_closes_at_done_had_the_whole_answer(
    fake: FakeLlamaServer, upstream: UpstreamClient, store: RecordStore, at_done: bool
) -> None:
    """The official SDK closes its connection when it reads ``data: [DONE]``, which can be
    before upstream's own end of the response reaches the proxy: that request is complete
    (its record has no error, and it teaches the tuner). Gone before [DONE]: a disconnect."""
    fake.hold_stream = asyncio.Event()  # upstream pauses: at its end, or before [DONE]
    fake.hold_stream_at = None if at_done else 5
    gone_after = b"[DONE]" if at_done else b"timings"
    app = create_app(Backend(upstream), store, max_concurrent=4)
    body = json.dumps({**BODY, "stream": True}).encode()
    seen = asyncio.Event()
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(b"")
            return {"type": "http.request", "body": body, "more_body": False}
        await seen.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and gone_after in message.get("body", b""):
            seen.set()

    # 2.3: the client's close reaches the app as http.disconnect while it streams
    await asyncio.wait_for(app(post_scope(spec_version="2.3"), receive, send), timeout=10)
    await store.flush()
    record = store.recent[-1]
    if at_done:
        assert record.error is None and record.timings is not None
    else:
        assert record.error == "client disconnected"


async def test_unwritable_state_dir_keeps_serving(upstream: UpstreamClient, tmp_path: Any) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    store = RecordStore(blocker / "records", linger_s=0)  # every write fails
    await store.start()
    app = create_app(Backend(upstream), store)
    async with client_for(app) as c:
        for _ in range(3):
            assert (await c.post("/v1/completions", json=BODY)).status_code == 200
    await store.flush()
    await store.stop()
    assert store.write_errors >= 1
    assert len(store.recent) == 3  # still available to the tuner in memory
