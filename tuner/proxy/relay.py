"""Sending a request upstream and handing its answer back: whole, or relayed as a stream.

A stream is passed through byte for byte (with the model renamed where the router's
preset name must not show); if upstream dies or the daemon's drain bound passes, the
stream ends with an OpenAI-shaped error event rather than a torn connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import httpx
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tuner.errors import TunerError, UpstreamStalled
from tuner.logs import get_logger
from tuner.proxy.openai_errors import (
    OpenAIError,
    error_for_exception,
    sse_error_event,
    translate_upstream_error,
)
from tuner.proxy.quirks import (
    CUT_CHARACTER_TRIES,
    cut_character,
    empty_answer,
    one_token,
    one_token_fewer,
)
from tuner.proxy.sse import ModelRename, TimingsSniffer
from tuner.proxy.trace import Trace
from tuner.records import CLIENT_GONE
from tuner.upstream.client import UpstreamClient, UpstreamDisconnected, UpstreamResponse

__all__ = ["Drain", "RelayResponse", "error_response", "forward"]

log = get_logger(__name__)


def error_response(
    error: OpenAIError, request_id: str | None = None, more: Mapping[str, str] | None = None
) -> JSONResponse:
    """The error's JSON answer; ``more``: headers it carries besides (the class it was in)."""
    headers = {**(more or {}), **error.headers()}
    if request_id:
        headers["x-request-id"] = request_id
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


@dataclass(slots=True)
class Drain:
    """Shutdown as open streams see it: once ``cut``, each ends at its next chunk.

    The daemon sets ``cut`` when the drain bound has passed since the stop signal;
    the stream then ends with an error event, not a torn connection.
    """

    cut: bool = False


# A router whose instance just died answers "could not connect" until it has seen the exit
# (its monitor thread notices within a second); the request never reached an instance, so
# it is sent again after these pauses, then the router loads the preset anew.
NOT_CONNECTED = b"proxy error: Could not establish connection"
RESEND_AFTER_S = (0.25, 0.5, 1.0, 2.0)

# A request its instance has not started answering within this long has the instance
# probed (every instance answers one at once, busy or not): one that is stopped or wedged is
# taken out in seconds and the request sent again without speculation, not cut at the
# stall bound.
PROBE_AFTER_S = 5.0
PROBE_TIMEOUT_S = 5.0


async def _open(
    upstream: UpstreamClient, path: str, raw: bytes, instance: str | None
) -> tuple[UpstreamResponse, bytes | None]:
    """The upstream response, and its body where it was read (an error answer); ``instance``:
    the router preset whose instance a whole answer goes to straight."""
    response = await upstream.open("POST", path, content=raw, instance=instance)
    for pause in RESEND_AFTER_S:
        if response.status_code != 500:
            return response, None
        data = await response.aread()
        await response.aclose()
        if not data.startswith(NOT_CONNECTED):
            return response, data
        log.info("upstream_resend", path=path, pause_s=pause, reason=data.decode(errors="replace"))
        await asyncio.sleep(pause)
        response = await upstream.open("POST", path, content=raw, instance=instance)
    return response, None


