"""The conformance suite's requests, made from the proxy's field table, and how two answers
to one request compare (a plain llama-server's and the daemon's in front of one). Pure.

Each row of ``tuner.proxy.fields.FIELDS`` gives a request per route it is read on (its
sample value), and one with its bad value; the routes that generate nothing, streams and
malformed bodies follow. A field added to the table is tested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tuner.proxy.fields import CHAT, COMPLETIONS, FIELDS, NATIVE, Treatment

__all__ = ["Answer", "Case", "cases", "differences"]

BASE: dict[str, dict[str, Any]] = {
    CHAT: {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0},
    COMPLETIONS: {"prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0},
    NATIVE: {"prompt": "def add(a, b):", "n_predict": 4, "temperature": 0},
}
# what a field's sample needs beside it to mean anything
WITH: dict[str, dict[str, Any]] = {"top_logprobs": {"logprobs": True}}
LENGTHS = ("max_tokens", "n_predict")


@dataclass(frozen=True)
class Case:
    """One request, and what the daemon owes its client: ``same`` (as the plain server, or
    better: a 4xx where it says 5xx), ``ok`` (a 2xx whatever the engine says: the table's
    deliberate differences), or ``refused`` (a 400 naming ``param``)."""

    name: str
    method: str
    path: str
    body: bytes | None
    expect: str = "same"
    param: str | None = None
    stream: bool = False
    max_completion: int | None = None  # the answer's length may not pass this
    shaped: bool = True  # its 2xx has the plain server's keys (False: a difference documented)


@dataclass
class Answer:
    status: int
    json: Any = None
    events: list[Any] = field(default_factory=list)  # a stream's data events, decoded
    done: bool = False  # the stream ended with [DONE]


def _encoded(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _field_cases() -> list[Case]:
    out = []
    for f in FIELDS:
        for path in (CHAT, COMPLETIONS, NATIVE):
            if path not in f.endpoints:
                continue
            body = {**BASE[path], **WITH.get(f.name, {}), f.name: f.sample}
            limit = None
            if f.treatment is Treatment.LENGTH:
                body = {k: v for k, v in body.items() if k not in LENGTHS}
                limit = f.sample
            expect = "same" if f.treatment is Treatment.SENT else "ok"
            stream = f.name == "stream"
            out.append(
                Case(f"{f.name}@{path}", "POST", path, _encoded(body), expect, None, stream, limit)
            )
        if f.bad is not None:
            path = next(p for p in (CHAT, COMPLETIONS, NATIVE) if p in f.endpoints)
            if f.name == "prompt":
                path = COMPLETIONS  # the native endpoint takes any prompt object
            body = {**BASE[path], f.name: f.bad}
            out.append(
                Case(f"{f.name}=bad@{path}", "POST", path, _encoded(body), "refused", f.name)
            )
    return out


def _stream_cases() -> list[Case]:
    out = []
    for path in (CHAT, COMPLETIONS, NATIVE):
        body = {**BASE[path], "stream": True}
        out.append(Case(f"stream@{path}", "POST", path, _encoded(body), stream=True))
        if path != NATIVE:
            usage = {**body, "stream_options": {"include_usage": True}, "n": 2}
            out.append(Case(f"stream-n2@{path}", "POST", path, _encoded(usage), "ok", stream=True))
    return out


def _route_cases() -> list[Case]:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    posts = [
        ("/tokenize", {"content": "hello world"}),
        ("/tokenize", {"content": "hi", "add_special": True, "with_pieces": True}),
        ("/detokenize", {"tokens": [1, 2, 3]}),
        ("/apply-template", chat),
        ("/v1/embeddings", {"input": "hi"}),
        ("/embeddings", {"content": "hi"}),
    ]
    out = [Case(f"{path}#{i}", "POST", path, _encoded(b)) for i, (path, b) in enumerate(posts)]
    out.append(Case("GET /props", "GET", "/props", None))
    # the daemon's own liveness (ik_llama.cpp's counts its slots; /ready is the upstream's)
    out.append(Case("GET /health", "GET", "/health", None, shaped=False))
    # the model in OpenAI's shape only: mainline adds an Ollama-style list (docs/operations.md)
    out.append(Case("GET /v1/models", "GET", "/v1/models", None, "ok", shaped=False))
    bad = [
        ("empty body", CHAT, b""),
        ("not json", COMPLETIONS, b"{nope"),
        ("an array", NATIVE, b"[1, 2]"),
        ("no messages", CHAT, b'{"max_tokens": 2}'),
        ("no prompt", COMPLETIONS, b'{"max_tokens": 2}'),
        ("detokenize text", "/detokenize", b'{"tokens": "1 2"}'),
        ("template of nothing", "/apply-template", b'{"messages": []}'),
    ]
    out += [Case(f"bad: {name}", "POST", path, raw, "refused") for name, path, raw in bad]
    return out


def cases() -> list[Case]:
    """Every request; ``/infill`` last: ik_llama.cpp 55d3c05 dies on it where the model has
    no fill-in-the-middle tokens (Gemma 3 has none), so a plain server answers nothing after."""
    infill = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "n_predict": 4}
    last = Case("/infill", "POST", "/infill", _encoded(infill))
    return [*_field_cases(), *_stream_cases(), *_route_cases(), last]


def _shape(value: Any) -> Any:
    """Keys and value types, recursively for objects (a list's first item)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return (
        "number"
        if isinstance(value, int | float) and not isinstance(value, bool)
        else (type(value).__name__)
    )


