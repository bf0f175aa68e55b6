"""A fake llama-server behind ``httpx.MockTransport``, for the fast unit tests.

It answers the routes the proxy uses with the shapes the real server sends
(``timings`` on non-streaming bodies and on the last streamed chunk, llama.cpp
error bodies with integer codes). Knobs let a test make it fail in the ways
the real one can. The same behaviours are checked against the real server in
``tests/integration``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

TIMINGS = {
    "cache_n": 0,
    "prompt_n": 7,
    "prompt_ms": 12.5,
    "prompt_per_second": 560.0,
    "predicted_n": 4,
    "predicted_ms": 60.0,
    "predicted_per_second": 66.7,
    "draft_n": 3,
    "draft_n_accepted": 2,
}


class _Chunks(httpx.AsyncByteStream):
    def __init__(
        self,
        chunks: list[bytes],
        fail_after: int | None,
        hold: asyncio.Event | None = None,
        hold_at: int | None = None,
    ) -> None:
        self.chunks = chunks
        self.fail_after = fail_after
        self.hold, self.hold_at = hold, hold_at

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for index, chunk in enumerate(self.chunks):
            if self.fail_after is not None and index >= self.fail_after:
                raise httpx.ReadError("connection reset by peer")
            if self.hold is not None and index == self.hold_at:
                await self.hold.wait()
            yield chunk
        if self.hold is not None and self.hold_at is None:  # the end of the response: later
            await self.hold.wait()


@dataclass
class FakeLlamaServer:
    model_id: str = "fake-model"
    healthy: bool = True
    fail_stream_after: int | None = None  # chunks sent before the connection drops
    hold_stream: asyncio.Event | None = None  # a streamed answer waits for it ...
    hold_stream_at: int | None = None  # ... before this chunk (None: after [DONE], at the end)
    error: tuple[int, dict[str, Any]] | None = None  # status and body to answer with
    plain_error: tuple[int, bytes] | None = None  # ... a text body (a router's "proxy error")
    plain_error_times: int | None = None  # answer so this many times (None: always)
    # a stream's end in place of its last event and end marker (a router whose instance
    # died writes "proxy error: ..." and closes); a whole answer's body cut to this many bytes
    stream_tail: list[bytes] | None = None
    cut_body_at: int | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200 if self.healthy else 503, json={"status": "ok"})
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.model_id}]})
        if path == "/props":
            return httpx.Response(200, json={"modalities": {"vision": True, "audio": False}})
        body = json.loads(request.content)
        self.requests.append({"path": path, "body": body})
        self.raw.append(request.content)
        if self.error is not None:
            return httpx.Response(self.error[0], json=self.error[1])
        if self.plain_error is not None and self.plain_error_times != 0:
            if self.plain_error_times is not None:
                self.plain_error_times -= 1
            status, text = self.plain_error
            return httpx.Response(status, content=text, headers={"content-type": "text/plain"})
        if body.get("stream"):
            return self._stream(path, body)
        whole = json.dumps(self._answer(path, body, "Hello there")).encode()
        content = whole if self.cut_body_at is None else whole[: self.cut_body_at]
        return httpx.Response(200, content=content, headers={"content-type": "application/json"})

    def _answer(self, path: str, body: dict[str, Any], text: str) -> dict[str, Any]:
        if path == "/v1/chat/completions":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text}
            obj = "text_completion"
        choice["finish_reason"] = "length"
        return {
            "id": "cmpl-1",
            "object": obj,
            "created": 1,
            "model": body.get("model", self.model_id),
            "choices": [choice],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
            "timings": TIMINGS,
        }

    def _stream(self, path: str, body: dict[str, Any]) -> httpx.Response:
        chat = path == "/v1/chat/completions"
        chunks = [b": ping\n\n"]
        for word in ["Hel", "lo", " there"]:
            delta = {"delta": {"content": word}} if chat else {"text": word}
            chunk = {"id": "c", "model": body.get("model"), "choices": [{"index": 0, **delta}]}
            chunks.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if path == "/completion":  # llama.cpp's native stream ends with its stop chunk
            end = [
                b"data: " + json.dumps({"content": "", "stop": True, "timings": TIMINGS}).encode()
            ]
        else:
            last = {"id": "c", "choices": [], "timings": TIMINGS}
            end = [b"data: " + json.dumps(last).encode(), b"data: [DONE]"]
        chunks += [line + b"\n\n" for line in end] if self.stream_tail is None else self.stream_tail
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=_Chunks(chunks, self.fail_stream_after, self.hold_stream, self.hold_stream_at),
        )
