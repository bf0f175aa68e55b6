"""A router for engines that have none: one llama-server per instance key, run by the daemon.

ik_llama.cpp serves one model with one spec type per process and takes the draft settings
(``speculative.n_max`` ...) with each request. ``Pool`` plays llama-server's router to the
rest of the daemon, as an httpx transport under ``UpstreamClient``: a request's ``model``
names a member (a variant), the member names its instance (the flags its process starts
with) and the fields sent with each of its requests. Everything above ``upstream`` routes,
stalls, unloads and falls back exactly as in router mode.

Instances start on first use, each on its own loopback port; at most ``capacity`` run, the
least recently used idle one is stopped to make room (never one still starting, nor the warm
one while another fits beside it). One that dies is started again by the next request for
it; one that cannot start answers that request with a 500 (the proxy then sends it again
without speculation and the quarantine counts the failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tuner.logs import get_logger
from tuner.upstream.launch import HTTP_THREADS
from tuner.upstream.process import die_with_parent, free_port, signal_group

__all__ = ["POOL_URL", "AnyInstance", "Member", "Pool"]

log = get_logger(__name__)

Argv = Callable[[Sequence[str], int], list[str]]  # an instance's flags, its port -> command

# the address a client with the pool as its transport uses: it names no server
POOL_URL = "http://pool.invalid"
HEALTH_POLL_S = 0.1
# the connection broke before any byte of an answer came back
_UNANSWERED = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)
STOP_GRACE_S = 5.0
# how long a live instance may take to answer /health before it is taken for dead (and
# killed): a loaded one takes over a second (docs/decisions.md); a dead one refuses at once
ANSWERS_S = 5.0
# The pool lets two fewer requests into an instance at once than it has HTTP threads (the
# rest wait here), so a probe of a busy instance always finds a thread: one that does not
# answer is stuck, not busy. (With ik_llama.cpp's default of slots + 2 threads, four clients
# at once on its one slot ran 0.6x of one after another, with 16 1.0x:
# benchmarks/concurrent_clients.py.)
ADMITTED = HTTP_THREADS - 2


@dataclass(frozen=True, slots=True)
class Member:
    """One model id the pool serves: the instance it runs on and what each request adds."""

    name: str
    flags: tuple[str, ...]  # its instance's own flags: members with the same share one
    fields: Mapping[str, object] = field(default_factory=dict)


class _Instance:
    """One llama-server process of the pool."""

    def __init__(self, key: tuple[str, ...], index: int) -> None:
        self.key = key
        self.index = index  # names its log file
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.served = False  # it was ready once
        self.starting: asyncio.Task[None] | None = None
        self.making_room = False  # others are being stopped so that it can start
        self.failure: str | None = None
        self.inflight = 0
        self.admitted = asyncio.Semaphore(ADMITTED)  # generation requests
        self.last_used = 0.0

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def launching(self) -> bool:
        return self.making_room or (self.starting is not None and not self.starting.done())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Pool(httpx.AsyncBaseTransport):
    """llama-server's router, for an engine without one (see the module's docstring)."""

    def __init__(
        self,
        members: Sequence[Member],
        argv: Argv,
        *,
        capacity: int,
        log_dir: Path,
        startup_timeout_s: float = 600.0,
        warm: str | None = None,
    ) -> None:
        if not members:
            raise ValueError("a pool needs at least one member")
        self.members = {m.name: m for m in members}
        self.argv = argv
        self.capacity = max(1, capacity)
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.warm = warm if warm in self.members else members[0].name
        self._instances: dict[tuple[str, ...], _Instance] = {}
        for member in members:
            if member.flags not in self._instances:
                self._instances[member.flags] = _Instance(member.flags, len(self._instances))
        self._lock = asyncio.Lock()
        self._forward = httpx.AsyncHTTPTransport(
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=8)
        )
        self._stopping = False
        self._watchers: set[asyncio.Task[None]] = set()
        self.starts = 0  # processes started, restarts included

    # -- the service ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the warm member's instance (no speculation: the first requests' and the
        fallback's); returns at once."""
        await self._ensure(self._instance_of(self.warm), wait=False)

    async def wait_ready(self, timeout_s: float | None = None) -> None:
        instance = self._instance_of(self.warm)
        await asyncio.wait_for(self._ensure(instance), timeout_s)

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self._stopping = True
        await asyncio.gather(*(self._stop(i, grace_s) for i in self._instances.values()))
        await self._forward.aclose()

    def describe(self) -> dict[str, object]:
        return {
            "instances": len(self._instances),
            "running": [i.index for i in self._instances.values() if i.running],
            "capacity": self.capacity,
            "starts": self.starts,
        }

    def running_url(self) -> str | None:
        """A running instance's address (the tokenizer: every instance has the model's)."""
        ready = [i for i in self._instances.values() if i.running and i.ready.is_set()]
        return max(ready, key=lambda i: i.last_used).url if ready else None

    # -- the transport -------------------------------------------------------------------

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            # the readiness poll starts the warm instance again where it died: requests are
            # refused while the pool is not ready, so none of them would. Where one instance
            # fits, the one serving a variant in its place is as ready (one-at-a-time mode);
            # a warm one restarting after it served (a stall) is too: requests wait for it
            warm = self._instance_of(self.warm)
            ready = warm.ready.is_set() or self._one_fits_and_runs()
            if not ready:
                with contextlib.suppress(RuntimeError):  # stopping
                    await self._ensure(warm, wait=False)
                ready = warm.served and warm.launching
            body = {"status": "ok"} if ready else {"error": {"code": 503, "message": "loading"}}
            return _json(200 if ready else 503, body)
        if path in ("/v1/models", "/models"):
            data = [
                {"id": name, "object": "model", "owned_by": "spec-tuner"} for name in self.members
            ]
            return _json(200, {"object": "list", "data": data})
        if path == "/props" and "model" not in request.url.params:
            return _json(200, {"role": "router"})
        if path == "/models/unload":
            return await self._unload(request)
        return await self._relay(request)

    async def _relay(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        body = _json_body(content)
        name = request.url.params.get("model") or (body or {}).get("model")
        member = self.members.get(name if isinstance(name, str) else self.warm)
        if member is None:
            return _error(400, f"model {name!r} is not served here", "invalid_request_error")
        instance = self._instances[member.flags]
        if request.url.params.get("autoload") == "false" and not instance.ready.is_set():
            return _error(503, "Loading model", "unavailable_error")  # a probe: it is alive
        if (failed := await self._load(member, instance)) is not None:
            return failed
        if body is not None and member.fields:
            content = json.dumps({**body, **member.fields}, ensure_ascii=False).encode()
        params = request.url.params.remove("model").remove("autoload")
        url = httpx.URL(instance.url + request.url.path, params=params)
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
        outgoing = httpx.Request(
            request.method, url, headers=headers, content=content, extensions=request.extensions
        )
        try:
            response = await self._send(instance, outgoing)
        except httpx.ConnectError:
            # it died after its last answer: once more, on an instance started anew
            await self._stop(instance, 0.0)
            if (failed := await self._load(member, instance)) is not None:
                return failed
            outgoing.url = outgoing.url.copy_with(port=instance.port)
            response = await self._send(instance, outgoing)
        except _UNANSWERED as exc:
            if await self._answers(instance):  # it dropped a pooled connection: once more
                response = await self._send(instance, outgoing)
            else:  # it died on this request: a failure of the variant, as a router says
                await self._stop(instance, 0.0)
                message = f"{member.name}'s instance stopped before answering: {exc!r}"
                return _error(502, message, "server_error")
        return response

    async def _load(self, member: Member, instance: _Instance) -> httpx.Response | None:
        """The instance running (started where it is not); the error answer where it could
        not be."""
        try:
            await self._ensure(instance)
        except (RuntimeError, TimeoutError) as exc:
            return _error(500, f"{member.name} failed to load: {exc}", "server_error")
        return None

    async def _answers(self, instance: _Instance) -> bool:
        if not instance.running:
            return False
        async with httpx.AsyncClient(base_url=instance.url, timeout=ANSWERS_S) as client:
            try:
                return (await client.get("/health")).status_code == 200
            except httpx.HTTPError:
                return False

    async def _send(self, instance: _Instance, request: httpx.Request) -> httpx.Response:
        """The instance's answer, its body still to read and counted in flight until then
        (``_Tracked``); a generation request (a POST) first waits for one of the instance's
        admissions, which its answer gives back when closed, and a probe or another read
        waits for none."""
        admission = instance.admitted if request.method == "POST" else None
        if admission is not None:
            await admission.acquire()
        instance.inflight += 1
        instance.last_used = time.monotonic()
        try:
            response = await self._forward.handle_async_request(request)
        except BaseException:
            instance.inflight -= 1
            if admission is not None:
                admission.release()
            raise
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_Tracked(response, instance, admission),
            extensions=response.extensions,
        )

    async def _unload(self, request: httpx.Request) -> httpx.Response:
        body = _json_body(await request.aread()) or {}
        member = self.members.get(str(body.get("model")))
        if member is None:
            return _error(400, "no such model", "invalid_request_error")
        await self._stop(self._instances[member.flags], 0.0)  # a stall: no grace for it
        return _json(200, {"success": True})

    # -- instances -----------------------------------------------------------------------

    def _one_fits_and_runs(self) -> bool:
        """Only one instance fits and one runs or is starting (the warm one again, or
        another in its place): requests wait for it; the switch is no outage."""
        return self.capacity == 1 and any(
            i.ready.is_set() or i.launching for i in self._instances.values()
        )

    def _instance_of(self, name: str) -> _Instance:
        return self._instances[self.members[name].flags]

    async def _ensure(self, instance: _Instance, *, wait: bool = True) -> None:
        """The instance running and healthy: started (making room) where it is not."""
        async with self._lock:
            if self._stopping:
                raise RuntimeError("the daemon is stopping")
            if instance.running and not instance.ready.is_set() and not instance.launching:
                # being stopped (a stall, a death on a request) or dead and not yet reaped:
                # started again once it is gone, so that a request waits instead of failing
                assert instance.process is not None
                await instance.process.wait()
            if not instance.running and not instance.launching:
                instance.making_room = True
                try:
                    await self._make_room(instance)
                finally:
                    instance.making_room = False
                instance.ready.clear()
                instance.failure = None
                instance.starting = asyncio.create_task(self._launch(instance))
            starting = instance.starting
        if not wait:
            return
        if starting is not None and not starting.done():
            await asyncio.wait_for(asyncio.shield(starting), self.startup_timeout_s + 5)
        if instance.failure is not None or not instance.ready.is_set():
            raise RuntimeError(instance.failure or "it stopped")

    async def _make_room(self, instance: _Instance) -> None:
        """Stop the least recently used idle instances until one more fits. Never one still
        starting (a request waits on it), nor the warm one where another fits beside it:
        the pool is ready only while it runs, so stopping it refused every request until
        the readiness poll started it again, which stopped another to make room."""
        kept = self._instance_of(self.warm) if self.capacity > 1 else None
        others = [i for i in self._instances.values() if i.running and i is not instance]
        others.sort(key=lambda i: i.last_used)
        while len(others) >= self.capacity:
            idle = next(
                (i for i in others if i.inflight == 0 and not i.launching and i is not kept),
                None,
            )
            if idle is None:
                break  # every one is answering or starting: one more for now, none cut
            others.remove(idle)
            log.info("pool_unload", instance=idle.index, reason="capacity")
            await self._stop(idle, STOP_GRACE_S)

    async def _launch(self, instance: _Instance) -> None:
        instance.port = free_port()
        argv = self.argv(instance.key, instance.port)
        log_path = self.log_dir / f"instance-{instance.index}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as sink:
            try:
                instance.process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=sink,
                    stderr=sink,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as exc:
                instance.failure = f"could not start {argv[0]}: {exc}"
                return
        self.starts += 1
        log.info("pool_started", instance=instance.index, pid=instance.process.pid)
        if await self._healthy(instance):
            instance.last_used = time.monotonic()
            instance.ready.set()
            instance.served = True
            self._watch(instance, instance.process)
            return
        code = instance.process.returncode
        instance.failure = (
            f"its llama-server exited with code {code}"
            if code is not None
            else f"its llama-server was not ready after {self.startup_timeout_s} s"
        ) + f"; log {log_path}"
        log.error("pool_start_failed", instance=instance.index, error=instance.failure)
        await self._stop(instance, 0.0)

    def _watch(self, instance: _Instance, process: asyncio.subprocess.Process) -> None:
        """Note an instance's death as it happens: the next request starts it again."""

        async def watch() -> None:
            code = await process.wait()
            if instance.process is process:
                instance.ready.clear()
            if not self._stopping:
                log.warning("pool_instance_exited", instance=instance.index, code=code)

        task = asyncio.create_task(watch(), name=f"pool-instance-{instance.index}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _healthy(self, instance: _Instance) -> bool:
        assert instance.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        async with httpx.AsyncClient(base_url=instance.url, timeout=5.0) as client:
            while time.monotonic() < deadline and instance.running and not self._stopping:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get("/health")).status_code == 200:
                        return True
                await asyncio.sleep(HEALTH_POLL_S)
        return False

    async def _stop(self, instance: _Instance, grace_s: float) -> None:
        instance.ready.clear()
        process = instance.process
        if process is None or process.returncode is not None:
            return
        signal_group(process.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        try:
            await asyncio.wait_for(process.wait(), grace_s or 5.0)
        except TimeoutError:
            signal_group(process.pid, signal.SIGKILL)
            await process.wait()
        log.info("pool_stopped", instance=instance.index, code=process.returncode)


class AnyInstance(httpx.BaseTransport):
    """A blocking transport to whichever instance ran last: for calls any instance of the
    model answers alike (``/tokenize``, from the replay thread)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._forward = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = self.pool.running_url()
        if url is None:
            raise httpx.ConnectError("no instance of the pool is running", request=request)
        target = httpx.URL(url).join(request.url.raw_path.decode())
        outgoing = httpx.Request(
            request.method,
            target,
            headers=request.headers,
            content=request.read(),
            extensions=request.extensions,
        )
        return self._forward.handle_request(outgoing)

    def close(self) -> None:
        self._forward.close()


class _Tracked(httpx.AsyncByteStream):
    """An instance's answer, counted as in flight until it is read to its end or closed."""

    def __init__(
        self,
        response: httpx.Response,
        instance: _Instance,
        admission: asyncio.Semaphore | None,
    ) -> None:
        self.response = response
        self.instance = instance
        self._admission = admission  # the one it holds, given back when it closes
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        stream = self.response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        async for chunk in stream:
            yield chunk

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self.instance.inflight -= 1
            self.instance.last_used = time.monotonic()
            if self._admission is not None:
                self._admission.release()
        await self.response.aclose()


def _json_body(content: bytes) -> dict[str, object] | None:
    try:
        body = json.loads(content) if content else None
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _json(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


def _error(status: int, message: str, kind: str) -> httpx.Response:
    """llama-server's error shape (the proxy turns it into OpenAI's)."""
    return _json(status, {"error": {"code": status, "message": message, "type": kind}})
