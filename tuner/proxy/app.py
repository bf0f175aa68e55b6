"""The OpenAI-compatible proxy app (Starlette).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST
/completion`` (llama.cpp's native endpoint), ``GET /v1/models``, ``GET /health``
(liveness) and ``GET /ready`` (upstream ready). Bodies are validated just
enough for a clear 400, the ``model`` field is pointed at the served model,
unknown fields pass through, and responses go back byte for byte; streams are
relayed chunk by chunk. Each request leaves a ``RequestRecord`` (with
llama-server's ``timings``) in the ``RecordStore``; recording never waits on
disk.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tuner.classify import Classification
from tuner.errors import RequestError, TunerError
from tuner.logs import get_logger
from tuner.metrics import Metrics, RequestMetrics
from tuner.proxy.auth import BearerAuth, KeyRing
from tuner.proxy.gate import VariantGate
from tuner.proxy.openai_errors import (
    OpenAIError,
    error_for_exception,
    translate_upstream_error,
)
from tuner.proxy.relay import Drain, RelayResponse, error_response, forward
from tuner.proxy.trace import Keep, Trace
from tuner.proxy.validation import CHAT, COMPLETIONS, NATIVE, parse_body, validate
from tuner.records import RecordStore
from tuner.sessions.prefix import Prompt, prompt_of
from tuner.upstream.client import UpstreamClient

__all__ = ["Lifecycle", "create_app"]

log = get_logger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


Classifier = Callable[[dict[str, Any]], Classification]


class Routing(Protocol):
    """What the tuner decided for one request (see ``tuner.tuning.runtime.service.Routed``)."""

    @property
    def variant(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def trial(self) -> int | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def session(self) -> str | None: ...


# a request's class and prompt -> what to send it to
Router = Callable[[str | None, Prompt], Routing]
# a routed request's variant failed on the server: the routing for a second try, or None
# (given the variant, the request's id and the error's message)
Fallback = Callable[[str, str, str], Routing | None]


class Lifecycle(Protocol):
    """Something started and stopped with the app (supervisor, record writer, ...)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class _Hold:
    """One request's place in the variant gate (none without a gate); released once."""

    def __init__(self, gate: VariantGate | None) -> None:
        self.gate, self.held = gate, False

    async def acquire(self, variant: str) -> bool:
        if self.gate is None:
            return False
        await self.gate.acquire(variant)
        self.held = True
        return True

    async def release(self) -> None:
        if self.held and self.gate is not None:
            self.held = False
            self.gate.release()


