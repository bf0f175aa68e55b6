"""What one proxied request has done so far; it becomes the request's ``RequestRecord``.

Building the record, its log line and the offer of the answer to the replayer happen in
the record writer's thread (``RecordStore.submit``), never on the event loop.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tuner.logs import get_logger
from tuner.proxy.sse import answer_text, extract_timings
from tuner.records import RecordStore, RequestRecord, Timings, requested_tokens

__all__ = ["Keep", "Trace"]

log = get_logger(__name__)

# takes an answered request: its record, endpoint, body and answer text
Keep = Callable[[RequestRecord, str, dict[str, Any], str], object]


@dataclass(slots=True)
class Trace:
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
    session: str | None = None
    prompt_chars: int | None = None
    wait_ms: float | None = None
    active: int | None = None  # generation requests in flight as it arrived, itself included
    batch: int | None = None  # its variant's requests in flight as it was sent, itself included
    engine: str | None = None  # the llama-server engine it was sent to
    finished: bool = False
    error: str | None = None  # what it finished with, for the second try's caller
    # Replayer replays: who gets the answered request (with its body and text)
    keep: Keep | None = None
    request_body: dict[str, Any] | None = None
    chunks: list[bytes] | None = None  # a stream's raw bytes, kept while ``keep`` is set

    def note_body(self, body: dict[str, Any]) -> None:
        self.stream = body.get("stream") is True
        model, temp = body.get("model"), body.get("temperature")
        self.model = model if isinstance(model, str) else None
        self.max_tokens = requested_tokens(body)
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
        self.finished, self.error = True, error
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
            active=self.active,
            batch=self.batch,
            class_key=self.class_key,
            features=self.features,
            variant=self.variant,
            role=self.role,
            trial=self.trial,
            session=self.session,
            prompt_chars=self.prompt_chars,
            engine=self.engine,
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
