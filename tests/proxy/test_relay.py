"""Failures upstream: an answer cut short is never relayed as a whole one, a stuck stream is
cut, a variant that fails before answering is tried again without speculation (against the
fake llama-server; the real router: tests/integration/test_router_faults.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import openai
import pytest
from starlette.applications import Starlette

from tests.fake_llama import FakeLlamaServer
from tests.proxy.test_app import CHAT, next_record
from tuner.proxy import relay
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.proxy.gate import VariantGate
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient

PROXY_ERROR = b"proxy error: Failed to read connection"


def _events(text: str) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


@pytest.mark.parametrize("tail", [[PROXY_ERROR], [PROXY_ERROR + b"\n"], []])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/completion"])
async def test_a_stream_cut_upstream_ends_with_an_error_event_and_is_recorded_as_failed(
    proxy: httpx.AsyncClient,
    fake: FakeLlamaServer,
    store: RecordStore,
    tail: list[bytes],
    path: str,
) -> None:
    """A router writes "proxy error: ..." into the stream of an instance that died, or the
    stream just ends: either way without its end marker. The client gets an OpenAI-shaped
    error event last; the record is a 502 with the reason, not a complete 200."""
    fake.stream_tail = tail
    body = CHAT if path.endswith("chat/completions") else {"prompt": "hi", "max_tokens": 4}
    response = await proxy.post(path, json={**body, "stream": True})
    last = _events(response.text)[-1]
    assert last["error"]["code"] == "upstream_disconnected"  # type: ignore[index]
    record = await next_record(store)
    assert record.status == 502 and record.error and "middle of the answer" in record.error
    if tail:
        assert "proxy error" in record.error


async def test_whole_streams_end_clean_on_every_endpoint(
    proxy: httpx.AsyncClient, store: RecordStore
) -> None:
    """``[DONE]`` ends an OpenAI stream, the native endpoint's ``"stop": true`` chunk its own."""
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/completion", {"prompt": "hi"})):
        response = await proxy.post(path, json={**body, "stream": True})
        assert not [e for e in _events(response.text) if "error" in e], response.text
        record = await next_record(store)
        assert record.status == 200 and record.error is None and record.timings is not None


