"""The pool against real child processes (``pool_child.py``): instances per launch flags,
fields per member, room made by the least recently used, failures answered, not hung."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest

from tests.upstream.test_process import alive
from tuner.upstream import pool as pool_module
from tuner.upstream.client import UpstreamClient
from tuner.upstream.pool import AnyInstance, Member, Pool

CHILD = str(Path(__file__).with_name("pool_child.py"))

MEMBERS = (
    Member("none", ("--spec-type", "none")),
    Member("mod.max16", ("--spec-type", "ngram-mod"), {"speculative.n_max": 16}),
    Member("mod.max64", ("--spec-type", "ngram-mod"), {"speculative.n_max": 64}),
    Member("broken", ("--fail",), {"speculative.n_max": 8}),
)


def argv(flags: Sequence[str], port: int) -> list[str]:
    return [sys.executable, CHILD, *flags, "--port", str(port)]


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[Pool]:
    made = Pool(MEMBERS, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await made.start()
    await made.wait_ready(20)
    yield made
    await made.stop()


def client_of(pool: Pool) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=pool, base_url="http://pool.invalid", timeout=20)


async def ask(pool: Pool, model: str, **body: object) -> httpx.Response:
    async with client_of(pool) as client:
        return await client.post("/v1/completions", json={"model": model, **body})


async def test_members_with_the_same_flags_share_an_instance_and_add_their_fields(
    pool: Pool,
) -> None:
    small = (await ask(pool, "mod.max16", prompt="x")).json()
    large = (await ask(pool, "mod.max64", prompt="x", temperature=0)).json()
    assert small["pid"] == large["pid"]  # one process for both
    assert small["argv"][:2] == ["--spec-type", "ngram-mod"]
    assert small["body"]["speculative.n_max"] == 16 and small["body"]["prompt"] == "x"
    assert large["body"]["speculative.n_max"] == 64 and large["body"]["temperature"] == 0
    plain = (await ask(pool, "none", prompt="x")).json()
    assert plain["pid"] != small["pid"] and "speculative.n_max" not in plain["body"]


async def test_it_answers_as_a_router_does(pool: Pool) -> None:
    async with client_of(pool) as client:
        assert (await client.get("/health")).status_code == 200
        models = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == [m.name for m in MEMBERS]
        assert (await client.get("/props")).json() == {"role": "router"}
        forwarded = (await client.get("/props", params={"model": "mod.max16"})).json()
        assert forwarded["path"] == "/props"  # the instance's own, without the model
    upstream = UpstreamClient("http://pool.invalid", transport=pool)
    await upstream.refresh_models()
    assert upstream.resolve_model("mod.max64") == "mod.max64"
    assert upstream.resolve_model("gpt-4") == "none"  # an id not served: the first
    await upstream.aclose()


async def test_an_instance_that_cannot_start_answers_500_and_the_others_go_on(
    pool: Pool,
) -> None:
    failed = await ask(pool, "broken", prompt="x")
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "server_error"
    assert "broken failed to load" in failed.json()["error"]["message"]
    assert (await ask(pool, "mod.max16", prompt="x")).status_code == 200
    assert (await ask(pool, "nobody", prompt="x")).status_code == 400


async def test_room_is_made_by_stopping_the_least_recently_used(tmp_path: Path) -> None:
    """Capacity 2: a third instance stops the idle one used longest ago."""
    members = [Member(name, (f"--{name}",)) for name in ("none", "b", "c")]
    pool = Pool(members, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    try:
        b = (await ask(pool, "b")).json()["pid"]
        plain = (await ask(pool, "none")).json()["pid"]  # none is now the newest
        await ask(pool, "c")
        assert not alive(b) and alive(plain)
        assert pool.describe()["starts"] == 3
    finally:
        await pool.stop()
    assert not alive(plain)


async def test_room_is_never_made_by_stopping_the_warm_instance(tmp_path: Path) -> None:
    """The warm instance (no speculation: the fallback's, and what readiness waits on) is
    kept when another fits beside it, even when it was used longest ago: stopping it made
    the daemon refuse requests until the readiness poll started it again (a bench run's
    503)."""
    members = [Member(name, (f"--{name}",)) for name in ("none", "b", "c")]
    pool = Pool(members, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    try:
        plain = (await ask(pool, "none")).json()["pid"]
        b = (await ask(pool, "b")).json()["pid"]
        await ask(pool, "c")
        assert alive(plain) and not alive(b)
        async with client_of(pool) as client:
            assert (await client.get("/health")).status_code == 200
    finally:
        await pool.stop()


async def test_an_instance_still_starting_is_not_stopped_to_make_room(tmp_path: Path) -> None:
    """The warm instance died while another was loading for a request: the readiness poll
    starting it again stops the idle one, never the one loading (which had been used
    longest ago, never yet), so that request is answered."""
    members = [Member("none", ("--none",)), Member("b", ("--b",)), Member("c", ("--slow",))]
    pool = Pool(members, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    try:
        plain = (await ask(pool, "none")).json()["pid"]
        b = (await ask(pool, "b")).json()["pid"]
        os.kill(plain, signal.SIGKILL)
        while pool._instance_of("none").running:
            await asyncio.sleep(0.01)
        loading = asyncio.create_task(ask(pool, "c"))
        c = pool._instance_of("c")
        while c.starting is None or c.starting.done():
            await asyncio.sleep(0.01)
        async with client_of(pool) as client:
            await client.get("/health")  # starts the warm one again: room is made
        answer = await loading
        assert answer.status_code == 200, answer.text
        assert not alive(b) and alive(answer.json()["pid"])
    finally:
        await pool.stop()


async def test_where_one_instance_fits_a_variant_serves_in_place_of_the_warm_one(
    tmp_path: Path,
) -> None:
    """Capacity 1 (one-at-a-time mode): a variant's instance replaces the warm one and the
    pool stays ready on it; the readiness poll does not start the warm one again (which
    stopped the variant's, and the daemon refused requests meanwhile, on ik_llama.cpp)."""
    members = [Member("none", ("--none",)), Member("b", ("--b",))]
    pool = Pool(members, argv, capacity=1, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    await pool.wait_ready(20)
    try:
        plain = (await ask(pool, "none")).json()["pid"]
        b = (await ask(pool, "b")).json()["pid"]
        assert not alive(plain)
        async with client_of(pool) as client:
            for _ in range(3):
                assert (await client.get("/health")).status_code == 200
        assert alive(b) and not pool._instance_of("none").running
        assert (await ask(pool, "none")).status_code == 200 and not alive(b)
    finally:
        await pool.stop()


async def test_where_one_instance_fits_a_switch_is_never_an_outage(tmp_path: Path) -> None:
    """Capacity 1: while the running instance stops (a second, as a model server finishes)
    and the next one starts, the pool stays ready both ways, so the daemon refuses no request
    (on ik_llama.cpp it answered 503 during a switch)."""
    members = [Member("none", ("--none", "--slow-stop")), Member("b", ("--b", "--slow-stop"))]
    pool = Pool(members, argv, capacity=1, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    await pool.wait_ready(20)
    try:
        async with client_of(pool) as client:
            for target in ("b", "none"):
                switching = asyncio.create_task(ask(pool, target))
                health = []
                while not switching.done():
                    health.append((await client.get("/health")).status_code)
                    await asyncio.sleep(0.05)
                assert switching.result().status_code == 200
                assert len(health) > 5 and set(health) == {200}, (target, health)
    finally:
        await pool.stop()


async def test_a_killed_instance_is_started_again_by_the_next_request(pool: Pool) -> None:
    first = (await ask(pool, "mod.max16", prompt="x")).json()["pid"]
    os.kill(first, signal.SIGKILL)
    for _ in range(100):  # its end is seen as it happens
        if not pool._instance_of("mod.max16").ready.is_set():
            break
        await asyncio.sleep(0.02)
    again = await ask(pool, "mod.max16", prompt="x")
    assert again.status_code == 200 and again.json()["pid"] != first


async def test_an_instance_that_dies_on_a_request_answers_it_with_a_502(pool: Pool) -> None:
    """As a router does: the proxy sends such a request again without speculation and the
    quarantine counts the failure; the next request starts the instance anew."""
    first = (await ask(pool, "mod.max16", prompt="x")).json()["pid"]
    died = await ask(pool, "mod.max16", prompt="x", die=True)
    assert died.status_code == 502 and "stopped before answering" in died.text
    assert not alive(first)
    assert (await ask(pool, "mod.max16", prompt="x")).status_code == 200


async def test_a_live_instance_slow_to_answer_its_health_is_sent_the_request_again(
    tmp_path: Path,
) -> None:
    """A connection closed before any byte of the answer, by an instance that is alive but
    slow (a second and a half for ``/health``, as on a loaded machine): the request is sent
    again and answered, and the instance is not killed for dead."""
    members = [Member("none", ("--none",)), Member("drops", ("--drop-first",))]
    pool = Pool(members, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await pool.start()
    try:
        answer = await ask(pool, "drops", prompt="x")
        assert answer.status_code == 200, answer.text
        assert alive(answer.json()["pid"])
    finally:
        await pool.stop()


async def test_an_instance_killed_mid_stream_cuts_the_stream_with_an_error(pool: Pool) -> None:
    async with client_of(pool) as client:
        request = {"model": "mod.max16", "stream": True}
        async with client.stream("POST", "/v1/completions", json=request) as response:
            lines = response.aiter_lines()
            first = json.loads((await anext(lines)).removeprefix("data: "))
            os.kill(first["pid"], signal.SIGKILL)
            with pytest.raises(httpx.TransportError):
                async for _ in lines:
                    pass
    # a request in the instant before the pool reaps the process gets a 502 (the daemon
    # answers it without speculation); once reaped, the next one starts it again
    for _ in range(100):
        if len(pool.describe()["running"]) < 2:  # type: ignore[arg-type]
            break
        await asyncio.sleep(0.02)
    assert (await ask(pool, "mod.max16", prompt="x")).status_code == 200


async def test_unload_stops_the_instance_at_once(pool: Pool) -> None:
    pid = (await ask(pool, "mod.max64", prompt="x")).json()["pid"]
    async with client_of(pool) as client:
        done = await client.post("/models/unload", json={"model": "mod.max16"})
    assert done.status_code == 200 and not alive(pid)


async def test_blocking_calls_go_to_a_running_instance(pool: Pool) -> None:
    with httpx.Client(transport=AnyInstance(pool), base_url="http://pool.invalid") as client:
        answer = client.post("/tokenize", json={"content": "x", "model": "mod.max16"}).json()
    assert answer["path"] == "/tokenize" and answer["body"]["content"] == "x"


async def test_the_warm_instance_is_started_again_by_the_readiness_poll(pool: Pool) -> None:
    """The daemon refuses requests while the pool is not ready, so no request would start
    the warm instance again: the ``/health`` poll does. Once it has served, the pool stays
    ready while it restarts (a stalled instance killed): requests wait for it."""
    async with client_of(pool) as client:
        pid = (await client.post("/v1/completions", json={"model": "none"})).json()["pid"]
        os.kill(pid, signal.SIGKILL)
        warm = pool._instance_of("none")
        for _ in range(100):  # its end is seen as it happens
            if not warm.ready.is_set():
                break
            await asyncio.sleep(0.02)
        statuses = []
        for _ in range(200):  # only the poll: no request is sent
            statuses.append((await client.get("/health")).status_code)
            process = warm.process
            if warm.ready.is_set() and process is not None and process.pid != pid:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the warm instance was not started again")
        assert set(statuses) == {200}, statuses


async def test_while_an_instance_is_being_stopped_a_request_waits_for_it_to_start_again(
    pool: Pool,
) -> None:
    """Between the kill of an instance (a stall's unload, a death on a request) and its
    reaping, the pool stays ready and a request for it is answered by it started anew,
    not refused: a single readiness poll in that instant answered 503, and the daemon
    then refused every request with "the model server is not ready" until the next one."""
    async with client_of(pool) as client:
        for model in ("none", "mod.max16"):
            pid = (await ask(pool, model, prompt="x")).json()["pid"]
            unload = asyncio.ensure_future(client.post("/models/unload", json={"model": model}))
            await asyncio.sleep(0)  # the kill is sent; the process is not reaped yet
            health = await client.get("/health")
            again = await ask(pool, model, prompt="x")
            assert (await unload).status_code == 200
            assert health.status_code == 200, (model, health.text)
            assert again.status_code == 200, (model, again.text)
            assert again.json()["pid"] != pid and not alive(pid)


async def test_a_probe_never_starts_an_instance_and_one_loading_is_alive(pool: Pool) -> None:
    """The stall probe (``autoload=false``) of an instance not running is answered at once,
    as a router answers for one loading: alive, and not started by the probe."""
    upstream = UpstreamClient("http://pool.invalid", transport=pool)
    assert await upstream.responds("mod.max16", 2.0)
    assert not pool._instance_of("mod.max16").running
    await upstream.aclose()


async def test_requests_past_the_admissions_wait_and_a_probe_is_still_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One admission: a second request waits in the pool until the first's answer is
    read, while a probe of that busy instance is answered at once (an instance's HTTP
    threads are never all taken by requests)."""
    monkeypatch.setattr(pool_module, "ADMITTED", 1)
    made = Pool(MEMBERS, argv, capacity=2, log_dir=tmp_path, startup_timeout_s=20)
    await made.start()
    try:
        async with client_of(made) as client:
            request = {"model": "mod.max16", "stream": True}
            async with client.stream("POST", "/v1/completions", json=request) as first:
                assert first.status_code == 200
                second = asyncio.ensure_future(ask(made, "mod.max16", prompt="x"))
                probe = await client.get("/props", params={"model": "mod.max16"})
                assert probe.status_code == 200
                await asyncio.sleep(0.5)
                assert not second.done()  # held in the pool while the first streams
            assert (await asyncio.wait_for(second, 10)).status_code == 200
    finally:
        await made.stop()
