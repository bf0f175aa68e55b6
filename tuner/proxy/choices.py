"""Several choices in one request: ``n``, a list of prompts, ``echo``. Pure.

Neither engine answers every form (ik_llama.cpp refuses ``n > 1`` and ``echo``, and cuts a
list of prompts short), so the proxy makes one request per choice, each a plain one-prompt
request of the same class and variant, and joins their answers into the one response the
client asked for: choices indexed prompt by prompt, then ``n`` per prompt (OpenAI's order),
``usage`` summed, and with ``echo`` each choice's text after its prompt. A stream relays each
choice's events in turn with its index, one usage chunk and one ``[DONE]`` at the end.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.errors import RequestError

__all__ = ["MAX_CHOICES", "Plan", "join_streams", "join_whole", "plan"]

MAX_CHOICES = 16  # requests one client request may become: a bound on what it can queue
COMPLETIONS = "/v1/completions"
_USAGE = ("prompt_tokens", "completion_tokens", "total_tokens")


@dataclass(frozen=True, slots=True)
class Plan:
    """The one-choice bodies a request becomes, in index order, and for each the text put
    before its answer (``echo``; None: nothing)."""

    bodies: tuple[dict[str, Any], ...]
    echoes: tuple[str | None, ...]


def _prompts(endpoint: str, body: dict[str, Any]) -> list[Any]:
    """The prompts of a completions body: a list of strings or of token lists is several."""
    prompt = body.get("prompt")
    if endpoint != COMPLETIONS or not isinstance(prompt, list) or not prompt:
        return [prompt]
    if all(isinstance(p, str | list) for p in prompt):
        return list(prompt)
    return [prompt]  # one prompt of token ids


def plan(endpoint: str, body: dict[str, Any]) -> Plan | None:
    """The requests ``body`` becomes; None where it is one request as it is.

    >>> [b["prompt"] for b in plan("/v1/completions", {"prompt": ["a", "b"], "n": 2}).bodies]
    ['a', 'a', 'b', 'b']
    >>> plan("/v1/chat/completions", {"messages": [], "n": 1}) is None
    True
    """
    if endpoint == "/completion":
        return None  # llama.cpp's own endpoint: its own forms, answered as the engine does
    n = body.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1
    prompts = _prompts(endpoint, body)
    echo = endpoint == COMPLETIONS and body.get("echo") is True
    if n == 1 and not echo and not isinstance(body.get("prompt"), list):
        return None
    if n * len(prompts) > MAX_CHOICES:
        raise RequestError(
            f"'n' times the prompts asks for {n * len(prompts)} choices; at most "
            f"{MAX_CHOICES} per request",
            param="n",
        )
    one = {k: v for k, v in body.items() if k not in ("n", "echo")}
    bodies, echoes = [], []
    for prompt in prompts:
        for _ in range(n):
            bodies.append({**one, "prompt": prompt} if endpoint == COMPLETIONS else dict(one))
            echoes.append(prompt if echo and isinstance(prompt, str) else None)
    return Plan(tuple(bodies), tuple(echoes))


def _with_echo(choice: dict[str, Any], echo: str | None) -> dict[str, Any]:
    if echo is not None and isinstance(choice.get("text"), str):
        return {**choice, "text": echo + choice["text"]}
    return choice


def _sum_usage(usages: Sequence[Any]) -> dict[str, int] | None:
    found = [u for u in usages if isinstance(u, dict)]
    if not found:
        return None
    return {k: sum(int(u.get(k) or 0) for u in found) for k in _USAGE}


def join_whole(answers: Sequence[bytes], echoes: Sequence[str | None]) -> bytes:
    """One response of the answers' choices, indexed in order, with their usage summed
    (the first answer's id, model and timings).

    >>> a = b'{"id": "x", "choices": [{"index": 0, "text": "1"}], "usage": {"total_tokens": 2}}'
    >>> joined = json.loads(join_whole([a, a], ["p", None]))
    >>> [(c["index"], c["text"]) for c in joined["choices"]], joined["usage"]["total_tokens"]
    ([(0, 'p1'), (1, '1')], 4)
    """
    decoded = [json.loads(a) for a in answers]
    choices = []
    for index, (answer, echo) in enumerate(zip(decoded, echoes, strict=True)):
        for choice in answer.get("choices") or []:
            choices.append({**_with_echo(choice, echo), "index": index})
    joined = {**decoded[0], "choices": choices}
    usage = _sum_usage([a.get("usage") for a in decoded])
    if usage is not None:
        joined["usage"] = usage
    return json.dumps(joined, ensure_ascii=False).encode()


def _events(data: bytes) -> tuple[list[bytes], bytes]:
    """Whole SSE events in ``data`` and the rest (an event ends at a blank line)."""
    *events, rest = data.replace(b"\r\n", b"\n").split(b"\n\n")
    return events, rest


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


class _Joiner:
    """Rewrites one choice's events: its index, its echo first; keeps its usage back."""

    def __init__(self, echoes: Sequence[str | None]) -> None:
        self.echoes = echoes
        self.echoed: set[int] = set()
        self.usages: list[Any] = []
        self.last: dict[str, Any] | None = None  # a chunk to model the final usage chunk on
        self.failed = False  # an error event went by: the stream ends there, as one would

    def rewrite(self, index: int, event: bytes) -> bytes:
        lines = [line for line in event.split(b"\n") if line]
        data = [line for line in lines if line.startswith(b"data:")]
        if not data:
            return event + b"\n\n" if lines else b""  # comments (": ping") pass
        raw = b"".join(line[5:].strip() for line in data)
        if raw == b"[DONE]":
            return b""
        try:
            payload = json.loads(raw)
        except ValueError:
            return event + b"\n\n"
        if not isinstance(payload, dict) or "error" in payload:
            self.failed = True
            return event + b"\n\n"
        choices = payload.get("choices")
        if isinstance(choices, list) and not choices and "usage" in payload:
            self.usages.append(payload.get("usage"))
            self.last = payload
            return b""
        out = b""
        if self.echoes[index] is not None and index not in self.echoed:
            self.echoed.add(index)
            echo = {"index": index, "text": self.echoes[index], "finish_reason": None}
            out += _event({**payload, "choices": [echo]})
        if isinstance(choices, list):
            payload["choices"] = [
                {**c, "index": index} if isinstance(c, dict) else c for c in choices
            ]
        if payload.get("usage") is not None:  # usage on a choice's last chunk: summed later
            self.usages.append(payload.pop("usage"))
            self.last = payload
        return out + _event(payload)

    def end(self) -> bytes:
        usage = _sum_usage(self.usages)
        out = b""
        if usage is not None and self.last is not None:
            out += _event({**self.last, "choices": [], "usage": usage})
        return out + b"data: [DONE]\n\n"


async def join_streams(
    streams: Sequence[AsyncIterator[bytes]], echoes: Sequence[str | None]
) -> AsyncIterator[bytes]:
    """One SSE stream of the choices' streams, relayed one after the other; a choice whose
    stream failed ends it with its error event."""
    joiner = _Joiner(echoes)
    for index, stream in enumerate(streams):
        rest = b""
        async for chunk in stream:
            events, rest = _events(rest + chunk)
            out = b"".join(joiner.rewrite(index, event) for event in events)
            if out:
                yield out
        if rest.strip():
            yield joiner.rewrite(index, rest)
        if joiner.failed:
            return
    yield joiner.end()
