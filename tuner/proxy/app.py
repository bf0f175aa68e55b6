"""The OpenAI-compatible proxy app (Starlette).

Routes: the generation ones, classified and tuned (``POST /v1/chat/completions``,
``/v1/completions``, llama.cpp's ``/completion`` and ``/infill``), llama-server's others
answered by the instance that always runs (``tuner.proxy.passthrough``), ``GET
/v1/models``, ``GET /health`` (liveness) and ``GET /ready`` (upstream ready). Bodies are
validated just enough for a clear 400, fields the engines read otherwise are sent as both
read them (``tuner.proxy.fields``), several choices are one request each
(``tuner.proxy.choices``), unknown fields pass through, and responses go back byte for
byte; streams are relayed chunk by chunk. A client that leaves cancels its request
(``tuner.proxy.departure``). Each request leaves a ``RequestRecord`` (with llama-server's
``timings``) in the ``RecordStore``; recording never waits on disk.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
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
from tuner.proxy.backend import Backend, BackendSlot, Routing
from tuner.proxy.choices import Plan, join_streams, join_whole, plan
from tuner.proxy.departure import CLIENT_GONE, CLIENT_GONE_STATUS, ClientGone, unless_gone
from tuner.proxy.fields import normalize
from tuner.proxy.openai_errors import (
    OpenAIError,
    error_for_exception,
    translate_upstream_error,
)
from tuner.proxy.passthrough import GETS, POSTS, passthrough
from tuner.proxy.relay import Drain, RelayResponse, error_response, forward
from tuner.proxy.trace import Trace
from tuner.proxy.validation import CHAT, COMPLETIONS, INFILL, NATIVE, parse_body, validate
from tuner.records import RecordStore
from tuner.sessions.prefix import prompt_of

__all__ = ["Lifecycle", "create_app"]

log = get_logger(__name__)

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


Classifier = Callable[[dict[str, Any]], Classification]


class Lifecycle(Protocol):
    """Something started and stopped with the app (supervisor, record writer, ...)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...


