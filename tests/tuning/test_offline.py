"""Idle-time tuning: the sample of prompts, replay bodies, and trials advanced while idle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_llama import FakeLlamaServer
from tests.tuning.sim import CODE, HELP, PROSE, SimUpstream, config, make, truth
from tuner.classify import classify, load_definitions
from tuner.proxy.app import create_app
from tuner.records import RecordStore
from tuner.tuning.config import Offline
from tuner.tuning.engine import Decision, Engine
from tuner.tuning.offline import OfflineTuner, Samples, replay_body
from tuner.tuning.service import TuningService
from tuner.upstream.capabilities import Capabilities, parse_capabilities
from tuner.upstream.client import UpstreamClient


@pytest.fixture(scope="module")
def caps() -> Capabilities:
    return parse_capabilities(HELP.read_text())


def offline_engine(tmp_path: Path, caps: Capabilities, **offline: Any) -> Engine:
    cfg = config(explore_share=0.1, patience=0)  # searches run to max_trials: fixed counts
    cfg = cfg.model_copy(update={"offline": Offline(enabled=True, **offline)})
    return make(tmp_path, cfg, caps)


def test_samples_are_bounded_copies() -> None:
    samples = Samples(per_class=2, max_bytes=200)
    body = {"prompt": "a"}
    for n in range(3):
        assert samples.add(CODE, "/v1/completions", {"prompt": str(n)})
    assert samples.add(PROSE, "/v1/completions", body)
    body["prompt"] = "changed"
    assert [b["prompt"] for _, b in samples.of(CODE)] == ["1", "2"]  # the last two
    assert samples.of(PROSE)[0][1] == {"prompt": "a"}  # a copy, not the caller's dict
    assert not samples.add(CODE, "/v1/completions", {"prompt": "x" * 500})  # too large
    assert not samples.add(None, "/v1/completions", body)  # no class
    assert len(samples) == 3 and samples.classes() == [CODE, PROSE]


def test_replay_bodies_are_whole_and_capped() -> None:
    assert replay_body({"prompt": "x", "n_predict": 20}, 128) == {
        "prompt": "x", "stream": False, "max_tokens": 20}  # fmt: skip
    streamed = {"messages": [], "stream": True, "stream_options": {"include_usage": True},
                "max_completion_tokens": 4096}  # fmt: skip
    assert replay_body(streamed, 64) == {"messages": [], "stream": False, "max_tokens": 64}
    assert replay_body({"prompt": "x", "max_tokens": None}, 64)["max_tokens"] == 64


def sim_replay(engine: Engine, sim: SimUpstream, sent: list[Decision]) -> Any:
    async def replay(class_key: str, endpoint: str, body: dict[str, Any], d: Decision) -> bool:
        sent.append(d)
        engine.observe(sim.answer(class_key, d).model_copy(update={"replay": True}))
        return True

    return replay


def test_idle_replays_finish_trials_outside_the_live_budget(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = offline_engine(tmp_path, caps, idle_s=60.0, pairs=6)
    sim = SimUpstream(truth(list(engine.variants.values())))
    samples = Samples(8, 32_768)
    samples.add(CODE, "/v1/completions", {"prompt": "def f(): pass"})
    idle = [0.0]
    sent: list[Decision] = []
    tuner = OfflineTuner(engine, samples, sim_replay(engine, sim, sent), lambda: idle[0])

    assert asyncio.run(tuner.run_once()) == 0  # busy: nothing
    idle[0] = 120.0
    for _ in range(4):
        assert asyncio.run(tuner.run_once()) == 6
    state = engine.classes[CODE]
    assert state.trials_done >= 3, state  # trials of 6 requests finished on replays alone
    assert state.seen == 0 and state.explored == 0 and state.spent == 0  # live budget untouched
    roles = [d.role for d in sent]
    assert roles[0::2] == ["trial"] * 24 and roles[1::2] == ["control"] * 24  # pairs
    for _ in range(8):  # losing trials stop after 3 requests: the search reaches ngram-simple
        policy = engine.classes[CODE].policy
        if policy is not None and policy.speculation:
            break
        asyncio.run(tuner.run_once())
    assert policy is not None and policy.speculation, policy
    assert engine.classes[CODE].seen == 0  # still no live request

    engine.config = engine.config.model_copy(update={"offline": Offline(enabled=False)})
    assert asyncio.run(tuner.run_once()) == 0  # switched off (SIGHUP-able)


def test_a_live_request_stops_the_replay(tmp_path: Path, caps: Capabilities) -> None:
    engine = offline_engine(tmp_path, caps, idle_s=60.0, pairs=8)
    sim = SimUpstream(truth(list(engine.variants.values())))
    samples = Samples(8, 32_768)
    samples.add(CODE, "/v1/completions", {"prompt": "x"})
    sent: list[Decision] = []
    replay = sim_replay(engine, sim, sent)
    idle = [120.0]

    async def interrupted(class_key: str, endpoint: str, body: dict[str, Any], d: Decision) -> bool:
        ok: bool = await replay(class_key, endpoint, body, d)
        if len(sent) == 4:
            idle[0] = 0.0  # a live request arrived during the second pair
        return ok

    tuner = OfflineTuner(engine, samples, interrupted, lambda: idle[0])
    assert asyncio.run(tuner.run_once()) == 2 and len(sent) == 4


async def test_the_proxy_samples_and_replays_through_itself(
    tmp_path: Path, caps: Capabilities, fake: FakeLlamaServer
) -> None:
    """A live request is sampled; replayed, its pair reaches llama-server as the trial's
    preset and as ``none``, whole, recorded as replays and counted by the engine."""
    engine = offline_engine(tmp_path, caps, idle_s=0.01, pairs=1)
    service = TuningService(engine, tmp_path, {"model_key": "m"})
    records = RecordStore(tmp_path / "records", linger_s=0)
    records.observers.append(service.observe)
    await records.start()
    client = UpstreamClient("http://fake", transport=fake.transport(), default_model="fake-model")
    client.mark_ready(True)
    definitions = load_definitions(None)
    app = create_app(client, records, router=service.route,
                     classifier=lambda body: classify(body, definitions=definitions))  # fmt: skip
    handlers = app.state.handlers
    samples = Samples(4, 32_768)
    handlers.sampler = samples.add

    async def replay(class_key: str, endpoint: str, body: dict[str, Any], d: Decision) -> bool:
        return bool(await handlers.replay(class_key, endpoint, body, service.routed(d)))

    tuner = OfflineTuner(engine, samples, replay, handlers.idle_for)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as proxy:
        body = {"model": "x", "prompt": "Repeat: abc abc abc", "max_tokens": 400, "stream": True}
        response = await proxy.post("/v1/completions", json=body)
        assert response.status_code == 200
    (key,) = samples.classes()
    for _ in range(100):  # the live request had the class's first trial prepared
        await asyncio.sleep(0.05)
        if not engine.classes[key].preparing:
            break
    assert await tuner.run_once() == 1
    await records.flush()
    replays = [r for r in records.recent if r.replay]
    assert [r.role for r in replays] == ["trial", "control"]
    assert all(r.status == 200 and r.class_key == key for r in replays)
    sent = fake.requests[-2:]
    assert sent[0]["body"]["model"] == replays[0].variant != "none"
    assert sent[1]["body"]["model"] == "none"
    assert all(s["body"]["stream"] is False and s["body"]["max_tokens"] == 128 for s in sent)
    assert engine.classes[key].seen == 1  # only the live request
    await records.stop()
    await service.stop()
    await client.aclose()