class _Handlers:
    """The route handlers, sharing one upstream client and one record store."""

    def __init__(
        self,
        upstream: UpstreamClient,
        records: RecordStore,
        max_body_bytes: int,
        classifier: Classifier | None,
        max_concurrent: int,
        router: Router | None = None,
        public_models: Sequence[str] = (),
        gate: VariantGate | None = None,
        keep: Keep | None = None,
        fallback: Fallback | None = None,
        engine: str | None = None,
    ):
        self.engine = engine  # the llama-server engine beneath (None: one the user runs)
        self.router = router
        self.gate = gate
        self.public_models = tuple(public_models)
        self.upstream = upstream
        self.records = records
        self.max_body_bytes = max_body_bytes
        self.classifier = classifier
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        # counterfactual replays (tuner.tuning.replay.worker): get each answered request
        self.keep = keep
        self.fallback = fallback
        self.drain = Drain()

    async def read_body(self, request: Request) -> bytes:
        too_large = RequestError(
            f"the request body is larger than {self.max_body_bytes} bytes", status=413
        )
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise too_large
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    def generation(self, endpoint: str) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            header_id = request.headers.get("x-request-id", "")
            request_id = header_id if _REQUEST_ID.match(header_id) else f"req_{uuid.uuid4().hex}"
            structlog.contextvars.bind_contextvars(request_id=request_id)
            trace = Trace(self.records, endpoint, request_id)
            if self.in_flight >= self.max_concurrent:
                busy = OpenAIError(
                    429,
                    f"more than {self.max_concurrent} requests in flight; retry shortly",
                    "rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after=1,
                )
                trace.finish(429, error=busy.message)
                return error_response(busy, request_id)
            self.in_flight += 1
            handed_over, hold = False, _Hold(self.gate)
            try:
                raw = await self.read_body(request)
                body = parse_body(raw)
                trace.note_body(body)
                validate(endpoint, body, self.upstream.modalities)
                if self.classifier is not None:
                    found = self.classifier(body)
                    trace.class_key, trace.features = found.key, found.features.as_dict()
                if self.router is not None:
                    raw = self._route(trace, body, request.headers.get("x-session-id")) or raw
                response = await self._send(trace, body, raw, hold)
                if isinstance(response, RelayResponse):
                    response.close_hooks += [self._release, hold.release]  # until it ends
                    handed_over = True
                return response
            except TunerError as exc:
                error = error_for_exception(exc)
                trace.finish(error.status, error=error.message)
                return error_response(error, request_id)
            finally:
                if not handed_over:
                    await self._release()
                    await hold.release()
                structlog.contextvars.unbind_contextvars("request_id")

        return handler

    def _route(self, trace: Trace, body: dict[str, Any], session: str | None) -> bytes | None:
        """Apply the tuner's decision to the body; the new body bytes when it changed."""
        assert self.router is not None
        prompt = prompt_of(body, session)
        trace.prompt_chars = prompt.chars
        changed = self._apply(trace, body, self.router(trace.class_key, prompt))
        self._keep_answer(trace, body)
        return changed

    def _keep_answer(self, trace: Trace, body: dict[str, Any]) -> None:
        """A routed request's answer goes to ``keep`` (the replays) once it is recorded."""
        if self.keep is not None and trace.variant is not None:
            trace.keep, trace.request_body = self.keep, body
            trace.chunks = [] if trace.stream else None

    async def _send(self, trace: Trace, body: dict[str, Any], raw: bytes, hold: _Hold) -> Response:
        """Forward (through the variant gate); where the variant failed on the server before
        answering, once more as ``fallback`` routes it (no speculation), recorded apart."""
        for attempt in range(2):
            if trace.variant is not None:
                queued = time.perf_counter()
                if await hold.acquire(trace.variant):
                    trace.wait_ms = (time.perf_counter() - queued) * 1000
            try:
                response = await forward(
                    self.upstream, trace, body, raw, self.drain, self._shown_model()
                )
            except TunerError as exc:
                if attempt == 0:
                    raise  # the handler records it on its own trace
                error = error_for_exception(exc)  # the second try's trace is ours to finish
                trace.finish(error.status, error=error.message)
                return error_response(error, trace.request_id)
            retry = self._second_try(trace, response) if attempt == 0 else None
            if retry is None:
                return response
            await hold.release()
            trace = self._retrace(trace, body)
            raw = self._apply(trace, body, retry) or raw
            self._keep_answer(trace, body)
        raise AssertionError("unreachable: the second try returns")

    def _second_try(self, trace: Trace, response: Response) -> Routing | None:
        """Where a routed request's variant failed on the server before any byte went back
        (its preset did not load, its instance died or could not be reached), the routing
        to send it again with; None otherwise."""
        if self.fallback is None or trace.variant is None or isinstance(response, RelayResponse):
            return None
        if response.status_code < 500:
            return None
        reason = trace.error or f"status {response.status_code}"
        return self.fallback(trace.variant, trace.request_id, reason)

    def _retrace(self, failed: Trace, body: dict[str, Any]) -> Trace:
        """A new trace for the second try (the failed one is recorded as it was)."""
        trace = Trace(self.records, failed.endpoint, failed.request_id)
        trace.note_body(body)
        trace.class_key, trace.features = failed.class_key, failed.features
        trace.prompt_chars = failed.prompt_chars
        return trace

    @staticmethod
    def _apply(trace: Trace, body: dict[str, Any], routed: Routing) -> bytes | None:
        """Note a routing decision on the trace and apply it to the body; the new body bytes
        when it changed."""
        trace.variant, trace.role, trace.trial = routed.variant, routed.role, routed.trial
        trace.session = routed.session
        if routed.model is None:
            return None
        body["model"] = routed.model
        return json.dumps(body, ensure_ascii=False).encode()

    def _shown_model(self) -> str | None:
        """The model name answers carry (router mode: the model, not the variant's preset)."""
        return self.public_models[0] if self.public_models else None

    async def _release(self) -> None:
        self.in_flight -= 1

    async def models(self, request: Request) -> Response:
        if self.public_models:  # router mode: the presets are variants, not models
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "spec-tuner"}
                for m in self.public_models
            ]
            return JSONResponse({"object": "list", "data": data})
        try:
            response = await self.upstream.open("GET", "/v1/models")
            raw = await response.aread()
            await response.aclose()
        except TunerError as exc:
            return error_response(error_for_exception(exc))
        if response.status_code >= 400:
            return error_response(translate_upstream_error(response.status_code, raw))
        return Response(raw, media_type="application/json")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        if self.upstream.ready:
            found: dict[str, object] = {"status": "ready", "models": list(self.upstream.model_ids)}
            if self.engine is not None:
                found["engine"] = self.engine
            if recovering := self.upstream.health.recovering_now():  # reloaded after a stall
                found["recovering"] = recovering
            return JSONResponse(found)
        return JSONResponse(
            {"status": "starting", "restarts": self.upstream.health.restarts},
            status_code=503,
            headers={"retry-after": "2"},
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(OpenAIError(exc.status_code, message, code=code))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal_error", path=request.url.path)
    return error_response(OpenAIError(500, "internal error in spec-tuner", "server_error"))


def create_app(
    upstream: UpstreamClient,
    records: RecordStore,
    *,
    services: Sequence[Lifecycle] = (),
    max_body_bytes: int = 16 * 1024 * 1024,
    classifier: Classifier | None = None,
    metrics: Metrics | None = None,
    api_keys: Sequence[str] = (),
    max_concurrent: int = 256,
    router: Router | None = None,
    public_models: Sequence[str] = (),
    gate: VariantGate | None = None,
    keep: Keep | None = None,
    fallback: Fallback | None = None,
    engine: str | None = None,
) -> Starlette:
    """Build the proxy app around one upstream client and one record store.

    ``classifier`` (body -> class and features, pure) labels each request's record;
    ``metrics`` (created here when not given) serves ``GET /metrics``; ``keep`` gets each
    answered request that the tuner routed (the counterfactual replayer).
    """
    handlers = _Handlers(
        upstream,
        records,
        max_body_bytes,
        classifier,
        max_concurrent,
        router,
        public_models,
        gate,
        keep,
        fallback,
        engine,
    )
    # without a ``metrics`` fed by a consumer of ``records``, requests are not counted
    metrics = metrics or Metrics(RequestMetrics(), upstream, records)

    async def exposition(request: Request) -> Response:
        # the collectors read the tuner's state under its lock: never on the event loop
        body = await asyncio.to_thread(generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await records.start()
        for service in services:
            await service.start()
        try:
            yield
        finally:
            await records.flush()  # the last requests' records reach every consumer first
            for service in reversed(services):
                await service.stop()
            await records.stop()
            await upstream.aclose()

    routes = [
        Route(CHAT, handlers.generation(CHAT), methods=["POST"]),
        Route(COMPLETIONS, handlers.generation(COMPLETIONS), methods=["POST"]),
        Route(NATIVE, handlers.generation(NATIVE), methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/ready", handlers.ready, methods=["GET"]),
        Route("/metrics", exposition, methods=["GET"]),
    ]
    ring = KeyRing(api_keys)
    middleware = [Middleware(BearerAuth, ring=ring)]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=middleware,
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.handlers = handlers
    app.state.keys = ring  # SIGHUP replaces the keys (tuner.daemon.serve.reload)
    return app