async def forward(
    upstream: UpstreamClient,
    trace: Trace,
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
    stall = _Stall.of(upstream, sent)
    try:
        # a whole answer goes straight to its instance: the router would not cancel it
        instance = None if trace.stream else stall.preset
        response, data = await _whole_characters(stall, trace.endpoint, body, raw, instance)
    except UpstreamStalled as exc:  # nothing went back: the proxy may send it elsewhere
        error = error_for_exception(exc)
        trace.finish(error.status, error=error.message)
        return error_response(error, trace.request_id)
    try:
        return await _answer(response, data, trace, drain, rename, stall)
    except asyncio.CancelledError:  # the client left: the connection goes, and its task
        await response.abort()
        raise


async def _answer(
    response: UpstreamResponse,
    data: bytes | None,
    trace: Trace,
    drain: Drain,
    rename: ModelRename | None,
    stall: _Stall,
) -> Response:
    """The client's response to an upstream one: an error, a whole answer, or a relay."""
    trace.t_headers = time.perf_counter()
    headers = {"x-request-id": trace.request_id}
    if trace.variant is not None:
        headers["x-spec-variant"] = trace.variant
    if trace.role is not None:
        headers["x-spec-role"] = trace.role
    if trace.class_key is not None:
        headers["x-spec-class"] = trace.class_key

    if response.status_code >= 400:
        if data is None:
            data = await response.aread()
            await response.aclose()
        error = translate_upstream_error(response.status_code, data)
        trace.finish(error.status, error=error.message)
        return error_response(error, trace.request_id, headers)

    content_type = response.content_type
    if not content_type.startswith("text/event-stream"):
        data = await response.aread()
        await response.aclose()
        if (
            response.status_code == 200
            and content_type.startswith("application/json")
            and not data.rstrip().endswith((b"}", b"]"))
        ):  # a whole JSON answer ends with its object's brace (a list of prompts on the
            # native endpoint: an array's bracket); a cut one seldom does
            failure = _disconnected("the answer was cut short")
            trace.finish(failure.status, error=failure.message)
            return error_response(failure, trace.request_id)
        trace.finish(response.status_code, body=data)  # timings are parsed off the loop
        if rename is not None:
            data = rename.whole(data)
        return Response(
            data, status_code=response.status_code, media_type=content_type, headers=headers
        )

    headers.update({"cache-control": "no-cache", "x-accel-buffering": "no"})
    relay = RelayResponse(
        _relay(response, trace, drain, rename, stall),
        status_code=response.status_code,
        media_type="text/event-stream",
        headers=headers,
    )
    relay.close_hooks.append(partial(_abandon, response, trace))
    return relay


class RelayResponse(StreamingResponse):
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
            await self.close()

    async def close(self) -> None:
        """Run the clean-up (once): also for a stream never sent, its client gone."""
        hooks, self.close_hooks = self.close_hooks, []
        with anyio.CancelScope(shield=True):
            for hook in hooks:
                await hook()


async def _abandon(response: UpstreamResponse, trace: Trace) -> None:
    """If the relay never ran: give the connection back and record the request anyway."""
    await response.aclose()
    trace.finish(response.status_code, error=f"{CLIENT_GONE} before the stream started")


@dataclass(frozen=True, slots=True)
class _Stall:
    """How long a stream may stay silent, and the router preset to reload if it does."""

    upstream: UpstreamClient
    seconds: float | None
    preset: str | None  # None: not a router, nothing to reload

    @classmethod
    def of(cls, upstream: UpstreamClient, sent: object) -> _Stall:
        preset = sent if upstream.routes and isinstance(sent, str) else None
        return cls(upstream, upstream.stall_timeout_s, preset)

    def answered(self) -> None:
        if self.preset is not None:
            self.upstream.health.answered(self.preset)

    def stalled(self) -> OpenAIError:
        """Count the stall, reload the instance in the background, and say what happened."""
        log.warning("upstream_stalled", preset=self.preset, seconds=self.seconds)
        return self._reload(
            f"the model server sent nothing for {self.seconds:g} s in the middle of the answer; "
            "its instance is being restarted"
        )

    def stuck(self, waited_s: float, probe_s: float) -> OpenAIError:
        """``stalled``, for a request that had nothing back yet when its instance failed its
        probe."""
        log.warning("upstream_stuck", preset=self.preset, waited_s=round(waited_s, 1))
        return self._reload(
            f"the model server's instance for {self.preset} stopped answering (no reply to a "
            f"probe within {probe_s:g} s, {waited_s:.0f} s into the request); "
            "it is being restarted"
        )

    def _reload(self, message: str) -> OpenAIError:
        self.upstream.health.stalled()
        if self.preset is not None:
            self.upstream.health.reloading(self.preset)  # routed around from now on
            task = asyncio.create_task(self.upstream.unload(self.preset))
            _BACKGROUND.add(task)
            task.add_done_callback(_BACKGROUND.discard)
        return OpenAIError(504, message, "server_error", code="upstream_stalled")


_BACKGROUND: set[asyncio.Task[None]] = set()  # unloads in flight (kept from the collector)


async def _whole_characters(
    stall: _Stall, path: str, body: dict[str, Any], raw: bytes, instance: str | None
) -> tuple[UpstreamResponse, bytes | None]:
    """``_watched``; where the engine failed on a reply that ends inside a character, the
    same request again a token shorter (``quirks``)."""
    response, data = await _watched(stall, path, raw, instance)
    for _ in range(CUT_CHARACTER_TRIES):
        if not cut_character(response.status_code, data):
            break
        shorter = one_token_fewer(body)
        if shorter is None:
            break
        log.info("upstream_resend_shorter", reason="the reply ended inside a character")
        body, raw = shorter, json.dumps(shorter, ensure_ascii=False).encode()
        response, data = await _watched(stall, path, raw, instance)
    if cut_character(response.status_code, data) and one_token(body):
        log.info("upstream_answer_empty", reason="the one token ends inside a character")
        answer = empty_answer(path, body)
        kind = "application/json"
        whole = httpx.Response(200, content=answer, headers={"content-type": kind})
        return UpstreamResponse(200, kind, whole), None
    return response, data


async def _watched(
    stall: _Stall, path: str, raw: bytes, instance: str | None
) -> tuple[UpstreamResponse, bytes | None]:
    """``_open``, watched: a router instance that has not started its answer within
    ``PROBE_AFTER_S`` (or the stall bound, if shorter) is probed, and again each time that
    passes; one that does not answer the probe is stuck (a whole answer sends no byte
    before it is done, so silence alone proves nothing): the request, which has nothing
    back yet, ends as ``UpstreamStalled`` and the preset is reloaded."""
    if stall.seconds is None or stall.preset is None:
        return await _open(stall.upstream, path, raw, instance)
    started = time.perf_counter()
    every = min(PROBE_AFTER_S, stall.seconds)
    probe_s = min(PROBE_TIMEOUT_S, every)
    task = asyncio.ensure_future(_open(stall.upstream, path, raw, instance))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            if not await stall.upstream.responds(stall.preset, probe_s):
                waited_s = time.perf_counter() - started
                raise UpstreamStalled(stall.stuck(waited_s, probe_s).message)
    finally:
        if not task.done():  # stuck, or the client left: the upstream request goes too
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TunerError):
                await task


