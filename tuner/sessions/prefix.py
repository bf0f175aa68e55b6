"""A prompt as chained digests of its leading blocks, as prefix-aware routers key a cache.

Every client re-sends a conversation's whole history each turn, so the text of turn N is a
prefix of turn N+1's. The text is cut into blocks of ``BLOCK_CHARS`` characters; block i's
digest covers blocks 0..i, so two prompts share a digest only where they share everything
before it. Only full blocks are hashed: the last, partial one grows with the next turn.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from tuner.classify.prompt import is_infill
from tuner.records import requested_tokens

__all__ = ["BLOCK_CHARS", "MAX_BLOCKS", "Prompt", "prompt_of", "prompt_text"]

BLOCK_CHARS = 256  # about 64-80 tokens: a turn of a few lines still adds a block
MAX_BLOCKS = 2048  # 512k characters: beyond any context this daemon serves
_SESSION_FIELDS = ("prompt_cache_key", "user")  # OpenAI's fields that name a conversation


@dataclass(frozen=True, slots=True)
class Prompt:
    """What routing knows of a prompt: its blocks' chained digests and its length."""

    blocks: tuple[bytes, ...]
    chars: int
    session: str | None = None  # an id the client sent (header, ``prompt_cache_key``, ``user``)
    max_tokens: int | None = None


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return json.dumps(message, sort_keys=True, default=str)
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
    calls = message.get("tool_calls")
    if calls is not None:
        text += json.dumps(calls, sort_keys=True)
    return f"{message.get('role')}\x1f{text}\x1e"


def prompt_text(body: dict[str, Any]) -> str:
    """The prompt in the order the server renders it: tools, then each message (role and
    content, images and tool calls as JSON), or a completion's prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        tools = body.get("tools")
        head = json.dumps(tools, sort_keys=True) + "\x1d" if tools else ""
        return head + "".join(_message_text(m) for m in messages)
    if is_infill(body):  # rendered context files first, then the prefix: what a slot caches
        extra = json.dumps(body.get("input_extra"), sort_keys=True) if "input_extra" in body else ""
        return extra + "".join(str(body.get(k) or "") for k in ("input_prefix", "prompt"))
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _digests(text: str) -> tuple[bytes, ...]:
    out: list[bytes] = []
    previous = b""
    full = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    for i in range(full):
        block = text[i * BLOCK_CHARS : (i + 1) * BLOCK_CHARS].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=12).digest()
        out.append(previous)
    return tuple(out)


def prompt_of(body: dict[str, Any], session_header: str | None = None) -> Prompt:
    """The routing view of a validated request body (and its ``x-session-id`` header).

    >>> a = prompt_of({"prompt": "x" * 600})
    >>> b = prompt_of({"prompt": "x" * 600 + "y" * 300})
    >>> len(a.blocks), len(b.blocks), a.blocks == b.blocks[:2], a.chars
    (2, 3, True, 600)
    """
    text = prompt_text(body)
    session = session_header or next(
        (v for f in _SESSION_FIELDS if isinstance(v := body.get(f), str) and v), None
    )
    tokens = requested_tokens(body)
    limit = tokens if tokens is not None and tokens > 0 else None
    return Prompt(_digests(text), len(text), session[:200] if session else None, limit)
