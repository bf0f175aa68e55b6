"""The async client the proxy talks to llama-server through.

``UpstreamClient`` is the one seam between the HTTP edge and the model server:
the proxy asks it whether the server is ready, which model id to send, and to
open a (streamed) response. Tests build it over ``httpx.MockTransport``; the
daemon over a real connection to a managed or external llama-server. Whoever
supervises the server (``ManagedServer`` or ``ExternalMonitor``) flips
``ready``.
"""

from __future__ import annotations

from typing import Any

import httpx

from tuner.errors import UpstreamNotReady, UpstreamTimeout
from tuner.logs import get_logger

__all__ = ["UpstreamClient"]

log = get_logger(__name__)


class UpstreamClient:
    """An httpx client bound to one llama-server, plus what we know of its state."""

    def __init__(
        self,
        base_url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        read_timeout_s: float = 600.0,
        default_model: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        self._transport = transport or httpx.AsyncHTTPTransport(limits=limits)
        self._timeout = httpx.Timeout(
            connect=5.0, read=read_timeout_s, write=60.0, pool=read_timeout_s
        ).as_dict()
        # For the occasional admin call (health, models, props, metrics); shares the pool.
        self.http = httpx.AsyncClient(base_url=self.base_url, transport=self._transport)
        self._ready = False
        self.model_ids: tuple[str, ...] = (default_model,) if default_model else ()
        # Input kinds the model accepts beyond text (from /props); None when unknown.
        self.modalities: frozenset[str] | None = None
        self.restarts = 0

    @property
    def ready(self) -> bool:
        return self._ready

    def mark_ready(self, ready: bool) -> None:
        if ready != self._ready:
            log.info("upstream_ready" if ready else "upstream_not_ready", url=self.base_url)
        self._ready = ready

    def resolve_model(self, requested: object) -> str | None:
        """The model id to send upstream, or None to leave the body as it is.

        A llama-server serving one model ignores ``model``, so the body passes
        through untouched. One serving several (router mode) needs a model it
        has: the client's when it is one of them, else the first.
        """
        if len(self.model_ids) < 2:
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
        modalities = props.get("modalities") if isinstance(props, dict) else None
        if isinstance(modalities, dict):
            self.modalities = frozenset(k for k, on in modalities.items() if on is True)

    async def _get_json(self, path: str) -> Any:
        try:
            response = await self.http.get(path, timeout=5.0)
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
    ) -> httpx.Response:
        """Send a request and return the response with its body still streaming."""
        if not self._ready:
            raise UpstreamNotReady()
        headers = {"accept-encoding": "identity"}
        if content is not None:
            headers["content-type"] = "application/json"
        request = httpx.Request(
            method,
            self.base_url + path,
            content=content,
            params=params,
            headers=headers,
            extensions={"timeout": self._timeout},
        )
        # Straight to the transport: the hot path needs none of the Client layer
        # (auth, cookies, redirects, hooks), which costs ~0.3 ms a request.
        try:
            response = await self._transport.handle_async_request(request)
            response.request = request
            return response
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(f"the model server did not answer in time: {exc!r}") from exc
        except httpx.TransportError as exc:
            raise UpstreamNotReady(f"the model server is unreachable: {exc!r}") from exc

    async def aclose(self) -> None:
        await self.http.aclose()
