"""API keys: ``Authorization: Bearer <key>`` on every route but the health checks."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from tuner.proxy.openai_errors import OpenAIError
from tuner.proxy.relay import error_response

__all__ = ["BearerAuth", "KeyRing"]


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
            401,
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            "authentication_error",
            code="invalid_api_key",
        )
        await error_response(error)(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            return False
        # compare against every key, always, in constant time per key
        return any([hmac.compare_digest(token.strip(), key) for key in self.ring.keys])
