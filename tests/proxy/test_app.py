"""The proxy against a fake llama-server: pass-through, records, and every error path."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.fake_llama import TIMINGS, FakeLlamaServer
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.proxy.gate import VariantGate
from tuner.records import RecordStore, read_records
from tuner.upstream.client import UpstreamClient

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMPLETION = {"model": "whatever", "prompt": "Once", "max_tokens": 4, "temperature": 0}


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] is None or isinstance(error["code"], str)
    return dict(error)


async def next_record(store: RecordStore) -> Any:
    await store.flush()  # records are built and written off the request path
    return store.recent[-1]


async def test_chat_passes_through_and_records_timings(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    response = await proxy.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there"
    assert response.headers["x-request-id"].startswith("req_")
    record = await next_record(store)
    assert record.endpoint == "/v1/chat/completions"
    assert record.id == response.headers["x-request-id"]
    assert record.timings.draft_n_accepted == TIMINGS["draft_n_accepted"]
    assert record.model == "gpt-4o" and record.max_tokens == 4
    assert record.upstream_ms is not None and record.overhead_ms is not None


async def test_single_model_upstream_gets_the_body_byte_for_byte(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    """One served model: llama-server ignores `model`, so nothing is re-encoded."""
    raw = b'{"model":  "gpt-4o", "prompt": "caf\\u00e9", "max_tokens": 4}'
    await proxy.post("/v1/completions", content=raw)
    assert fake.raw[-1] == raw


async def test_multi_model_upstream_gets_a_model_it_serves(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, upstream: UpstreamClient
) -> None:
    upstream.model_ids = ("base", "ngram")
    await proxy.post("/v1/completions", json=COMPLETION)
    assert fake.requests[-1]["body"]["model"] == "base"
    await proxy.post("/v1/completions", json={**COMPLETION, "model": "ngram"})
    assert fake.requests[-1]["body"]["model"] == "ngram"


async def test_unknown_fields_pass_through_untouched(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    extra = {"cache_prompt": True, "n_probs": 3, "grammar": 'root ::= "a"', "x_custom": [1, {}]}
    await proxy.post("/v1/completions", json={**COMPLETION, **extra})
    sent = fake.requests[-1]["body"]
    assert {k: sent[k] for k in extra} == extra


async def test_stream_is_relayed_with_comments_and_timings_recorded(
    proxy: httpx.AsyncClient, store: RecordStore
) -> None:
    response = await proxy.post("/v1/completions", json={**COMPLETION, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    assert text.startswith(": ping\n\n")
    assert text.endswith("data: [DONE]\n\n")
    assert '"timings"' in text
    record = await next_record(store)
    assert record.stream and record.error is None
    assert record.timings.predicted_n == TIMINGS["predicted_n"]


async def test_upstream_dying_mid_stream_ends_with_an_error_event(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    fake.fail_stream_after = 2
    response = await proxy.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = [line for line in response.text.split("\n\n") if line.startswith("data: ")]
    last = json.loads(events[-1][len("data: ") :])
    assert last["error"]["code"] == "upstream_disconnected"
    assert "[DONE]" not in response.text
    record = await next_record(store)
    assert record.error and "stopped" in record.error


@dataclass(frozen=True)
class _Routed:
    variant: str = "ngram-mod.match24.max16"
    role: str = "exploit"
    trial: int | None = None
    model: str | None = "ngram-mod.match24.max16"
    fields: dict[str, Any] | None = None
    session: str | None = None


@pytest.mark.parametrize("stream", [False, True])
async def test_answers_name_the_offered_model_not_the_variants_preset(
    upstream: UpstreamClient, store: RecordStore, fake: FakeLlamaServer, stream: bool
) -> None:
    """In router mode the body goes upstream with the preset as its ``model`` and
    llama-server names it in the answer; the client sees the model it was offered."""
    app = create_app(
        Backend(upstream, router=lambda key, prompt: _Routed(), public_models=["gemma"]), store
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    assert response.status_code == 200
    assert response.headers["x-spec-variant"] == "ngram-mod.match24.max16"
    assert fake.requests[-1]["body"]["model"] == "ngram-mod.match24.max16"  # what upstream got
    if stream:
        events = [e for e in response.text.split("\n\n") if e.startswith("data: {")]
        objects = [json.loads(e[len("data: ") :]) for e in events]
        assert {o["model"] for o in objects if "model" in o} == {"gemma"}
        assert response.text.rstrip().endswith("[DONE]")
    else:
        assert response.json()["model"] == "gemma"
    record = await next_record(store)
    assert record.variant == "ngram-mod.match24.max16" and record.timings is not None


async def test_the_router_gets_the_prompt_and_the_record_says_how_the_turn_went(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    """The router sees each request's prompt (its blocks and the client's session id, from
    the ``x-session-id`` header first); the record keeps the prompt's length and the turn's
    outcome."""
    seen: list[Any] = []

    def router(key: str | None, prompt: Any) -> _Routed:
        seen.append(prompt)
        return _Routed(session="stayed")

    app = create_app(Backend(upstream, router=router, public_models=["gemma"]), store)
    transport = httpx.ASGITransport(app=app)
    body = {**CHAT, "user": "u1", "messages": [{"role": "user", "content": "x" * 600}]}
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        await client.post("/v1/chat/completions", json=body)
        await client.post("/v1/chat/completions", json=body, headers={"x-session-id": "s-9"})
    assert [p.session for p in seen] == ["u1", "s-9"]
    assert len(seen[0].blocks) == 2 and seen[0].blocks == seen[1].blocks
    assert seen[0].max_tokens == CHAT["max_tokens"]
    record = await next_record(store)
    assert record.session == "stayed" and record.prompt_chars == seen[1].chars


async def test_a_stream_past_the_drain_bound_ends_with_an_error_event(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    app = create_app(Backend(upstream), store)
    app.state.handlers.drain.cut = True  # what the daemon sets once the drain bound has passed
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        response = await client.post("/v1/completions", json={**COMPLETION, "stream": True})
    events = [line for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert len(events) == 1 and "[DONE]" not in response.text
    assert json.loads(events[0][len("data: ") :])["error"]["code"] == "server_shutting_down"
    record = await next_record(store)
    assert record.error and "drain bound" in record.error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"", None),
        (b"[1, 2]", None),
        (b'"text"', None),
        (json.dumps({"prompt": 5}).encode(), "prompt"),
        (json.dumps({"max_tokens": 3}).encode(), "prompt"),
        (json.dumps({**COMPLETION, "max_tokens": "many"}).encode(), "max_tokens"),
        (json.dumps({**COMPLETION, "stream": "yes"}).encode(), "stream"),
        (json.dumps({**COMPLETION, "temperature": -1}).encode(), "temperature"),
        (json.dumps({**COMPLETION, "stop": [1]}).encode(), "stop"),
        (b"\xff\xfe", None),
    ],
)
async def test_malformed_completion_requests_get_a_400_that_says_why(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, body: bytes, param: str | None
) -> None:
    response = await proxy.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, 400)
    assert error["param"] == param
    assert fake.requests == []


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (None, "'messages' is required"),
        ([], "non-empty"),
        (["hi"], "messages[0]"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
    ],
)
async def test_malformed_chat_requests_say_which_message_is_wrong(
    proxy: httpx.AsyncClient, messages: Any, fragment: str
) -> None:
    body = {"model": "m"} if messages is None else {"model": "m", "messages": messages}
    response = await proxy.post("/v1/chat/completions", json=body)
    assert fragment in assert_openai_error(response, 400)["message"]


async def test_oversized_body_is_refused_with_413(proxy: httpx.AsyncClient) -> None:
    response = await proxy.post("/v1/completions", json={**COMPLETION, "prompt": "x" * 70_000})
    assert_openai_error(response, 413)


async def test_not_ready_upstream_gives_503_with_retry_after(
    proxy: httpx.AsyncClient, upstream: UpstreamClient
) -> None:
    upstream.health.answering(False)
    response = await proxy.post("/v1/chat/completions", json=CHAT)
    error = assert_openai_error(response, 503)
    assert error["code"] == "upstream_not_ready"
    assert response.headers["retry-after"].isdigit()
    ready = await proxy.get("/ready")
    assert ready.status_code == 503 and "retry-after" in ready.headers
    assert (await proxy.get("/health")).status_code == 200


async def test_unreachable_upstream_gives_503_not_500(
    store: RecordStore,
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    from tuner.proxy.app import create_app

    client = UpstreamClient("http://fake", transport=httpx.MockTransport(refuse))
    client.health.answering(True)
    app = create_app(Backend(client), store)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        response = await c.post("/v1/completions", json=COMPLETION)
    assert_openai_error(response, 503)


@pytest.mark.parametrize(
    ("upstream_status", "upstream_type", "status", "code"),
    [
        (400, "exceed_context_size_error", 400, "context_length_exceeded"),
        (400, "invalid_request_error", 400, None),
        (500, "invalid_request_error", 400, None),
        (404, "not_found_error", 404, "not_found"),
        (501, "not_supported_error", 400, "not_supported"),
        (503, "unavailable_error", 503, "upstream_not_ready"),
        (500, "server_error", 502, "upstream_error"),
    ],
)
async def test_llama_server_errors_are_translated_to_the_openai_shape(
    proxy: httpx.AsyncClient,
    fake: FakeLlamaServer,
    upstream_status: int,
    upstream_type: str,
    status: int,
    code: str | None,
) -> None:
    fake.error = (
        upstream_status,
        {"error": {"code": upstream_status, "message": "boom", "type": upstream_type}},
    )
    response = await proxy.post("/v1/completions", json=COMPLETION)
    error = assert_openai_error(response, status)
    assert error["code"] == code and error["message"] == "boom"


async def test_models_lists_the_real_model(proxy: httpx.AsyncClient) -> None:
    response = await proxy.get("/v1/models")
    assert [m["id"] for m in response.json()["data"]] == ["fake-model"]


async def test_unknown_route_and_wrong_method_are_openai_errors(proxy: httpx.AsyncClient) -> None:
    assert_openai_error(await proxy.get("/v1/nothing"), 404)
    assert_openai_error(await proxy.get("/v1/chat/completions"), 405)


async def test_client_request_id_is_kept(proxy: httpx.AsyncClient, store: RecordStore) -> None:
    response = await proxy.post(
        "/completion", json={"prompt": "a"}, headers={"x-request-id": "abc-1"}
    )
    assert response.headers["x-request-id"] == "abc-1"
    assert (await next_record(store)).id == "abc-1"


async def test_many_concurrent_requests_all_pass(
    proxy: httpx.AsyncClient, store: RecordStore
) -> None:
    responses = await asyncio.gather(
        *(proxy.post("/v1/completions", json=COMPLETION) for _ in range(50))
    )
    assert all(r.status_code == 200 for r in responses)
    assert len({r.headers["x-request-id"] for r in responses}) == 50


async def test_openai_sdk_talks_to_the_proxy(proxy: httpx.AsyncClient) -> None:
    import openai

    client = openai.AsyncOpenAI(api_key="unused", base_url="http://proxy/v1", http_client=proxy)
    chat = await client.chat.completions.create(
        model="anything", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.choices[0].message.content == "Hello there"
    stream = await client.completions.create(model="x", prompt="a", max_tokens=4, stream=True)
    text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    assert text == "Hello there"
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="x", messages=[], max_tokens=4)
    assert "non-empty" in str(caught.value)


async def test_modalities_come_from_props_and_guard_media_parts(
    proxy: httpx.AsyncClient, upstream: UpstreamClient, fake: FakeLlamaServer
) -> None:
    await upstream.refresh_models()
    assert upstream.modalities == frozenset({"vision"})
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    body = {"messages": [{"role": "user", "content": [audio]}]}
    error = assert_openai_error(await proxy.post("/v1/chat/completions", json=body), 400)
    assert error["code"] == "unsupported_modality"
    assert fake.requests == []


async def test_each_request_logs_one_line_with_its_id(
    proxy: httpx.AsyncClient, store: RecordStore
) -> None:
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        plain = await proxy.post("/v1/completions", json=COMPLETION)
        streamed = await proxy.post("/v1/completions", json={**COMPLETION, "stream": True})
        await store.flush()
    lines = [entry for entry in logs if entry["event"] == "request"]
    assert [entry["request_id"] for entry in lines] == [
        plain.headers["x-request-id"],
        streamed.headers["x-request-id"],
    ]
    assert lines[1]["stream"] is True and lines[1]["predicted_n"] == TIMINGS["predicted_n"]


async def test_records_carry_the_class_and_features(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    from functools import partial

    from tuner.classify import classify, load_definitions
    from tuner.proxy.app import create_app

    app = create_app(
        Backend(upstream), store, classifier=partial(classify, definitions=load_definitions())
    )
    body = {
        "prompt": "Rename x to y and keep the rest identical:\n\ndef f(x):\n    return x + 1\n",
        "temperature": 0,
        "max_tokens": 8,
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p") as c:
        await c.post("/v1/completions", json=body)
    record = await next_record(store)
    assert record.class_key == "code/echo/greedy"
    assert record.features["content_type"] == "code" and record.features["echo"] >= 0.5


@pytest.mark.parametrize("gated", [False, True])
async def test_each_routed_request_records_its_variants_batch(
    upstream: UpstreamClient, store: RecordStore, fake: FakeLlamaServer, gated: bool
) -> None:
    """Streams held open at once: each record says how many requests of its variant were in
    flight as it was sent, itself included (through the CPU gate: a request of another
    variant waits, then is sent alone); the counts drop back as the streams end."""
    fake.hold_stream = asyncio.Event()

    def router(key: str | None, prompt: Any) -> _Routed:
        variant = "ngram-mod.match24.max16" if prompt.chars < 40 else "none"  # by its text
        return _Routed(variant=variant, model=variant)

    backend = Backend(
        upstream, router=router, gate=VariantGate() if gated else None, public_models=["g"]
    )
    app = create_app(backend, store)
    transport = httpx.ASGITransport(app=app)

    async def one(client: httpx.AsyncClient, text: str) -> None:
        body = {**CHAT, "stream": True, "messages": [{"role": "user", "content": text}]}
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            await response.aread()

    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
        tasks = [asyncio.create_task(one(client, "m")) for _ in range(2)]
        while len(fake.requests) < 2:
            await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(one(client, "p" * 60)))
        for _ in range(30 if gated else 1000):  # gated: the third waits its turn
            await asyncio.sleep(0.01)
            if len(fake.requests) == 3:
                break
        assert len(fake.requests) == (2 if gated else 3)
        fake.hold_stream.set()
        await asyncio.gather(*tasks)
    await store.flush()
    records = list(read_records(store.directory))
    batches = sorted((r.variant, r.batch) for r in records)
    assert batches == [("ngram-mod.match24.max16", 1), ("ngram-mod.match24.max16", 2), ("none", 1)]
    assert backend.running == {}
    waited = [r.wait_ms for r in records if r.variant == "none"]
    assert (waited[0] is not None and waited[0] > 0) if gated else waited == [None]


@pytest.mark.parametrize("stream", [False, True])
async def test_n_choices_are_one_request_each_joined_into_one_answer(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore, stream: bool
) -> None:
    """Neither engine needs to take ``n``: each choice is a request of its own, recorded."""
    body = {**COMPLETION, "prompt": ["One", "Two"], "n": 2, "stream": stream}
    response = await proxy.post("/v1/completions", json=body)
    assert response.status_code == 200
    assert [r["body"]["prompt"] for r in fake.requests] == ["One", "One", "Two", "Two"]
    assert all("n" not in r["body"] for r in fake.requests)
    if stream:
        events = [e[6:] for e in response.text.split("\n\n") if e.startswith("data: ")]
        assert events.count("[DONE]") == 1
        indexes = {c["index"] for e in events[:-1] for c in json.loads(e)["choices"]}
        assert indexes == {0, 1, 2, 3}
    else:
        answer = response.json()
        assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
        assert answer["usage"]["total_tokens"] == 4 * 11
    await store.flush()
    ids = sorted(r.id for r in store.recent)
    head = response.headers["x-request-id"]
    assert ids == sorted([head, f"{head}.1", f"{head}.2", f"{head}.3"])


async def test_fields_the_engines_read_otherwise_are_sent_as_both_read_them(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    """``max_completion_tokens`` goes as ``max_tokens`` too (ik_llama.cpp reads only that);
    ``best_of`` and ``suffix`` are dropped (mainline ignores them, ik_llama.cpp refuses)."""
    chat = {k: v for k, v in CHAT.items() if k != "max_tokens"}
    await proxy.post("/v1/chat/completions", json={**chat, "max_completion_tokens": 3})
    assert fake.requests[-1]["body"]["max_tokens"] == 3
    await proxy.post("/v1/completions", json={**COMPLETION, "best_of": 1, "suffix": "x"})
    assert not {"best_of", "suffix"} & fake.requests[-1]["body"].keys()
    echoed = await proxy.post("/v1/completions", json={**COMPLETION, "echo": True})
    assert echoed.json()["choices"][0]["text"] == "Once" + "Hello there"
    assert "echo" not in fake.requests[-1]["body"]
