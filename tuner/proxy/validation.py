"""Check request bodies just enough to give a clear 400 before llama-server sees them.

Fields we do not know (llama.cpp extensions such as ``cache_prompt``,
``n_probs``, ``grammar``) pass through untouched; we only check the shape of
the fields every OpenAI client sends.
"""

from __future__ import annotations

import json
from typing import Any

from tuner.errors import RequestError
from tuner.proxy.grammar import grammar_error

__all__ = ["ENDPOINTS", "INFILL", "Endpoint", "parse_body", "validate", "validate_route"]

Endpoint = str
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
NATIVE = "/completion"
INFILL = "/infill"
ENDPOINTS: tuple[Endpoint, ...] = (CHAT, COMPLETIONS, NATIVE, INFILL)


def parse_body(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body or raise ``RequestError`` saying what is wrong."""
    if not raw.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not UTF-8: {exc.reason}") from exc
    except json.JSONDecodeError as exc:
        raise RequestError(
            f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from exc
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {_kind(body)}")
    return body


def _kind(value: object) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# content part type -> the modality llama-server needs for it (``/props`` modalities)
_PART_MODALITY = {"image_url": "vision", "input_audio": "audio", "video_url": "video"}


def _check_parts(parts: list[Any], where: str, modalities: frozenset[str] | None) -> None:
    for index, part in enumerate(parts):
        here = f"{where}.content[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise RequestError(f"'{here}' must be an object with a string 'type'", param=here)
        needed = _PART_MODALITY.get(part["type"])
        if needed and modalities is not None and needed not in modalities:
            raise RequestError(
                f"'{here}' is {part['type']} input, but the served model takes no {needed} "
                "input (llama-server needs a multimodal projector, --mmproj, for it)",
                param=here,
                code="unsupported_modality",
            )


def _check_messages(messages: object, modalities: frozenset[str] | None) -> None:
    if messages is None:
        raise RequestError("'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array of messages", param="messages")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestError(f"'{where}' must be an object, not {_kind(message)}", param=where)
        if not isinstance(message.get("role"), str):
            raise RequestError(f"'{where}.role' is required and must be a string", param=where)
        content = message.get("content")
        # mainline llama-server refuses these two with a 400, ik_llama.cpp with a 500
        if content is None and message["role"] != "assistant":
            raise RequestError(
                f"'{where}.content' is required: all non-assistant messages must contain 'content'",
                param=where,
            )
        if content is None and not {"tool_calls", "function_call"} & message.keys():
            raise RequestError(
                f"'{where}': an assistant message must contain 'content' or 'tool_calls'",
                param=where,
            )
        if content is not None and not isinstance(content, str | list):
            raise RequestError(
                f"'{where}.content' must be a string or an array of parts", param=where
            )
        if isinstance(content, list):
            _check_parts(content, where, modalities)


def _check_prompt(prompt: object, endpoint: Endpoint) -> None:
    if prompt is None:
        raise RequestError("'prompt' is required", param="prompt")
    if endpoint == NATIVE:
        return  # the native endpoint also takes token arrays and multimodal objects
    if isinstance(prompt, str):
        return
    if (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(p, str) or _is_int(p) or (isinstance(p, list) and all(map(_is_int, p)))
            for p in prompt
        )
    ):
        return
    raise RequestError(
        "'prompt' must be a string, an array of strings, or an array of token ids",
        param="prompt",
    )


def _is_tool(tool: object) -> bool:
    """An OpenAI tool: a string type; a function tool names its function."""
    if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
        return False
    if tool["type"] != "function":
        return True
    function = tool.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


# field -> (check, what it must be)
_COMMON: dict[str, tuple[Any, str]] = {
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "max_tokens": (lambda v: _is_int(v) and v >= -1, "an integer >= -1"),
    "max_completion_tokens": (lambda v: _is_int(v) and v >= -1, "an integer >= -1"),
    "n_predict": (lambda v: _is_int(v) and v >= -1, "an integer >= -1"),
    "temperature": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "top_p": (lambda v: _is_number(v) and 0 <= v <= 1, "a number between 0 and 1"),
    "n": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "seed": (_is_int, "an integer"),
    "echo": (lambda v: isinstance(v, bool), "a boolean"),
    "best_of": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "suffix": (lambda v: isinstance(v, str), "a string"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "stop": (
        lambda v: (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ),
        "a string or an array of strings",
    ),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "model": (lambda v: isinstance(v, str), "a string"),
    # Structured fields llama-server answers with a 500 (not a 400) when mistyped.
    "tools": (
        lambda v: isinstance(v, list) and all(map(_is_tool, v)),
        'an array of tools like {"type": "function", "function": {"name": ...}}',
    ),
    "tool_choice": (lambda v: isinstance(v, str | dict), "a string or an object"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "json_schema": (lambda v: isinstance(v, dict), "an object"),
    "logit_bias": (lambda v: isinstance(v, dict | list), "an object or an array"),
    "grammar": (lambda v: isinstance(v, str), "a string"),
    "n_probs": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "top_k": (lambda v: _is_int(v), "an integer"),
    "min_p": (_is_number, "a number"),
    "repeat_penalty": (_is_number, "a number"),
    "presence_penalty": (_is_number, "a number"),
    "frequency_penalty": (_is_number, "a number"),
    "cache_prompt": (lambda v: isinstance(v, bool), "a boolean"),
    "logprobs": (
        lambda v: isinstance(v, bool) or (_is_int(v) and v >= 0),
        "a boolean or an integer >= 0",
    ),
    "top_logprobs": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
}


def validate(
    endpoint: Endpoint, body: dict[str, Any], modalities: frozenset[str] | None = None
) -> None:
    """Raise ``RequestError`` for the first thing wrong with ``body``.

    ``modalities`` are the non-text inputs the served model accepts (None: unknown,
    so media parts are left for llama-server to judge).
    """
    if endpoint == CHAT:
        _check_messages(body.get("messages"), modalities)
    elif endpoint == INFILL:
        _check_fields(body, _ROUTES[INFILL])
    else:
        _check_prompt(body.get("prompt"), endpoint)
    for field, (check, expected) in _COMMON.items():
        if field in body and body[field] is not None and not check(body[field]):
            raise RequestError(
                f"'{field}' must be {expected}, not {_kind(body[field])} "
                f"{json.dumps(body[field])[:40]}",
                param=field,
            )
    grammar = body.get("grammar")
    if isinstance(grammar, str) and (problem := grammar_error(grammar)):
        raise RequestError(f"'grammar' does not parse: {problem}", param="grammar")


def _text_or_list(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str | int) for x in v))


def _extra_chunk(chunk: object) -> bool:
    return isinstance(chunk, dict) and isinstance(chunk.get("text", ""), str)


_INFILL_TEXTS = ("input_prefix", "input_suffix", "prompt")
# route -> field -> (check, what it must be, required); what the engines would answer a 500
_ROUTES: dict[str, dict[str, tuple[Any, str, bool]]] = {
    "/tokenize": {"content": (_text_or_list, "a string or an array", False)},
    "/detokenize": {
        "tokens": (lambda v: isinstance(v, list) and all(map(_is_int, v)), "an array of ids", True)
    },
    # a prefix and a suffix, context chunks, an optional prompt
    INFILL: {
        **{k: (lambda v: isinstance(v, str), "a string", False) for k in _INFILL_TEXTS},
        "input_extra": (
            lambda v: isinstance(v, list) and all(map(_extra_chunk, v)),
            'an array of {"filename": ..., "text": ...}',
            False,
        ),
    },
    "/apply-template": {},
    "/embeddings": {},
    "/rerank": {
        "query": (lambda v: isinstance(v, str), "a string", True),
        "documents": (
            lambda v: isinstance(v, list) and all(isinstance(d, str) for d in v),
            "an array of strings",
            True,
        ),
    },
}
_ROUTE_ALIASES = {
    "/embedding": "/embeddings",
    "/v1/embeddings": "/embeddings",
    "/reranking": "/rerank",
    "/v1/rerank": "/rerank",
}
_EMBEDDED = ("input", "content")


def _check_fields(body: dict[str, Any], fields: dict[str, tuple[Any, str, bool]]) -> None:
    for field, (check, expected, required) in fields.items():
        if field not in body:
            if required:
                raise RequestError(f"'{field}' is required", param=field)
            continue
        if not check(body[field]):
            raise RequestError(
                f"'{field}' must be {expected}, not {_kind(body[field])}", param=field
            )


def validate_route(path: str, body: dict[str, Any]) -> None:
    """Raise ``RequestError`` for what a route that generates nothing cannot take."""
    route = _ROUTE_ALIASES.get(path, path)
    _check_fields(body, _ROUTES.get(route, {}))
    if route == "/apply-template":
        _check_messages(body.get("messages"), None)
    if route == "/embeddings":
        given = [k for k in _EMBEDDED if k in body]
        if not given:
            raise RequestError("'input' is required", param="input")
        if not _text_or_list(body[given[0]]) and not (
            isinstance(body[given[0]], list) and all(_text_or_list(x) for x in body[given[0]])
        ):
            raise RequestError(
                f"'{given[0]}' must be a string, an array of strings or of token ids",
                param=given[0],
            )
