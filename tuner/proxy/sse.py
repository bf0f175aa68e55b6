"""Watch a server-sent-event stream go by without changing it.

``TimingsSniffer`` is fed the raw bytes exactly as they are passed to the
client and remembers the last ``timings`` object (llama-server puts it on the
last data chunk) and whether an error event was seen. Only lines that mention
``timings`` or ``error`` are parsed, so the cost per chunk stays small.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["TimingsSniffer", "extract_timings"]


def extract_timings(payload: Any) -> dict[str, Any] | None:
    """The ``timings`` object of a decoded response body or chunk, if any."""
    if isinstance(payload, dict):
        timings = payload.get("timings")
        if isinstance(timings, dict):
            return timings
    return None


class TimingsSniffer:
    """Incremental SSE line reader that keeps the last ``timings`` seen."""

    __slots__ = ("_pending", "error", "events", "timings")

    def __init__(self) -> None:
        self._pending = bytearray()
        self.timings: dict[str, Any] | None = None
        self.error: str | None = None
        self.events = 0

    def feed(self, chunk: bytes) -> None:
        if b"\n" not in chunk:
            self._pending += chunk
            return
        self._pending += chunk
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        for line in lines:
            self._line(line.rstrip(b"\r"))

    def close(self) -> None:
        """Handle a last line that had no newline."""
        if self._pending:
            self._line(bytes(self._pending))
            self._pending.clear()

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        self.events += 1
        if b'"timings"' not in line and b'"error"' not in line:
            return
        try:
            payload = json.loads(line[5:])
        except ValueError:
            return
        timings = extract_timings(payload)
        if timings is not None:
            self.timings = timings
        if isinstance(payload, dict) and "error" in payload:
            error = payload["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error)
