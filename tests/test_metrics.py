"""/metrics: valid Prometheus exposition that moves with real traffic (fake upstream here)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_llama import TIMINGS, FakeLlamaServer
from tuner.records import RecordStore, read_records
from tuner.upstream.client import UpstreamClient


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


def observed(fields: list[dict[str, Any]]) -> str:
    """The exposition after one answered request of ``code/echo/greedy`` per field set."""
    from prometheus_client import generate_latest

    from tuner.metrics import RequestMetrics
    from tuner.records import RequestRecord

    metrics = RequestMetrics()
    for i, extra in enumerate(fields):
        metrics.observe(
            RequestRecord(
                id=f"r{i}",
                ts=0.0,
                endpoint="/v1/completions",
                stream=False,
                status=200,
                proxy_ms=300.0,
                class_key="code/echo/greedy",
                **extra,
            )
        )
    return generate_latest(metrics.registry).decode()


async def test_metrics_parse_and_count_requests_tokens_and_drafts(
    proxy: httpx.AsyncClient, store: RecordStore, upstream: UpstreamClient
) -> None:
    before = (await proxy.get("/metrics")).text
    assert value(before, "tuner_upstream_ready") == 1.0
    body = {"prompt": "Hello", "max_tokens": 4}
    for _ in range(3):
        await proxy.post("/v1/completions", json=body)
    await proxy.post("/v1/completions", content=b"{broken")
    await store.flush()
    response = await proxy.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    arm = {"class_key": "unknown", "variant": "default"}
    ok = {"endpoint": "/v1/completions", "status": "200", **arm}
    bad = {"endpoint": "/v1/completions", "status": "400", **arm}
    assert value(text, "tuner_requests_total", **ok) == 3
    assert value(text, "tuner_requests_total", **bad) == 1
    assert value(text, "tuner_generated_tokens_total", **arm) == 3 * TIMINGS["predicted_n"]
    assert value(text, "tuner_draft_tokens_total", **arm) == 3 * TIMINGS["draft_n"]
    assert (
        value(text, "tuner_draft_accepted_tokens_total", **arm) == 3 * TIMINGS["draft_n_accepted"]
    )
    assert value(text, "tuner_proxy_overhead_seconds_count") == 3
    assert value(text, "tuner_request_duration_seconds_count", endpoint="/v1/completions") == 4
    upstream.health.answering(False)
    upstream.health.restarts = 2
    after = (await proxy.get("/metrics")).text
    assert value(after, "tuner_upstream_ready") == 0.0
    assert value(after, "tuner_upstream_restarts_total") == 2


async def test_prompt_tokens_the_cache_held_are_counted_apart(
    proxy: httpx.AsyncClient, store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn of a conversation: most of its prompt was in the server's cache."""
    monkeypatch.setitem(TIMINGS, "cache_n", 1200)
    monkeypatch.setitem(TIMINGS, "prompt_n", 30)
    for _ in range(2):
        await proxy.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
    await store.flush()
    text = (await proxy.get("/metrics")).text
    arm = {"class_key": "unknown", "variant": "default"}
    assert value(text, "tuner_prompt_cached_tokens_total", **arm) == 2 * 1200
    assert value(text, "tuner_prompt_tokens_total", **arm) == 2 * 30


def test_conversation_turns_are_counted_by_outcome(
    upstream: UpstreamClient, store: RecordStore
) -> None:
    turns = [
        ("new", "trial"),
        ("stayed", "trial"),
        ("stayed", "exploit"),
        ("moved:pays", None),
        (None, "trial"),
    ]
    text = observed([{"session": session, "role": role} for session, role in turns])
    key = {"class_key": "code/echo/greedy"}
    assert value(text, "tuner_session_turns_total", outcome="stayed", **key) == 2
    assert value(text, "tuner_session_trials_total", **key) == 1  # a kept turn's trial
    assert value(text, "tuner_session_turns_total", outcome="moved:pays", **key) == 1
    assert value(text, "tuner_session_turns_total", outcome="new", **key) == 1


async def test_the_load_a_request_met_and_its_wait_at_the_gate_are_seen(
    proxy: httpx.AsyncClient, store: RecordStore, fake: FakeLlamaServer
) -> None:
    """Three streams held open at once: each record says how many generation requests
    were in flight as it arrived (itself included), and /metrics counts the levels."""
    fake.hold_stream = asyncio.Event()
    body = {"prompt": "Hello", "max_tokens": 4, "stream": True}

    async def one() -> None:
        async with proxy.stream("POST", "/v1/completions", json=body) as response:
            await response.aread()

    tasks = [asyncio.create_task(one()) for _ in range(3)]
    while len(fake.requests) < 3:
        await asyncio.sleep(0.01)
    fake.hold_stream.set()
    await asyncio.gather(*tasks)
    await store.flush()
    records = list(read_records(store.directory))
    assert sorted(r.active for r in records if r.active is not None) == [1, 2, 3]
    text = (await proxy.get("/metrics")).text
    assert value(text, "tuner_active_requests_count") == 3
    assert value(text, "tuner_active_requests_bucket", le="2.0") == 2


def test_time_waited_at_the_gate_joins_and_variant_batches_are_counted() -> None:
    roles = ("exploit", "joined", "joined")
    text = observed(
        [
            {"wait_ms": w, "role": r, "batch": b}
            for w, r, b in zip((250.0, 0.5, None), roles, (1, 2, None), strict=True)
        ]
    )
    code = {"class_key": "code/echo/greedy"}
    assert value(text, "tuner_gate_wait_seconds_count", **code) == 2
    assert value(text, "tuner_variant_batch_requests_count") == 2
    assert value(text, "tuner_variant_batch_requests_sum") == 3
    assert value(text, "tuner_gate_wait_seconds_sum", **code) == pytest.approx(0.2505)
    assert value(text, "tuner_gate_joins_total", **code) == 2