class _Hold:
    """One routed request's place on its variant: in the variant gate (where there is one)
    and in the backend's count of that variant's requests; released once."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.variant: str | None = None  # held

    async def acquire(self, variant: str) -> int:
        """Wait for the variant's turn at the gate; the requests of the variant in flight
        once admitted, this one included."""
        if self.backend.gate is not None:
            await self.backend.gate.acquire(variant)
        self.variant = variant
        return self.backend.sent(variant)

    async def release(self) -> None:
        if self.variant is not None:
            self.backend.done(self.variant)
            self.variant = None
            if self.backend.gate is not None:
                self.backend.gate.release()


class _Handlers:
    """The route handlers, sharing one record store; each request is sent to the backend
    serving when it arrived (``slot``'s), to its last byte."""

    def __init__(
        self,
        slot: BackendSlot,
        records: RecordStore,
        max_body_bytes: int,
        classifier: Classifier | None,
        max_concurrent: int,
        status: Callable[[], Mapping[str, object]] | None = None,
    ):
        self.slot = slot
        self.status = status  # more of what /ready says (the engines, where measured)
        self.records = records
        self.max_body_bytes = max_body_bytes
        self.classifier = classifier
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.drain = Drain()

    @property
    def backend(self) -> Backend:
        return self.slot.backend

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
            backend = self.backend  # this request's, to its last byte
            trace.engine = backend.engine
            self.in_flight += 1
            trace.active = self.in_flight
            backend.begin()
            handed_over, hold = False, _Hold(backend)

            async def release() -> None:
                self.in_flight -= 1
                backend.end()

            try:
                raw = await self.read_body(request)
                sent = self._prepare(request, backend, trace, raw, hold)
                response = await unless_gone(request.receive, sent, _discard)
                if isinstance(response, RelayResponse):
                    response.close_hooks += [release, hold.release]  # until it ends
                    handed_over = True
                return response
            except TunerError as exc:
                error = error_for_exception(exc)
                trace.finish(error.status, error=error.message)
                return error_response(error, request_id)
            except ClientGone:
                trace.finish(CLIENT_GONE_STATUS, error=CLIENT_GONE)
                return Response(status_code=CLIENT_GONE_STATUS)
            finally:
                if not handed_over:
                    await release()
                    await hold.release()
                structlog.contextvars.unbind_contextvars("request_id")

        return handler

    def _prepare(
        self, request: Request, backend: Backend, trace: Trace, raw: bytes, hold: _Hold
    ) -> Awaitable[Response]:
        """Read, check, classify and route the request: what sends it (as one request, or
        one per choice)."""
        endpoint = trace.endpoint
        body = parse_body(raw)
        trace.note_body(body)
        validate(endpoint, body, backend.upstream.modalities)
        if endpoint == INFILL and backend.infill is False:  # ik_llama.cpp would crash on it
            raise RequestError(
                "/infill needs a model with fill-in-the-middle tokens (a code model); the served"
                " model has none",
                code="not_supported",
            )
        if normalize(endpoint, body):
            raw = _encode(body)
        choices = plan(endpoint, body)
        if self.classifier is not None:
            found = self.classifier(body)
            trace.class_key, trace.features = found.key, found.features.as_dict()
        if backend.router is not None:
            session = request.headers.get("x-session-id")
            raw = self._route(backend, trace, body, session) or raw
        if choices is None:
            return self._send(backend, trace, body, raw, hold)
        for each in choices.bodies:  # the routed model (a router's preset)
            each.update({"model": body["model"]} if "model" in body else {})
        return self._send_choices(backend, trace, choices, hold)

    def _route(
        self, backend: Backend, trace: Trace, body: dict[str, Any], session: str | None
    ) -> bytes | None:
        """Apply the tuner's decision to the body; the new body bytes when it changed."""
        assert backend.router is not None
        prompt = prompt_of(body, session)
        trace.prompt_chars = prompt.chars
        changed = self._apply(trace, body, backend.router(trace.class_key, prompt))
        self._keep_answer(backend, trace, body)
        return changed

    @staticmethod
    def _keep_answer(backend: Backend, trace: Trace, body: dict[str, Any]) -> None:
        """A routed request's answer goes to ``keep`` (the replays) once it is recorded."""
        if backend.keep is not None and trace.variant is not None:
            trace.keep, trace.request_body = backend.keep, body
            trace.chunks = [] if trace.stream else None

    async def _send(
        self, backend: Backend, trace: Trace, body: dict[str, Any], raw: bytes, hold: _Hold
    ) -> Response:
        """Forward (through the variant gate); where the variant failed on the server before
        answering, once more as ``fallback`` routes it (no speculation), recorded apart."""
        for attempt in range(2):
            if trace.variant is not None:
                queued = time.perf_counter()
                trace.batch = await hold.acquire(trace.variant)
                if backend.gate is not None:
                    trace.wait_ms = (time.perf_counter() - queued) * 1000
            try:
                response = await forward(
                    backend.upstream, trace, body, raw, self.drain, backend.shown_model
                )
            except TunerError as exc:
                if attempt == 0:
                    raise  # the handler records it on its own trace
                error = error_for_exception(exc)  # the second try's trace is ours to finish
                trace.finish(error.status, error=error.message)
                return error_response(error, trace.request_id)
            retry = self._second_try(backend, trace, response) if attempt == 0 else None
            if retry is None:
                return response
            await hold.release()
            if retry.variant == trace.variant:  # its instance is being restarted: wait for it
                await backend.upstream.settled(retry.variant)
            trace = self._retrace(trace, body)
            raw = self._apply(trace, body, retry) or raw
            self._keep_answer(backend, trace, body)
        raise AssertionError("unreachable: the second try returns")

    async def _send_choices(
        self, backend: Backend, trace: Trace, choices: Plan, hold: _Hold
    ) -> Response:
        """One request per choice, each routed as this one was, joined into one answer
        (``tuner.proxy.choices``); each has its own record, ``<id>.<index>`` past the first.
        Where one fails, its error is the answer."""
        traces = [trace]
        for index, body in enumerate(choices.bodies[1:], 1):
            traces.append(self._retrace(trace, body, f"{trace.request_id}.{index}"))
        for each, body in zip(traces, choices.bodies, strict=True):
            self._keep_answer(backend, each, body)
        holds = [hold, *(_Hold(backend) for _ in choices.bodies[1:])]
        sends = [
            asyncio.ensure_future(self._send_one(backend, t, b, h))
            for t, b, h in zip(traces, choices.bodies, holds, strict=True)
        ]
        try:
            answers = await asyncio.gather(*sends)
        except BaseException:  # the client left: what was sent goes, what is sent stops
            for send in sends:
                send.cancel()
                if send.done() and not send.cancelled() and send.exception() is None:
                    await _discard(send.result())
            for each in traces[1:]:  # the first is the handler's to record
                each.finish(CLIENT_GONE_STATUS, error=CLIENT_GONE)
            for extra in holds[1:]:
                await extra.release()
            raise
        return await _join(answers, choices, holds[1:])

    async def _send_one(
        self, backend: Backend, trace: Trace, body: dict[str, Any], hold: _Hold
    ) -> Response:
        """``_send``, its errors answered and recorded on its own trace."""
        try:
            return await self._send(backend, trace, body, _encode(body), hold)
        except TunerError as exc:
            error = error_for_exception(exc)
            trace.finish(error.status, error=error.message)
            return error_response(error, trace.request_id)

    @staticmethod
    def _second_try(backend: Backend, trace: Trace, response: Response) -> Routing | None:
        """Where a routed request's variant failed on the server before any byte went back
        (its preset did not load, its instance died or could not be reached), the routing
        to send it again with; None otherwise."""
        fallback = backend.fallback
        if fallback is None or trace.variant is None or isinstance(response, RelayResponse):
            return None
        if response.status_code < 500:
            return None
        reason = trace.error or f"status {response.status_code}"
        return fallback(trace.variant, trace.request_id, reason, trace.class_key)

    def _retrace(self, failed: Trace, body: dict[str, Any], request_id: str | None = None) -> Trace:
        """A new trace for the second try (the failed one is recorded as it was; its routing
        replaces the one copied), or for another choice of the same request (``request_id``),
        routed alike."""
        trace = Trace(self.records, failed.endpoint, request_id or failed.request_id)
        trace.note_body(body)
        trace.class_key, trace.features = failed.class_key, failed.features
        trace.prompt_chars, trace.engine = failed.prompt_chars, failed.engine
        trace.active = failed.active
        trace.variant, trace.role, trace.trial = failed.variant, failed.role, failed.trial
        trace.session = failed.session
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
        return _encode(body)

    async def models(self, request: Request) -> Response:
        backend = self.backend
        if backend.public_models:  # router and pool: the presets are variants, not models
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "spec-tuner"}
                for m in backend.public_models
            ]
            return JSONResponse({"object": "list", "data": data})
        try:
            response = await backend.upstream.open("GET", "/v1/models")
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
        backend = self.backend
        upstream = backend.upstream
        if upstream.ready:
            found: dict[str, object] = {"status": "ready", "models": list(upstream.model_ids)}
            if backend.engine is not None:
                found["engine"] = backend.engine
            if recovering := upstream.health.recovering_now():  # reloaded after a stall
                found["recovering"] = recovering
            return JSONResponse({**found, **(self.status() if self.status else {})})
        starting = {"status": "starting", "restarts": upstream.health.restarts}
        return JSONResponse(
            {**starting, **(self.status() if self.status else {})},
            status_code=503,
            headers={"retry-after": "2"},
        )


