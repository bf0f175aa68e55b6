"""llama-server's routes that generate nothing go to the instance that always runs."""

from __future__ import annotations

import httpx
import pytest

from tests.fake_llama import FakeLlamaServer
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient


def _proxy(upstream: UpstreamClient, store: RecordStore) -> httpx.AsyncClient:
    app = create_app(Backend(upstream), store)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")


async def test_a_route_is_answered_by_the_kept_instance_of_a_router(
    fake: FakeLlamaServer, store: RecordStore
) -> None:
    """Behind a router the body names the preset that always runs, never a variant to load."""
    upstream = UpstreamClient(
        "http://fake", transport=fake.transport(), routes_models=True, kept="none"
    )
    upstream.model_ids = ("ngram-mod.a", "none")
    upstream.health.answering(True)
    async with _proxy(upstream, store) as proxy:
        response = await proxy.post("/tokenize", json={"content": "hi", "model": "x"})
        assert response.status_code == 200
        assert fake.requests[-1] == {
            "path": "/tokenize",
            "body": {"content": "hi", "model": "none"},
        }
        props = await proxy.get("/props")
        assert props.status_code == 200 and "modalities" in props.json()
    await upstream.aclose()


async def test_a_single_server_gets_the_body_as_it_was_sent(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    raw = b'{"tokens": [1, 2,  3]}'
    response = await proxy.post("/detokenize", content=raw)
    assert response.status_code == 200 and fake.raw[-1] == raw


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {}, "tokens"),
        ("/tokenize", {"content": {"text": 1}}, "content"),
        ("/apply-template", {"messages": "hi"}, "messages"),
        ("/v1/embeddings", {"model": "m"}, "input"),
        ("/v1/embeddings", {"input": [{"a": 1}]}, "input"),
        ("/v1/rerank", {"query": "q", "documents": "d"}, "documents"),
    ],
)
async def test_what_the_engine_would_fail_on_is_a_400_naming_the_field(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, path: str, body: dict[str, object], param: str
) -> None:
    response = await proxy.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake.requests == []


async def test_the_engines_refusals_come_back_as_4xx_in_openai_shape(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    """A server without --embeddings says 501 not_supported: the client's to fix, a 400."""
    message = "This server does not support embeddings. Start it with `--embeddings`"
    fake.error = (501, {"error": {"code": 501, "message": message, "type": "not_supported_error"}})
    refused = await proxy.post("/v1/embeddings", json={"input": "hi"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "not_supported"
    fake.error = (404, {"error": {"code": 404, "message": "File Not Found", "type": "x"}})
    lacking = await proxy.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
    assert lacking.status_code == 404 and "/v1/rerank" in lacking.json()["error"]["message"]


async def test_slots_and_unknown_routes_are_404s_naming_the_route(
    proxy: httpx.AsyncClient,
) -> None:
    for path in ("/slots", "/nope"):
        response = await proxy.get(path)
        assert response.status_code == 404 and path in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"input_prefix": 5}, "input_prefix"), ({"input_extra": "x"}, "input_extra"),
     ({"input_suffix": "s", "prompt": ["a"]}, "prompt")],
)  # fmt: skip
async def test_a_malformed_infill_is_a_400_naming_the_field(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, body: dict[str, object], param: str
) -> None:
    response = await proxy.post("/infill", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert fake.requests == []