async def _chunks(response: UpstreamResponse, stall: _Stall) -> AsyncIterator[bytes]:
    """The body's chunks; after the first, a silence longer than the stall bound raises
    ``TimeoutError`` (before it, the prompt is still being read, for as long as it takes)."""
    it = response.aiter_raw().__aiter__()
    first = True
    while True:
        try:
            if first or stall.seconds is None:
                chunk = await it.__anext__()
            else:
                chunk = await asyncio.wait_for(it.__anext__(), stall.seconds)
        except StopAsyncIteration:
            return
        first = False
        yield chunk


async def _relay(
    response: UpstreamResponse,
    trace: Trace,
    drain: Drain,
    rename: ModelRename | None,
    stall: _Stall,
) -> AsyncIterator[bytes]:
    """Pass SSE bytes through (with ``rename``, each event's ``model`` renamed); end with
    an error event if upstream dies, ends the stream early (no end marker, or a router's
    "proxy error" line), or the daemon's drain bound has passed. A stream cut upstream is
    recorded as a 502 with the reason, so it teaches the tuner nothing."""
    sniffer = TimingsSniffer()
    error: str | None = CLIENT_GONE
    status = response.status_code
    try:
        failure: OpenAIError | None = None
        try:
            async for chunk in _chunks(response, stall):
                if drain.cut:
                    failure = _SHUTTING_DOWN
                    break
                sniffer.feed(chunk)
                if trace.chunks is not None:
                    trace.chunks.append(chunk)
                out = chunk if rename is None else rename.feed(chunk)
                if out:
                    yield out
            else:
                sniffer.close()
                failure = _disconnected(sniffer.stray or "no end") if sniffer.truncated else None
        except TimeoutError:
            failure = stall.stalled()
        except UpstreamDisconnected as exc:
            failure = _disconnected(str(exc))
        if rename is not None:
            yield rename.flush()
        if failure is None:
            error = None
            stall.answered()
        else:
            error = failure.message
            status = status if failure is _SHUTTING_DOWN else failure.status
            yield b"\n\n" + sse_error_event(failure)  # on a line of its own
    finally:
        with anyio.CancelScope(shield=True):
            await response.aclose()
        sniffer.close()
        if sniffer.done and error == CLIENT_GONE:
            # the client had the whole answer and closed at [DONE], before upstream's own
            # end of the response reached us (the official SDK does): not a disconnect
            error = None
        trace.finish(status, error=error or sniffer.error, timings=sniffer.timings)


_SHUTTING_DOWN = OpenAIError(
    503,
    "the server is shutting down: the answer was cut at its drain bound",
    "server_error",
    code="server_shutting_down",
)


def _disconnected(why: str) -> OpenAIError:
    return OpenAIError(
        502,
        f"the model server stopped in the middle of the answer: {why}",
        "server_error",
        code="upstream_disconnected",
    )
