"""Watch a server-sent-event stream go by without changing it.

``TimingsSniffer`` is fed the raw bytes exactly as they are passed to the
client and remembers the last ``timings`` object (llama-server puts it on the
last data chunk) and whether an error event was seen. Only lines that mention
``timings`` or ``error`` are parsed, so the cost per chunk stays small.
``answer_text`` reads an answer's text back (a body or kept chunks), off the loop.
``ModelRename`` is the one change made to what passes: in router mode llama-server names
the preset (the variant) in each answer's ``model``, and the client is shown the model
it was offered instead.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ModelRename", "TimingsSniffer", "answer_text", "extract_timings"]


class ModelRename:
    """Replace ``"model":"<sent>"`` (or ``"model": "<sent>"``) with the same naming
    ``shown`` in a body, or in a stream cut anywhere. Inside a JSON string the quotes would
    be escaped, so answer text never matches. A stream's chunk keeps back only a tail that
    could begin the pattern, which an SSE event's closing blank line never is.

    >>> r = ModelRename("ngram-mod.a", "gemma")
    >>> r.feed(b'data: {"model":"ngr') + r.feed(b'am-mod.a","x":1}\\n\\n') + r.flush()
    b'data: {"model":"gemma","x":1}\\n\\n'
    """

    __slots__ = ("_carry", "_pairs")

    def __init__(self, sent: str, shown: str) -> None:
        old, new = json.dumps(sent).encode(), json.dumps(shown).encode()
        self._pairs = [(b'"model":' + sep + old, b'"model":' + sep + new) for sep in (b"", b" ")]
        self._carry = b""

    def whole(self, data: bytes) -> bytes:
        for old, new in self._pairs:
            data = data.replace(old, new)
        return data

    def feed(self, chunk: bytes) -> bytes:
        data = self.whole(self._carry + chunk)
        keep = 0
        for old, _ in self._pairs:
            for k in range(min(len(old) - 1, len(data)), keep, -1):
                if data.endswith(old[:k]):
                    keep = k
                    break
        self._carry = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        out, self._carry = self._carry, b""
        return out


def extract_timings(payload: Any) -> dict[str, Any] | None:
    """The ``timings`` object of a decoded response body or chunk, if any."""
    if isinstance(payload, dict):
        timings = payload.get("timings")
        if isinstance(timings, dict):
            return timings
    return None


# the field names an SSE line may start with; anything else is not SSE (a router's
# "proxy error: ..." line written into a stream whose instance died)
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


class TimingsSniffer:
    """Incremental SSE line reader that keeps the last ``timings`` seen, whether the
    stream's end has gone by (``data: [DONE]``, or llama.cpp's native final chunk with
    ``"stop": true``), and the first line that is not SSE.

    >>> s = TimingsSniffer()
    >>> s.feed(b'data: {"content": "a"}\\n\\nproxy error: Failed to read connection')
    >>> s.close()
    >>> s.complete, s.stray
    (False, 'proxy error: Failed to read connection')
    >>> s = TimingsSniffer()
    >>> s.feed(b'data: {"content": "", "stop": true}\\n\\n')
    >>> s.complete, s.truncated
    (True, False)
    """

    __slots__ = ("_pending", "done", "error", "events", "stopped", "stray", "timings")

    def __init__(self) -> None:
        self._pending = bytearray()
        self.timings: dict[str, Any] | None = None
        self.error: str | None = None
        self.stray: str | None = None
        self.events = 0
        self.done = False
        self.stopped = False

    @property
    def complete(self) -> bool:
        """The stream's end went by: ``[DONE]``, or the native endpoint's final chunk."""
        return self.done or self.stopped

    @property
    def truncated(self) -> bool:
        """Read to its end, the stream was cut short: no end marker (or a line that is not
        SSE), and no error event of its own that says why."""
        return self.error is None and (self.stray is not None or not self.complete)

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
            if line.strip() and not line.startswith(_SSE_FIELDS) and self.stray is None:
                self.stray = line.decode("utf-8", "replace").strip()[:200]
            return
        self.events += 1
        if line[5:].strip() == b"[DONE]":
            self.done = True
            return
        if b'"timings"' not in line and b'"error"' not in line and b'"stop"' not in line:
            return
        try:
            payload = json.loads(line[5:])
        except ValueError:
            return
        timings = extract_timings(payload)
        if timings is not None:
            self.timings = timings
        if isinstance(payload, dict) and payload.get("stop") is True:
            self.stopped = True
        if isinstance(payload, dict) and "error" in payload:
            error = payload["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error)


def answer_text(body: bytes | None, chunks: list[bytes] | None) -> str | None:
    """The text of a one-choice answer: a JSON body, or the SSE chunks of a stream.

    >>> answer_text(b'{"choices": [{"message": {"content": "hi"}}]}', None)
    'hi'
    >>> chunk = b'data: {"choices": [{"delta": {"content": "%s"}}]}\\n\\n'
    >>> answer_text(None, [chunk % b"h", chunk % b"i" + b"data: [DONE]\\n"])
    'hi'
    """
    try:
        if body is not None:
            choices = json.loads(body).get("choices") or []
            if len(choices) != 1:
                return None
            choice = choices[0]
            message = choice.get("message")
            text = message.get("content") if isinstance(message, dict) else choice.get("text")
            return text if isinstance(text, str) else None
        if chunks is None:
            return None
        parts: list[str] = []
        for line in b"".join(chunks).split(b"\n"):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                if choice.get("index", 0) != 0:
                    return None
                delta = choice.get("delta")
                piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if isinstance(piece, str):
                    parts.append(piece)
        return "".join(parts)
    except (ValueError, AttributeError, TypeError):
        return None