def _answer_shape(answer: Any) -> Any:
    """What a 2xx answer must share with the plain server's: top-level keys and types, and
    each choice's keys (their content is the model's; ``timings`` and ``usage`` are counts)."""
    if not isinstance(answer, dict):
        return _shape(answer)
    shape = {k: ("object" if isinstance(v, dict) else _shape(v)) for k, v in answer.items()}
    choices = answer.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        shape["choices"] = sorted(choices[0])
    return shape


def _finish(answer: Any) -> set[Any]:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    return {c.get("finish_reason") for c in choices or [] if isinstance(c, dict)}


def differences(case: Case, plain: Answer, daemon: Answer) -> list[str]:
    """What the daemon answered worse than the plain server, or otherwise than it owes."""
    out = _status_differences(case, plain, daemon)
    if case.expect == "refused" or out or daemon.status != 200 or plain.status != 200:
        return out
    if not case.shaped:
        return out
    if case.stream:
        return _stream_differences(plain, daemon)
    if case.expect == "ok" and not isinstance(plain.json, dict):
        return out  # ik_llama.cpp answers a list of prompts with a list: the daemon, OpenAI's
    if _answer_shape(plain.json) != _answer_shape(daemon.json):
        out.append(f"shape {_answer_shape(daemon.json)}, plain {_answer_shape(plain.json)}")
    if case.expect == "same" and _finish(plain.json) != _finish(daemon.json):
        out.append(f"finish_reason {_finish(daemon.json)}, plain {_finish(plain.json)}")
    return out + _usage_differences(case, daemon.json)


def _status_differences(case: Case, plain: Answer, daemon: Answer) -> list[str]:
    out: list[str] = []
    if daemon.status >= 500:
        out.append(f"daemon answered {daemon.status}")
    if case.expect == "refused":
        error = daemon.json.get("error") if isinstance(daemon.json, dict) else None
        if daemon.status != 400 or not isinstance(error, dict):
            out.append(f"a 400 was owed, got {daemon.status}")
        elif case.param is not None and error.get("param") != case.param:
            out.append(f"param {error.get('param')!r}, not {case.param!r}")
    if case.expect == "ok" and daemon.status != 200:
        out.append(f"a 2xx was owed, got {daemon.status}: {daemon.json}")
    if case.expect == "same" and plain.status:  # 0: the plain server died on it
        klass = (plain.status // 100, daemon.status // 100)
        if klass[0] != klass[1] and klass != (5, 4):
            out.append(f"status {daemon.status}, the plain server's {plain.status}")
    return out


def _usage_differences(case: Case, answer: Any) -> list[str]:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return []
    out = []
    if usage.get("total_tokens") != usage.get("prompt_tokens", 0) + usage.get(
        "completion_tokens", 0
    ):
        out.append(f"usage does not add up: {usage}")
    per_choice = usage.get("completion_tokens", 0) / max(len(answer.get("choices") or [1]), 1)
    if case.max_completion is not None and per_choice > case.max_completion:
        out.append(f"{usage['completion_tokens']} completion tokens past {case.max_completion}")
    return out


def _stream_differences(plain: Answer, daemon: Answer) -> list[str]:
    out = []
    if plain.done != daemon.done:
        out.append(f"[DONE] at the end: daemon {daemon.done}, plain {plain.done}")
    keys = {k for e in plain.events if isinstance(e, dict) for k in e}
    mine = {k for e in daemon.events if isinstance(e, dict) for k in e}
    if keys != mine:
        out.append(f"event keys {sorted(mine)}, plain {sorted(keys)}")
    return out
