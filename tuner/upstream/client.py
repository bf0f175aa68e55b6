"""The async client the proxy talks to llama-server through.

``UpstreamClient`` is the one seam between the HTTP edge and the model server:
the proxy asks it whether the server is ready, which model id to send, and to
open a (streamed) response, an ``UpstreamResponse``. Real connections go
through aiohttp, whose C parser costs less per request than httpx's pure-Python
HTTP/1.1 (docs/decisions.md, "Two HTTP client libraries"); an injected
httpx transport (``httpx.MockTransport`` in the unit tests) goes through httpx.
The occasional admin call (health, models, props, metrics) uses httpx either way.
Whoever supervises the server (``ManagedServer`` or ``ExternalMonitor``) flips
``ready``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NamedTuple, TypeVar

import aiohttp
import httpx

from tuner.errors import UpstreamError, UpstreamNotReady, UpstreamTimeout
from tuner.logs import get_logger
from tuner.upstream.health import Health
from tuner.upstream.instances import RouterInstances

__all__ = ["UpstreamClient", "UpstreamDisconnected", "UpstreamResponse"]

log = get_logger(__name__)

# llama-server (cpp-httplib) closes idle keep-alive connections after 5 s: reuse for less.
_KEEPALIVE_S = 4.0
# pauses between tries to load a preset again after its instance was stopped
RELOAD_AFTER_S = (0.25, 0.5, 1.0, 2.0)


class UpstreamDisconnected(UpstreamError):
    """The connection to llama-server broke while its answer was being read."""


class _Outgoing(NamedTuple):
    method: str
    url: str
    content: bytes | None
    params: dict[str, str] | None
    headers: dict[str, str]


class UpstreamResponse:
    """A response whose body is still streaming; the same face for aiohttp and httpx."""

    def __init__(
        self, status_code: int, content_type: str, response: aiohttp.ClientResponse | httpx.Response
    ) -> None:
        self.status_code = status_code
        self.content_type = content_type
        self._response = response
        self._closed = False

    async def aread(self) -> bytes:
        try:
            if isinstance(self._response, httpx.Response):
                return await self._response.aread()
            return await self._response.read()
        except (TimeoutError, httpx.HTTPError, aiohttp.ClientError) as exc:
            raise UpstreamDisconnected(f"reading the answer failed: {exc!r}") from exc

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive (transfer encoding undone, bytes otherwise untouched)."""
        try:
            if isinstance(self._response, httpx.Response):
                async for chunk in self._response.aiter_raw():
                    yield chunk
            else:
                async for chunk in self._response.content.iter_any():
                    yield chunk
        except (TimeoutError, httpx.HTTPError, aiohttp.ClientError) as exc:
            raise UpstreamDisconnected(f"{type(exc).__name__}: {exc}") from exc

    async def abort(self) -> None:
        """Close the connection with the answer unread: the server stops generating it."""
        if isinstance(self._response, aiohttp.ClientResponse):
            self._closed = True
            self._response.close()
        await self.aclose()

    async def aclose(self) -> None:
        """Give the connection back; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self._response, httpx.Response):
            await self._response.aclose()
        else:
            self._response.release()


class UpstreamClient:
    """A client bound to one llama-server, plus what we know of its state."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        read_timeout_s: float = 600.0,
        stall_timeout_s: float | None = None,
        default_model: str | None = None,
        routes_models: bool | None = None,
        health: Health | None = None,
        kept: str | None = None,
        force_stop: Callable[[str], bool] | None = None,
        direct: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.read_timeout_s = read_timeout_s
        self.stall_timeout_s = stall_timeout_s  # a stream silent this long is stuck
        # True: a router (llama-server's, or the pool) that serves each variant as a model;
        # None: not known (a server the user runs): one listing several models is taken so
        self._routes = routes_models
        self.health = health or Health(self.base_url)
        # the preset every failure falls back to: after a stall it is loaded again at once
        self.kept = kept
        # kills a preset's instance outright (a router's stop waits on a stopped process)
        self._force_stop = force_stop
        # set: every call goes through this httpx transport (a test's fake, or the pool)
        self._given = transport
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=8)
        self._transport = transport or httpx.AsyncHTTPTransport(limits=limits)
        self._timeout = httpx.Timeout(
            connect=5.0, read=read_timeout_s, write=60.0, pool=read_timeout_s
        ).as_dict()
        self.http = httpx.AsyncClient(base_url=self.base_url, transport=self._transport)
        # a router's presets' own addresses: whole answers go there (``instances``)
        self.instances = RouterInstances(self.http) if direct else None
        self._session: aiohttp.ClientSession | None = None
        self.model_ids: tuple[str, ...] = (default_model,) if default_model else ()
        # Input kinds the model accepts beyond text (from /props); None when unknown.
        self.modalities: frozenset[str] | None = None
        # in flight per preset: a probe of its instance, an unload of it
        self._probes: dict[str, asyncio.Future[bool]] = {}
        self._unloads: dict[str, asyncio.Future[None]] = {}

    @property
    def ready(self) -> bool:
        return self.health.ready

    @property
    def routes(self) -> bool:
        """Whether the server routes requests by model (each variant a model of its own)."""
        return self._routes if self._routes is not None else len(self.model_ids) > 1

    def resolve_model(self, requested: object) -> str | None:
        """The model id to send upstream, or None to leave the body as it is.

        A llama-server serving one model ignores ``model``, so the body passes
        through untouched. A router needs a model it has: the client's when it is
        one of them, else the first.
        """
        if not self.routes or not self.model_ids:
            return None
        if isinstance(requested, str) and requested in self.model_ids:
            return requested
        return self.model_ids[0]

    async def check_health(self) -> bool:
        """One ``GET /health``: True on 200, False on anything else."""
        try:
            response = await self.http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def refresh_models(self) -> None:
        """Learn the served model ids (``/v1/models``) and input modalities (``/props``)."""
        data = await self._get_json("/v1/models")
        models = data.get("data") if isinstance(data, dict) else None
        if isinstance(models, list):
            ids = tuple(
                m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)
            )
            self.model_ids = ids or self.model_ids
        props = await self._get_json("/props")
        if isinstance(props, dict) and props.get("role") == "router" and self.model_ids:
            # A router answers for itself; a preset answers for the model (and gets loaded).
            preset = "none" if "none" in self.model_ids else self.model_ids[0]
            props = await self._get_json(f"/props?model={preset}", timeout_s=120.0)
        modalities = props.get("modalities") if isinstance(props, dict) else None
        if isinstance(modalities, dict):
            self.modalities = frozenset(k for k, on in modalities.items() if on is True)

    async def _get_json(self, path: str, timeout_s: float = 5.0) -> Any:
        try:
            response = await self.http.get(path, timeout=timeout_s)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def open(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        params: dict[str, str] | None = None,
        instance: str | None = None,
    ) -> UpstreamResponse:
        """Send a request and return the response with its body still streaming; with
        ``instance`` (a router's preset), straight to its instance where it runs."""
        if not self.health.ready:
            raise UpstreamNotReady()
        headers = {"accept-encoding": "identity"}
        if content is not None:
            headers["content-type"] = "application/json"
        outgoing = _Outgoing(method, self.base_url + path, content, params, headers)
        if self._given is not None:
            return await self._open_httpx(outgoing)
        if instance is not None and self.instances is not None:
            url = await self.instances.url(instance)
            if url is not None:
                try:
                    return await self._open_aiohttp(outgoing._replace(url=url + path))
                except UpstreamNotReady:  # it stopped or moved: the router knows where
                    self.instances.forget(instance)
        return await self._open_aiohttp(outgoing)

    async def _open_httpx(self, out: _Outgoing) -> UpstreamResponse:
        request = httpx.Request(
            out.method,
            out.url,
            content=out.content,
            params=out.params,
            headers=out.headers,
            extensions={"timeout": self._timeout},
        )
        try:
            response = await self._transport.handle_async_request(request)
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"the model server did not answer in time: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise UpstreamNotReady(f"the model server is unreachable: {exc!r}") from exc
        response.request = request
        content_type = response.headers.get("content-type", "application/json")
        return UpstreamResponse(response.status_code, content_type, response)

    def _aiohttp_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=512, keepalive_timeout=_KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=5.0, sock_read=self.read_timeout_s
                ),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
            )
        return self._session

    async def _open_aiohttp(self, out: _Outgoing) -> UpstreamResponse:
        session = self._aiohttp_session()
        try:
            try:
                response = await session.request(
                    out.method, out.url, data=out.content, params=out.params, headers=out.headers
                )
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                # The server closed the connection before answering (a pooled keep-alive
                # connection it had just dropped, or a reset while the body was written):
                # the request was not processed. Once more, on a fresh connection.
                self.health.reconnected()
                response = await session.request(
                    out.method,
                    out.url,
                    data=out.content,
                    params=out.params,
                    headers={**out.headers, "connection": "close"},
                )
        except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise UpstreamTimeout(f"the model server did not answer in time: {exc!r}") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamNotReady(f"the model server is unreachable: {exc!r}") from exc
        content_type = response.headers.get("content-type", "application/json")
        return UpstreamResponse(response.status, content_type, response)

    async def responds(self, model: str, timeout_s: float = 5.0) -> bool:
        """Whether a router preset's instance answers at all (``/props?model=``, which the
        router forwards to it): a stopped or wedged one does not. One still loading says so
        at once (``autoload=false``: the probe never waits for a load) and counts as
        answering. Requests waiting on one instance share one probe."""
        return await _joined(self._probes, model, lambda: self._probe(model, timeout_s))

    async def _probe(self, model: str, timeout_s: float) -> bool:
        params = {"model": model, "autoload": "false"}
        probe = self.http.get("/props", params=params, timeout=timeout_s)
        try:
            response = await asyncio.wait_for(probe, timeout_s)  # whatever the transport does
        except (httpx.HTTPError, TimeoutError):
            return False
        return response.status_code < 500 or response.status_code == 503  # 503: loading

    async def unload(self, model: str) -> None:
        """Stop a preset's instance (killed outright where the client can, else the router
        kills it after its stop timeout); the next request for it loads it anew, and the
        kept preset is loaded again at once. Requests that find the instance stuck
        together unload it once. Never raises."""
        await _joined(self._unloads, model, lambda: self._unload(model))

    async def settled(self, model: str) -> None:
        """Wait for an unload of the preset in flight (the kept one's reload included)."""
        call = self._unloads.get(model)
        if call is not None and not call.done():
            await asyncio.shield(call)

    async def _unload(self, model: str) -> None:
        self.health.reloading(model)
        if self._force_stop is not None and await asyncio.to_thread(self._force_stop, model):
            log.warning("instance_killed", model=model)
        try:
            response = await self.http.post("/models/unload", json={"model": model}, timeout=30.0)
            log.warning("instance_unloaded", model=model, status=response.status_code)
        except httpx.HTTPError as exc:
            log.error("instance_unload_failed", model=model, error=str(exc))
        if model == self.kept:
            await self._reload(model)

    async def _reload(self, model: str) -> None:
        """Load the preset again (a read through the router loads it and waits for it);
        once it answers it has recovered."""
        status = None
        for pause in (0.0, *RELOAD_AFTER_S):  # the router may not have seen the exit yet
            await asyncio.sleep(pause)
            try:
                response = await self.http.get(
                    "/props", params={"model": model}, timeout=self.read_timeout_s
                )
            except httpx.HTTPError as exc:
                log.error("instance_reload_failed", model=model, error=str(exc))
                return
            status = response.status_code
            if status == 200:
                log.warning("instance_reloaded", model=model)
                self.health.answered(model)
                return
        log.error("instance_reload_failed", model=model, status=status)

    async def aclose(self) -> None:
        await self.http.aclose()
        if self._session is not None:
            await self._session.close()


_T = TypeVar("_T")


def _joined(
    running: dict[str, asyncio.Future[_T]], key: str, start: Callable[[], Awaitable[_T]]
) -> asyncio.Future[_T]:
    """The call in flight for ``key``, or ``start``'s new one: callers that come while it runs
    share its result, and one that leaves does not cancel it for the others."""
    call = running.get(key)
    if call is None or call.done():
        call = running[key] = asyncio.ensure_future(start())
    return asyncio.shield(call)
