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

import hmac
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import anyio
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tuner.classify import Classification
from tuner.errors import RequestError, TunerError
from tuner.logs import get_logger
from tuner.metrics import Metrics
from tuner.proxy.gate import VariantGate
from tuner.proxy.openai_errors import (
    OpenAIError,
    error_for_exception,
    sse_error_event,
    translate_upstream_error,
)
from tuner.proxy.sse import ModelRename, TimingsSniffer, answer_text, extract_timings
from tuner.proxy.validation import CHAT, COMPLETIONS, NATIVE, parse_body, validate
from tuner.records import RecordStore, RequestRecord, Timings
from tuner.upstream.client import UpstreamClient, UpstreamDisconnected, UpstreamResponse

__all__ = ["Service", "create_app"]

log = get_logger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


Classifier = Callable[[dict[str, Any]], Classification]


class Routing(Protocol):
    """What the tuner decided for one request (see ``tuner.tuning.service.Routed``)."""

    @property
    def variant(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def trial(self) -> int | None: ...
    @property
    def model(self) -> str | None: ...
    @property
    def fields(self) -> dict[str, Any] | None: ...


Router = Callable[[str | None], Routing]


# takes an answered request: its record, endpoint, body and answer text
Keep = Callable[[RequestRecord, str, dict[str, Any], str], object]


class Service(Protocol):
    """Something started and stopped with the app (supervisor, record writer, ...)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def _error_response(error: OpenAIError, request_id: str | None = None) -> JSONResponse:
    headers = error.headers()
    if request_id:
        headers["x-request-id"] = request_id
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


@dataclass(slots=True)
class _Trace:
    """What one request has done so far; becomes its ``RequestRecord``."""

    records: RecordStore
    endpoint: str
    request_id: str
    ts: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    stream: bool = False
    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    t_send: float | None = None
    t_headers: float | None = None
    class_key: str | None = None
    features: dict[str, Any] | None = None
    variant: str | None = None
    role: str | None = None
    trial: int | None = None
    replay: bool = False
    wait_ms: float | None = None
    finished: bool = False
    # Counterfactual replays: who gets the answered request (with its body and text)
    keep: Keep | None = None
    request_body: dict[str, Any] | None = None
    chunks: list[bytes] | None = None  # a stream's raw bytes, kept while ``keep`` is set

    def note_body(self, body: dict[str, Any]) -> None:
        self.stream = body.get("stream") is True
        model, temp = body.get("model"), body.get("temperature")
        self.model = model if isinstance(model, str) else None
        tokens = body.get("max_tokens", body.get("max_completion_tokens", body.get("n_predict")))
        self.max_tokens = tokens if isinstance(tokens, int) else None
        self.temperature = float(temp) if isinstance(temp, int | float) else None

    def finish(
        self,
        status: int,
        *,
        error: str | None = None,
        timings: dict[str, Any] | None = None,
        body: bytes | None = None,
    ) -> None:
        """Hand the record over (once); building it and its log line happens off the loop."""
        if self.finished:
            return
        self.finished = True
        self.records.submit(partial(self._build, time.perf_counter(), status, error, timings, body))

    def _build(
        self,
        now: float,
        status: int,
        error: str | None,
        timings: dict[str, Any] | None,
        body: bytes | None,
    ) -> RequestRecord:
        if timings is None and body is not None:
            with suppress(ValueError):
                timings = extract_timings(json.loads(body))
        parsed: Timings | None = None
        if timings is not None:
            with suppress(ValueError):
                parsed = Timings.model_validate(timings)
        record = RequestRecord(
            id=self.request_id,
            ts=self.ts,
            endpoint=self.endpoint,
            stream=self.stream,
            status=status,
            error=error,
            model=self.model,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            proxy_ms=(now - self.t0) * 1000,
            upstream_ms=None if self.t_send is None else (now - self.t_send) * 1000,
            ttfb_ms=None
            if self.t_send is None or self.t_headers is None
            else (self.t_headers - self.t_send) * 1000,
            timings=parsed,
            wait_ms=self.wait_ms,
            class_key=self.class_key,
            features=self.features,
            variant=self.variant,
            role=self.role,
            trial=self.trial,
            replay=self.replay,
        )
        log.info(
            "request",
            request_id=self.request_id,
            endpoint=self.endpoint,
            class_key=self.class_key,
            variant=self.variant,
            status=status,
            stream=self.stream,
            ms=round(record.proxy_ms, 2),
            predicted_n=parsed.predicted_n if parsed else None,
            tok_s=parsed.predicted_per_second if parsed else None,
            error=error,
        )
        if self.keep is not None and self.request_body is not None and status == 200:
            # every answered request is offered, an empty answer too (it is counted, not kept)
            text = answer_text(body, self.chunks) or ""
            self.keep(record, self.endpoint, self.request_body, text)
        self.request_body = self.chunks = None
        return record


@dataclass(slots=True)
class Drain:
    """Shutdown as open streams see it: once ``cut``, each ends at its next chunk.

    The daemon sets ``cut`` when the drain bound has passed since the stop signal;
    the stream then ends with an error event, not a torn connection.
    """

    cut: bool = False


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
    ):
        self.router = router
        self.gate = gate
        self.public_models = tuple(public_models)
        self.upstream = upstream
        self.records = records
        self.max_body_bytes = max_body_bytes
        self.classifier = classifier
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.last_active = time.monotonic()
        # Idle-time tuning (tuner.tuning.offline): keeps a sample of classified bodies.
        self.sampler: Callable[[str | None, str, dict[str, Any]], object] | None = None
        # Counterfactual replays (tuner.tuning.counterfactual): gets each answered request.
        self.counterfactual: Keep | None = None
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
            trace = _Trace(self.records, endpoint, request_id)
            if self.in_flight >= self.max_concurrent:
                busy = OpenAIError(
                    429,
                    f"more than {self.max_concurrent} requests in flight; retry shortly",
                    "rate_limit_error",
                    code="rate_limit_exceeded",
                    retry_after=1,
                )
                trace.finish(429, error=busy.message)
                return _error_response(busy, request_id)
            self.in_flight += 1
            self.last_active = time.monotonic()
            handed_over = gated = False
            try:
                raw = await self.read_body(request)
                body = parse_body(raw)
                trace.note_body(body)
                validate(endpoint, body, self.upstream.modalities)
                if self.classifier is not None:
                    found = self.classifier(body)
                    trace.class_key, trace.features = found.key, found.features.as_dict()
                if self.sampler is not None:
                    self.sampler(trace.class_key, endpoint, body)
                if self.router is not None:
                    raw = self._route(trace, body) or raw
                    if self.gate is not None and trace.variant is not None:
                        queued = time.perf_counter()
                        await self.gate.acquire(trace.variant)
                        trace.wait_ms = (time.perf_counter() - queued) * 1000
                        gated = True
                response = await _forward(
                    self.upstream, trace, body, raw, self.drain, self._shown_model()
                )
                if isinstance(response, _RelayResponse):
                    response.close_hooks.append(self._release)  # held until the stream ends
                    if gated:
                        response.close_hooks.append(self._open_gate)
                    handed_over = True
                return response
            except TunerError as exc:
                error = error_for_exception(exc)
                trace.finish(error.status, error=error.message)
                return _error_response(error, request_id)
            finally:
                if not handed_over:
                    await self._release()
                    if gated:
                        await self._open_gate()
                structlog.contextvars.unbind_contextvars("request_id")

        return handler

    def _route(self, trace: _Trace, body: dict[str, Any]) -> bytes | None:
        """Apply the tuner's decision to the body; the new body bytes when it changed."""
        assert self.router is not None
        changed = self._apply(trace, body, self.router(trace.class_key))
        if self.counterfactual is not None and trace.variant is not None:
            trace.keep, trace.request_body = self.counterfactual, body
            trace.chunks = [] if trace.stream else None
        return changed

    @staticmethod
    def _apply(trace: _Trace, body: dict[str, Any], routed: Routing) -> bytes | None:
        """Note a routing decision on the trace and apply it to the body; the new body bytes
        when it changed."""
        trace.variant, trace.role, trace.trial = routed.variant, routed.role, routed.trial
        if routed.model is not None:
            body["model"] = routed.model
        if routed.fields:
            body.update(routed.fields)
        if routed.model is None and not routed.fields:
            return None
        return json.dumps(body, ensure_ascii=False).encode()

    def _shown_model(self) -> str | None:
        """The model name answers carry (router mode: the model, not the variant's preset)."""
        return self.public_models[0] if self.public_models else None

    async def _release(self) -> None:
        self.in_flight -= 1
        self.last_active = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since the last live request finished (0 while one is in flight)."""
        return 0.0 if self.in_flight else time.monotonic() - self.last_active

    async def replay(
        self, class_key: str, endpoint: str, body: dict[str, Any], routed: Routing
    ) -> bool:
        """Send one replayed prompt (idle-time tuning) the way a live request goes: through
        the variant gate, recorded (``replay``) and observed by the tuner. False when it
        failed or a live request is in flight (the replay should stop)."""
        if self.in_flight:
            return False
        trace = _Trace(self.records, endpoint, f"replay_{uuid.uuid4().hex}")
        trace.note_body(body)
        trace.class_key, trace.replay = class_key, True
        raw = self._apply(trace, body, routed) or json.dumps(body, ensure_ascii=False).encode()
        gated = False
        try:
            if self.gate is not None:
                await self.gate.acquire(routed.variant)
                gated = True
            # only the status is read: the answer is not renamed for anyone
            response = await _forward(self.upstream, trace, body, raw, self.drain)
            if isinstance(response, _RelayResponse):  # asked whole; answered as a stream
                for hook in response.close_hooks:
                    await hook()  # gives the connection back and records it
                return False
            return response.status_code == 200
        except TunerError as exc:
            trace.finish(error_for_exception(exc).status, error=str(exc))
            return False
        finally:
            if gated:
                await self._open_gate()

    async def _open_gate(self) -> None:
        assert self.gate is not None
        self.gate.release()

    async def models(self, request: Request) -> Response:
        if self.public_models:  # router mode: the presets are variants, not models
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "spec-tuner"}
                    for m in self.public_models]  # fmt: skip
            return JSONResponse({"object": "list", "data": data})
        try:
            response = await self.upstream.open("GET", "/v1/models")
            raw = await response.aread()
            await response.aclose()
        except TunerError as exc:
            return _error_response(error_for_exception(exc))
        if response.status_code >= 400:
            return _error_response(translate_upstream_error(response.status_code, raw))
        return Response(raw, media_type="application/json")

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        if self.upstream.ready:
            return JSONResponse({"status": "ready", "models": list(self.upstream.model_ids)})
        return JSONResponse(
            {"status": "starting", "restarts": self.upstream.restarts},
            status_code=503,
            headers={"retry-after": "2"},
        )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return _error_response(OpenAIError(exc.status_code, message, code=code))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal_error", path=request.url.path)
    return _error_response(OpenAIError(500, "internal error in spec-tuner", "server_error"))


def create_app(
    upstream: UpstreamClient,
    records: RecordStore,
    *,
    services: Sequence[Service] = (),
    max_body_bytes: int = 16 * 1024 * 1024,
    classifier: Classifier | None = None,
    metrics: Metrics | None = None,
    api_keys: Sequence[str] = (),
    max_concurrent: int = 256,
    router: Router | None = None,
    public_models: Sequence[str] = (),
    gate: VariantGate | None = None,
) -> Starlette:
    """Build the proxy app around one upstream client and one record store.

    ``classifier`` (body -> class and features, pure) labels each request's record;
    ``metrics`` (created here when not given) serves ``GET /metrics``.
    """
    handlers = _Handlers(
        upstream, records, max_body_bytes, classifier, max_concurrent, router, public_models, gate
    )
    metrics = metrics or Metrics(upstream, records)
    records.observers.append(metrics.observe)

    async def exposition(request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await records.start()
        for service in services:
            await service.start()
        try:
            yield
        finally:
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
    app.state.keys = ring  # SIGHUP replaces the keys (tuner.daemon.reload)
    return app


class KeyRing:
    """The accepted API keys; replaced as a whole on reload (no keys: no authentication)."""

    def __init__(self, keys: Sequence[str] = ()) -> None:
        self.keys: tuple[bytes, ...] = ()
        self.set(keys)

    def set(self, keys: Sequence[str]) -> None:
        self.keys = tuple(key.encode() for key in keys)


class BearerAuth:
    """ASGI middleware: every route but /health and /ready needs ``Authorization: Bearer <key>``
    once the key ring holds any key."""

    OPEN = frozenset({"/health", "/ready"})

    def __init__(self, app: ASGIApp, ring: KeyRing) -> None:
        self.app = app
        self.ring = ring

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.ring.keys
            or scope["type"] != "http"
            or scope["path"] in self.OPEN
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        error = OpenAIError(
            401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
            "authentication_error", code="invalid_api_key",
        )  # fmt: skip
        await _error_response(error)(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        # compare against every key, always, in constant time per key
        return any([hmac.compare_digest(token.strip(), key) for key in self.ring.keys])


async def _forward(
    upstream: UpstreamClient,
    trace: _Trace,
    body: dict[str, Any],
    raw: bytes,
    drain: Drain,
    shown: str | None = None,
) -> Response:
    """Send the request upstream and hand back its answer, streamed or whole; with
    ``shown``, answers name that model instead of the one sent upstream (a preset)."""
    model = upstream.resolve_model(body.get("model"))
    if model is not None and body.get("model") != model:
        body["model"] = model
        raw = json.dumps(body, ensure_ascii=False).encode()
    sent = body.get("model")
    rename = ModelRename(sent, shown) if shown and isinstance(sent, str) and sent != shown else None
    trace.t_send = time.perf_counter()
    response = await upstream.open("POST", trace.endpoint, content=raw)
    trace.t_headers = time.perf_counter()
    headers = {"x-request-id": trace.request_id}
    if trace.variant is not None:
        headers["x-spec-variant"] = trace.variant
    if trace.role is not None:
        headers["x-spec-role"] = trace.role
    if trace.class_key is not None:
        headers["x-spec-class"] = trace.class_key

    if response.status_code >= 400:
        data = await response.aread()
        await response.aclose()
        error = translate_upstream_error(response.status_code, data)
        trace.finish(error.status, error=error.message)
        return _error_response(error, trace.request_id)

    content_type = response.content_type
    if not content_type.startswith("text/event-stream"):
        data = await response.aread()
        await response.aclose()
        trace.finish(response.status_code, body=data)  # timings are parsed off the loop
        if rename is not None:
            data = rename.whole(data)
        return Response(data, status_code=response.status_code, media_type=content_type,
                        headers=headers)  # fmt: skip

    headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    relay = _RelayResponse(
        _relay(response, trace, drain, rename),
        status_code=response.status_code,
        media_type="text/event-stream",
        headers=headers,
    )
    relay.close_hooks.append(partial(_abandon, response, trace))
    return relay


class _RelayResponse(StreamingResponse):
    """A stream whose clean-up runs however it ends (done, client gone, or error).

    Starlette does not close the body iterator, and a client that leaves before the
    first chunk means the relay generator never starts, so its ``finally`` never runs.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.close_hooks: list[Callable[[], Awaitable[None]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                for hook in self.close_hooks:
                    await hook()


async def _abandon(response: UpstreamResponse, trace: _Trace) -> None:
    """If the relay never ran: give the connection back and record the request anyway."""
    await response.aclose()
    trace.finish(response.status_code, error="client disconnected before the stream started")


async def _relay(
    response: UpstreamResponse, trace: _Trace, drain: Drain, rename: ModelRename | None = None
) -> AsyncIterator[bytes]:
    """Pass SSE bytes through (with ``rename``, each event's ``model`` renamed); end with
    an error event if upstream dies or the daemon's drain bound has passed."""
    sniffer = TimingsSniffer()
    error: str | None = "client disconnected"
    try:
        async for chunk in response.aiter_raw():
            if drain.cut:
                cut = OpenAIError(
                    503,
                    "the server is shutting down: the answer was cut at its drain bound",
                    "server_error",
                    code="server_shutting_down",
                )
                error = cut.message
                if rename is not None:
                    yield rename.flush()
                yield sse_error_event(cut)
                break
            sniffer.feed(chunk)
            if trace.chunks is not None:
                trace.chunks.append(chunk)
            out = chunk if rename is None else rename.feed(chunk)
            if out:
                yield out
        else:
            error = None
            if rename is not None:
                yield rename.flush()
    except UpstreamDisconnected as exc:
        failure = OpenAIError(
            502,
            f"the model server stopped in the middle of the answer: {exc}",
            "server_error",
            code="upstream_disconnected",
        )
        error = failure.message
        if rename is not None:
            yield rename.flush()
        yield sse_error_event(failure)
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
        sniffer.close()
        if sniffer.done and error == "client disconnected":
            # the client had the whole answer and closed at [DONE], before upstream's own
            # end of the response reached us (the official SDK does): not a disconnect
            error = None
        trace.finish(response.status_code, error=error or sniffer.error, timings=sniffer.timings)
