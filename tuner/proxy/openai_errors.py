"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}``.

Exceptions are mapped by type (``error_for_exception``); llama-server's own
error bodies (``{"error": {"code": <int>, "message", "type"}}``) are translated
by ``translate_upstream_error``. Client mistakes always come out as 4xx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tuner.errors import RequestError, UpstreamNotReady, UpstreamStalled, UpstreamTimeout

__all__ = [
    "OpenAIError",
    "error_for_exception",
    "sse_error_event",
    "translate_upstream_error",
]


@dataclass(frozen=True, slots=True)
class OpenAIError:
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after)} if self.retry_after is not None else {}


# what llama-server's router writes when the instance it forwarded to fails
ROUTER_PROXY_ERROR = "proxy error:"


def error_for_exception(exc: Exception) -> OpenAIError:
    """Map one of our exceptions to the error a client sees."""
    if isinstance(exc, RequestError):
        return OpenAIError(exc.status, exc.message, param=exc.param, code=exc.code)
    if isinstance(exc, UpstreamNotReady):
        return OpenAIError(
            503, str(exc), "server_error", code="upstream_not_ready", retry_after=exc.retry_after
        )
    if isinstance(exc, UpstreamStalled):
        return OpenAIError(504, str(exc), "server_error", code="upstream_stalled")
    if isinstance(exc, UpstreamTimeout):
        return OpenAIError(504, str(exc), "server_error", code="upstream_timeout")
    return OpenAIError(502, f"upstream error: {exc}", "server_error", code="upstream_error")


# llama-server error type -> (HTTP status, OpenAI type, OpenAI code)
_UPSTREAM_TYPES: dict[str, tuple[int, str, str | None]] = {
    "invalid_request_error": (400, "invalid_request_error", None),
    "exceed_context_size_error": (400, "invalid_request_error", "context_length_exceeded"),
    "not_supported_error": (400, "invalid_request_error", "not_supported"),
    "not_found_error": (404, "invalid_request_error", "not_found"),
    "authentication_error": (401, "authentication_error", None),
    "permission_error": (403, "permission_error", None),
    "unavailable_error": (503, "server_error", "upstream_not_ready"),
}


# what an engine says with a server error's type for a client's mistake: (text, mapping);
# ik_llama.cpp 55d3c05 on a prompt longer than the context (mainline: its own type)
_UPSTREAM_MESSAGES: tuple[tuple[str, tuple[int, str, str | None]], ...] = (
    ("exceeds the available context size", _UPSTREAM_TYPES["exceed_context_size_error"]),
)


def translate_upstream_error(status: int, raw: bytes) -> OpenAIError:
    """Turn a llama-server error response into the OpenAI shape."""
    message = raw.decode(errors="replace").strip()[:2000] or f"upstream answered {status}"
    upstream_type: str | None = None
    try:
        error = json.loads(raw)["error"]
        if isinstance(error, dict):
            message = str(error.get("message") or message)
            upstream_type = error.get("type") if isinstance(error.get("type"), str) else None
        elif isinstance(error, str):
            message = error
    except (ValueError, KeyError, TypeError):
        pass
    mapped = _UPSTREAM_TYPES.get(upstream_type or "") or next(
        (m for text, m in _UPSTREAM_MESSAGES if text in message), None
    )
    if mapped is not None:
        mapped_status, openai_type, code = mapped
        retry = 2 if mapped_status == 503 else None
        return OpenAIError(mapped_status, message, openai_type, code=code, retry_after=retry)
    if 400 <= status < 500:
        return OpenAIError(status, message, "invalid_request_error")
    if status == 503:
        return OpenAIError(503, message, "server_error", code="upstream_not_ready", retry_after=2)
    if message.startswith(ROUTER_PROXY_ERROR):  # the router lost the instance it asked
        return OpenAIError(502, message, "server_error", code="upstream_disconnected")
    return OpenAIError(502, message, "server_error", code="upstream_error")


def sse_error_event(error: OpenAIError) -> bytes:
    """The SSE event that ends a stream which failed half-way."""
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"
