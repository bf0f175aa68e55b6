"""The aiohttp path of UpstreamClient against real sockets: refused, silent, cut mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from tuner.errors import UpstreamNotReady, UpstreamTimeout
from tuner.upstream.client import UpstreamClient, UpstreamDisconnected
from tuner.upstream.process import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def serve(handler: Handler) -> tuple[asyncio.Server, str]:
    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(closing, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def read_request(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ),
        0,
    )
    await reader.readexactly(length)


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[..., UpstreamClient]]:
    made: list[UpstreamClient] = []

    def make(url: str, **kwargs: float) -> UpstreamClient:
        client = UpstreamClient(url, **kwargs)  # type: ignore[arg-type]
        client.health.answering(True)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.aclose()


async def test_refused_connection_is_not_ready(client_for: Callable[..., UpstreamClient]) -> None:
    client = client_for(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamNotReady):
        await client.open("POST", "/completion", content=b"{}")


async def test_silent_server_times_out(client_for: Callable[..., UpstreamClient]) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # answer nothing until the client gives up

    server, url = await serve(silent)
    async with server:
        client = client_for(url, read_timeout_s=0.3)
        with pytest.raises(UpstreamTimeout):
            await client.open("POST", "/completion", content=b"{}")
        await client.aclose()
        await asyncio.sleep(0.05)


async def test_stream_cut_midway_raises_disconnected(
    client_for: Callable[..., UpstreamClient],
) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        chunk = b'data: {"content": "a"}\n\n'
        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        await writer.drain()  # then close without a terminating chunk: the stream breaks

    server, url = await serve(cut)
    async with server:
        client = client_for(url)
        response = await client.open("POST", "/completion", content=b"{}")
        assert response.status_code == 200 and response.content_type == "text/event-stream"
        received = []
        with pytest.raises(UpstreamDisconnected):
            async for piece in response.aiter_raw():
                received.append(piece)
        assert b"".join(received) == b'data: {"content": "a"}\n\n'
        await response.aclose()
        await client.aclose()


async def test_keep_alive_connections_are_reused(
    client_for: Callable[..., UpstreamClient],
) -> None:
    connections = 0

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            await read_request(reader)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
            )
            await writer.drain()

    server, url = await serve(answer)
    async with server:
        client = client_for(url)
        for _ in range(5):
            response = await client.open("POST", "/completion", content=b"{}")
            assert await response.aread() == b"{}"
            await response.aclose()
        await client.aclose()
        await asyncio.sleep(0.05)
    assert connections == 1


async def test_a_pooled_connection_the_server_dropped_is_retried_once(
    client_for: Callable[..., UpstreamClient],
) -> None:
    """cpp-httplib closes keep-alive connections on its own schedule; the next request on one
    must not become a 503 for the user."""
    served = 0

    async def one_per_connection(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal served
        await read_request(reader)
        served += 1
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        )
        await writer.drain()
        await read_request(reader)  # the next request on this pooled connection: dropped

    server, url = await serve(one_per_connection)
    async with server:
        client = client_for(url)
        for _ in range(4):
            response = await client.open("POST", "/completion", content=b"{}")
            assert response.status_code == 200 and await response.aread() == b"{}"
            await response.aclose()
        await client.aclose()
    assert served == 4
    assert client.health.reconnects >= 1


async def test_a_server_that_keeps_dropping_is_not_ready(
    client_for: Callable[..., UpstreamClient],
) -> None:
    attempts = 0

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        await read_request(reader)  # and close without an answer

    server, url = await serve(drop)
    async with server:
        client = client_for(url)
        with pytest.raises(UpstreamNotReady):
            await client.open("POST", "/completion", content=b"{}")
        await client.aclose()
    assert attempts == 2  # the request and one retry, no more


async def test_the_kept_preset_is_killed_and_loaded_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a stall of the no-speculation instance, the client kills it (a stopped process
    never takes the router's stop request), unloads it and reads it back until it answers;
    it is recovering throughout and not after. Another preset is only unloaded."""
    import tuner.upstream.client as client_module

    monkeypatch.setattr(client_module, "RELOAD_AFTER_S", (0.0, 0.0, 0.0))
    calls: list[str] = []
    killed: list[str] = []
    seen_recovering: list[bool] = []
    loading = [2]  # the router answers 503 twice while the instance loads

    def handler(request: httpx.Request) -> httpx.Response:
        model = request.url.params.get("model") or request.read().decode()
        calls.append(f"{request.method} {request.url.path} {model}")
        if request.url.path == "/props":
            seen_recovering.append(client.health.is_recovering("none"))
            loading[0] -= 1
            return httpx.Response(503 if loading[0] >= 0 else 200, json={})
        return httpx.Response(200, json={"success": True})

    def force_stop(preset: str) -> bool:
        killed.append(preset)
        return True

    client = UpstreamClient(
        "http://router",
        transport=httpx.MockTransport(handler),
        kept="none",
        force_stop=force_stop,
    )
    try:
        await asyncio.gather(client.unload("none"), client.unload("none"))  # joined: once
        assert killed == ["none"]
        assert [c for c in calls if "unload" in c] == ['POST /models/unload {"model":"none"}']
        assert [c for c in calls if "props" in c] == ["GET /props none"] * 3
        assert seen_recovering == [True] * 3 and not client.health.is_recovering("none")
        calls.clear()
        await client.unload("ngram-mod")
        assert killed == ["none", "ngram-mod"] and not any("props" in c for c in calls)
        assert client.health.is_recovering("ngram-mod")  # loaded by its next request
    finally:
        await client.aclose()


async def test_settled_waits_for_an_unload_in_flight() -> None:
    release = asyncio.Event()

    class Slow(httpx.AsyncBaseTransport):  # the router takes its time to unload
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.url.path == "/models/unload":
                await release.wait()
            return httpx.Response(200, json={})

    client = UpstreamClient("http://router", transport=Slow(), kept="none")
    try:
        await client.settled("none")  # nothing in flight: returns at once
        unload = asyncio.create_task(client.unload("none"))
        await asyncio.sleep(0.01)
        waiter = asyncio.create_task(client.settled("none"))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        release.set()
        await asyncio.wait_for(waiter, 5.0)
        await unload
        assert not client.health.is_recovering("none")
    finally:
        await client.aclose()