async def _join(answers: Sequence[Response], choices: Plan, extra: Sequence[_Hold]) -> Response:
    """The choices' answers as one (``extra``: the holds of all but the first, which are
    released with the answer); the first error among them, where one failed."""
    relays = [a for a in answers if isinstance(a, RelayResponse)]
    failed = next((a for a in answers if a.status_code >= 400), None)
    if failed is not None or not relays:
        for relay in relays:
            await relay.close()
        for hold in extra:
            await hold.release()
        if failed is not None:
            return failed
        headers = _answer_headers(answers[0])
        joined = join_whole([bytes(a.body) for a in answers], choices.echoes)
        return Response(joined, media_type="application/json", headers=headers)
    streams = [relay.body_iterator for relay in relays]
    stream = RelayResponse(
        join_streams(streams, choices.echoes),  # type: ignore[arg-type]
        status_code=200,
        media_type="text/event-stream",
        headers=_answer_headers(relays[0]),
    )
    for relay, sub in zip(relays, streams, strict=True):
        stream.close_hooks += [sub.aclose, *relay.close_hooks]  # type: ignore[attr-defined]
    stream.close_hooks += [hold.release for hold in extra]
    return stream


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


def _answer_headers(response: Response) -> dict[str, str]:
    """What an answer says of itself (its request, class, variant), less its body's."""
    own = ("content-length", "content-type")
    return {k: v for k, v in response.headers.items() if k not in own}


async def _discard(response: Response) -> None:
    """A response made for a client that left: a stream gives its upstream back."""
    if isinstance(response, RelayResponse):
        await response.close()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "not_found" if exc.status_code == 404 else None
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(OpenAIError(exc.status_code, message, code=code))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal_error", path=request.url.path)
    return error_response(OpenAIError(500, "internal error in spec-tuner", "server_error"))


def create_app(
    backend: Backend | BackendSlot,
    records: RecordStore,
    *,
    services: Sequence[Lifecycle] = (),
    max_body_bytes: int = 16 * 1024 * 1024,
    classifier: Classifier | None = None,
    metrics: Metrics | None = None,
    api_keys: Sequence[str] = (),
    max_concurrent: int = 256,
    status: Callable[[], Mapping[str, object]] | None = None,
) -> Starlette:
    """Build the proxy app around a backend (a slot's: replaced while serving) and one
    record store.

    ``classifier`` (body -> class and features, pure) labels each request's record;
    ``metrics`` (created here when not given) serves ``GET /metrics``; ``status``: more
    keys for ``GET /ready``.
    """
    slot = backend if isinstance(backend, BackendSlot) else BackendSlot(backend)
    handlers = _Handlers(slot, records, max_body_bytes, classifier, max_concurrent, status)
    # without a ``metrics`` fed by a consumer of ``records``, requests are not counted
    metrics = metrics or Metrics(RequestMetrics(), lambda: handlers.backend.upstream, records)

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
            await handlers.backend.upstream.aclose()

    other = passthrough(lambda: handlers.backend.upstream, handlers.read_body)
    routes = [
        Route(CHAT, handlers.generation(CHAT), methods=["POST"]),
        Route(COMPLETIONS, handlers.generation(COMPLETIONS), methods=["POST"]),
        Route(NATIVE, handlers.generation(NATIVE), methods=["POST"]),
        Route(INFILL, handlers.generation(INFILL), methods=["POST"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/health", handlers.health, methods=["GET"]),
        Route("/ready", handlers.ready, methods=["GET"]),
        Route("/metrics", exposition, methods=["GET"]),
        *(Route(path, other, methods=["POST"]) for path in POSTS),
        *(Route(path, other, methods=["GET"]) for path in GETS),
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