async def test_the_openai_sdk_raises_on_a_cut_stream_and_a_cut_answer(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    client = openai.AsyncOpenAI(api_key="unused", base_url="http://proxy/v1", http_client=proxy)
    fake.stream_tail = [PROXY_ERROR]
    stream = await client.completions.create(model="x", prompt="a", max_tokens=4, stream=True)
    with pytest.raises(openai.APIError, match="middle of the answer"):
        _ = [chunk async for chunk in stream]
    fake.cut_body_at = 40  # a whole answer cut short: not JSON that ends
    with pytest.raises(openai.InternalServerError) as caught:
        await client.completions.create(model="x", prompt="a", max_tokens=4)
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_disconnected"  # type: ignore[index]
    assert [r.status for r in [await next_record(store), await next_record(store)]] == [502, 502]


async def test_a_router_proxy_error_answer_is_a_502_upstream_disconnected(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    """Before any header: the router answers 500 with a plain-text "proxy error" body."""
    fake.plain_error = (500, PROXY_ERROR)
    response = await proxy.post("/v1/completions", json={"prompt": "hi"})
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_disconnected"
    assert (await next_record(store)).status == 502


@pytest.mark.parametrize(("times", "status"), [(2, 200), (None, 502)])
async def test_a_router_that_cannot_reach_an_instance_yet_gets_the_request_again(
    proxy: httpx.AsyncClient,
    fake: FakeLlamaServer,
    store: RecordStore,
    monkeypatch: pytest.MonkeyPatch,
    times: int | None,
    status: int,
) -> None:
    """Right after an instance died the router answers "could not establish connection"
    until it has seen the exit: the request never reached an instance, so it is sent again
    after a pause (four times at most), then answered or refused as a 502."""
    monkeypatch.setattr(relay, "RESEND_AFTER_S", (0.0, 0.0, 0.0, 0.0))
    fake.plain_error, fake.plain_error_times = (500, relay.NOT_CONNECTED), times
    response = await proxy.post("/v1/completions", json={"prompt": "hi"})
    assert response.status_code == status
    assert len(fake.requests) == (3 if times else 5)
    assert (await next_record(store)).status == status


async def test_a_stream_that_goes_silent_is_cut_and_its_instance_reloaded(
    fake: FakeLlamaServer, store: RecordStore
) -> None:
    """After its first chunk, a stream silent for the stall bound ends with an
    ``upstream_stalled`` event, is recorded as a 504, and in router mode its preset is
    unloaded (the router loads it anew on the next request); ``/ready`` lists it as
    recovering until one of its answers completes."""
    fake.hold_stream, fake.hold_stream_at = asyncio.Event(), 2  # never set: stuck
    upstream = UpstreamClient("http://fake", transport=fake.transport(), stall_timeout_s=0.2)
    upstream.model_ids = ("none", "ngram-mod")  # a router's presets
    upstream.health.answering(True)
    app = create_app(Backend(upstream), store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as p:
        body = {"model": "ngram-mod", "prompt": "hi", "stream": True}
        response = await p.post("/v1/completions", json=body)
        assert _events(response.text)[-1]["error"]["code"] == "upstream_stalled"  # type: ignore[index]
        record = await next_record(store)
        assert record.status == 504 and "sent nothing" in (record.error or "")
        for _ in range(50):  # the unload runs in the background
            if any(r["path"] == "/models/unload" for r in fake.requests):
                break
            await asyncio.sleep(0.01)
        assert {"path": "/models/unload", "body": {"model": "ngram-mod"}} in fake.requests
        assert upstream.health.stalls == 1
        assert (await p.get("/ready")).json()["recovering"] == ["ngram-mod"]
        fake.hold_stream = None
        assert (await p.post("/v1/completions", json=body)).status_code == 200
        assert "recovering" not in (await p.get("/ready")).json()
    await upstream.aclose()


@dataclass(frozen=True)
class _Routed:
    variant: str
    role: str = "exploit"
    trial: int | None = None
    fields: dict[str, object] | None = None
    session: str | None = None

    @property
    def model(self) -> str:
        return self.variant


def _to_ngram_mod(
    upstream: UpstreamClient,
    store: RecordStore,
    fallback: Callable[[str, str, str], _Routed | None],
) -> Starlette:
    """The proxy routing every request to ``ngram-mod`` through the variant gate, with
    ``fallback`` for a second try."""
    backend = Backend(
        upstream,
        router=lambda key, prompt: _Routed("ngram-mod"),
        fallback=fallback,
        gate=VariantGate(),
    )
    return create_app(backend, store)


async def test_a_variant_that_fails_before_answering_is_tried_again_without_speculation(
    upstream: UpstreamClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    """Its preset did not load (a 500 from the router): the request goes once more with
    the routing ``fallback`` gives (no speculation) and is answered; both are recorded."""
    fake.plain_error, fake.plain_error_times = (500, b"model name=ngram-mod failed to load"), 1
    fallen: list[tuple[str, str]] = []

    def fallback(
        variant: str, request_id: str, reason: str, class_key: str | None
    ) -> _Routed | None:
        assert request_id.startswith("req_")
        fallen.append((variant, reason))
        return None if variant == "none" else _Routed("none", "fallback")

    app = _to_ngram_mod(upstream, store, fallback)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as p:
        response = await p.post("/v1/completions", json={"prompt": "hi"})
        assert response.status_code == 200 and response.headers["x-spec-variant"] == "none"
        assert response.headers["x-spec-role"] == "fallback"
        fake.plain_error_times = 2  # the second try fails too: its error is the answer
        response = await p.post("/v1/completions", json={"prompt": "hi", "stream": True})
        assert response.status_code == 502
    await store.flush()
    rows = [(r.variant, r.role, r.status) for r in store.recent]
    assert rows == [
        ("ngram-mod", "exploit", 502),
        ("none", "fallback", 200),
        ("ngram-mod", "exploit", 502),
        ("none", "fallback", 502),
    ]
    assert [v for v, _ in fallen] == ["ngram-mod", "ngram-mod"]
    assert all("failed to load" in reason for _, reason in fallen), fallen


@pytest.mark.parametrize("alive", [True, False])
async def test_a_whole_answer_that_takes_long_is_probed_and_cut_only_if_stuck(
    store: RecordStore, alive: bool
) -> None:
    """A non-streaming request sends nothing until it is done: past the stall bound the
    daemon probes the instance (``/props?model=``); alive, it waits on; stuck, the request
    is a 504 ``upstream_stalled`` and the preset is reloaded."""
    finish = asyncio.Event()
    calls: list[str] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/props" and alive:
            return httpx.Response(200, json={})
        if request.url.path in ("/props", "/v1/completions"):
            await asyncio.wait_for(finish.wait(), 2.0 if alive else 30.0)
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    upstream = UpstreamClient(
        "http://f", transport=httpx.MockTransport(handle), stall_timeout_s=0.2
    )
    upstream.model_ids = ("none", "ngram-mod")
    upstream.health.answering(True)
    app = create_app(Backend(upstream), store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as p:
        if alive:
            asyncio.get_running_loop().call_later(0.7, finish.set)
        response = await p.post("/v1/completions", json={"model": "ngram-mod", "prompt": "hi"})
    assert response.status_code == (200 if alive else 504)
    assert calls.count("/props") >= (2 if alive else 1)
    if not alive:
        assert response.json()["error"]["code"] == "upstream_stalled"
        assert upstream.health.is_recovering("ngram-mod") and upstream.health.stalls == 1
    await upstream.aclose()


async def test_requests_waiting_on_a_stuck_instance_go_again_without_speculation(
    store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance that stops answering (SIGSTOP) while requests wait on it, nothing back
    yet: its probe fails within seconds, long before the stall bound; it is unloaded once
    for all of them and each is answered without speculation."""
    monkeypatch.setattr(relay, "PROBE_AFTER_S", 0.2)
    monkeypatch.setattr(relay, "PROBE_TIMEOUT_S", 0.2)
    calls: list[str] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        model = request.url.params.get("model") or body.get("model")
        calls.append(f"{request.url.path} {model}")
        if model == "ngram-mod" and request.url.path != "/models/unload":
            await asyncio.sleep(60)  # stopped: neither its answers nor its probe come
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    upstream = UpstreamClient("http://f", transport=httpx.MockTransport(handle), stall_timeout_s=90)
    upstream.model_ids = ("none", "ngram-mod")
    upstream.health.answering(True)

    def fallback(
        variant: str, request_id: str, reason: str, class_key: str | None
    ) -> _Routed | None:
        assert "stopped answering" in reason
        return None if variant == "none" else _Routed("none", "fallback")

    app = _to_ngram_mod(upstream, store, fallback)
    started = asyncio.get_running_loop().time()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as p:
        answers = await asyncio.gather(
            *(p.post("/v1/completions", json={"prompt": "hi"}) for _ in range(3))
        )
    assert asyncio.get_running_loop().time() - started < 5  # not the 90 s stall bound
    assert [a.status_code for a in answers] == [200] * 3
    assert {a.headers["x-spec-role"] for a in answers} == {"fallback"}
    assert calls.count("/models/unload ngram-mod") == 1 and upstream.health.stalls == 3
    assert calls.count("/props ngram-mod") == 1  # the three waited on one probe
    await store.flush()
    failed = [r for r in store.recent if r.variant == "ngram-mod"]
    assert [r.status for r in failed] == [504] * 3
    await upstream.aclose()


async def test_a_second_try_that_fails_is_recorded_too(
    fake: FakeLlamaServer, store: RecordStore
) -> None:
    """The fallback's own failure (the server became unreachable) is the answer, and both
    tries are recorded."""
    fake.plain_error, fake.plain_error_times = (500, b"model name=ngram-mod failed to load"), 1
    upstream = UpstreamClient("http://fake", transport=fake.transport())
    upstream.health.answering(True)

    def fallback(variant: str, request_id: str, reason: str, class_key: str | None) -> _Routed:
        upstream.health.answering(False)  # gone between the two tries
        return _Routed("none", "fallback")

    backend = Backend(upstream, router=lambda key, prompt: _Routed("ngram-mod"), fallback=fallback)
    app = create_app(backend, store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as p:
        response = await p.post("/v1/completions", json={"prompt": "hi"})
    assert response.status_code == 503
    await store.flush()
    assert [(r.variant, r.status) for r in store.recent] == [("ngram-mod", 502), ("none", 503)]
    await upstream.aclose()
