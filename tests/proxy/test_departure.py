"""A client that leaves cancels what its request started: the upstream call, its gate wait."""

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
from tuner.proxy.departure import CLIENT_GONE, CLIENT_GONE_STATUS
from tuner.proxy.gate import VariantGate
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient

BODY = {"prompt": "Hi"}  # no length: it would run until the context is full


class _Hanging:
    """An upstream whose generations never answer until cancelled; it counts both."""

    def __init__(self) -> None:
        self.fake = FakeLlamaServer()
        self.started = 0
        self.cancelled = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            self.started += 1
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return self.fake.handle(request)


def _client_leaving_after(seconds: float, body: dict[str, Any]) -> tuple[Any, Any]:
    """A client that sends ``body`` and hangs up ``seconds`` later."""
    sent: list[bool] = []

    async def receive() -> dict[str, Any]:
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": json.dumps(body).encode()}
        await asyncio.sleep(seconds)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        return None

    return receive, send


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choices", [1, 3])
async def test_a_client_gone_before_its_answer_cancels_the_upstream_requests(
    store: RecordStore, stream: bool, choices: int
) -> None:
    """Each choice's upstream request is cancelled, and each is recorded as abandoned."""
    hanging = _Hanging()
    upstream = UpstreamClient("http://fake", transport=httpx.MockTransport(hanging.handle))
    upstream.health.answering(True)
    app = create_app(Backend(upstream), store)
    receive, send = _client_leaving_after(0.05, {**BODY, "n": choices, "stream": stream})
    await asyncio.wait_for(app(post_scope(spec_version="2.3"), receive, send), timeout=5)
    assert (hanging.started, hanging.cancelled) == (choices, choices)
    assert app.state.handlers.in_flight == 0
    await store.flush()
    records = list(store.recent)[-choices:]
    assert len({r.id for r in records}) == choices
    assert {(r.status, r.error) for r in records} == {(CLIENT_GONE_STATUS, CLIENT_GONE)}
    await upstream.aclose()


async def test_a_client_gone_while_waiting_at_the_gate_leaves_the_queue(
    store: RecordStore,
) -> None:
    """The request behind another variant's leaves; the gate then idles once that ends."""
    fake = FakeLlamaServer()
    release = asyncio.Event()

    async def slow(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            await release.wait()
        return fake.handle(request)

    upstream = UpstreamClient("http://fake", transport=httpx.MockTransport(slow))
    upstream.health.answering(True)
    gate = VariantGate()
    variants = iter(["a", "b"])

    class Routed:
        def __init__(self) -> None:
            self.variant, self.role, self.trial = next(variants), "exploit", None
            self.model, self.session = None, None

    backend = Backend(upstream, router=lambda key, prompt: Routed(), gate=gate)
    app = create_app(backend, store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        first = asyncio.create_task(c.post("/v1/completions", json={**BODY, "max_tokens": 2}))
        await asyncio.sleep(0.05)
        receive, send = _client_leaving_after(0.05, BODY)
        await asyncio.wait_for(app(post_scope(), receive, send), timeout=5)
        assert gate.active == "a" and gate.busy() is not None  # nobody waits for b now
        release.set()
        assert (await first).status_code == 200
    assert gate.active is None and gate.in_flight == 0
    assert [r["body"].get("max_tokens") for r in fake.requests] == [2]  # b never went
    await store.flush()
    gone = next(r for r in store.recent if r.variant == "b")
    assert (gone.status, gone.error) == (CLIENT_GONE_STATUS, CLIENT_GONE)
    await upstream.aclose()
