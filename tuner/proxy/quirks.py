"""What an engine answers otherwise than mainline llama.cpp, told apart here so that the
proxy answers the same on each (pure: an answer or a body in, a verdict or a body out).

- A reply whose last token ends inside a UTF-8 character: mainline drops the partial
  character; ik_llama.cpp 55d3c05 throws writing the JSON of a whole (not streamed)
  answer and says 500. The same request one token shorter ends on a character boundary
  within three tries (a character is at most four bytes). A one-token reply that is part
  of a character cannot be shortened: mainline answers it with no text, so the proxy
  writes that answer (``empty_answer``).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

__all__ = ["CUT_CHARACTER_TRIES", "cut_character", "empty_answer", "one_token", "one_token_fewer"]

CUT_CHARACTER_TRIES = 3
# nlohmann::json's type_error.316 ("invalid UTF-8 byte ...", "incomplete UTF-8 string ..."),
# as ik_llama.cpp reports it
_CUT = b"type_error.316"
_LENGTHS = ("n_predict", "max_tokens", "max_completion_tokens")


def cut_character(status: int, data: bytes | None) -> bool:
    """Whether an error answer is the engine failing on a reply cut inside a character.

    >>> cut_character(500, b'{"error":{"message":"[json.exception.type_error.316] incomplete'
    ...     b' UTF-8 string; last byte: 0xBA"}}')
    True
    >>> cut_character(500, b'{"error":{"message":"out of memory"}}')
    False
    """
    return status == 500 and data is not None and _CUT in data


def one_token_fewer(body: dict[str, Any]) -> dict[str, Any] | None:
    """A copy of ``body`` asking for one token fewer; None where it sets no length (or one
    token), as there is nothing to shorten.

    >>> one_token_fewer({"prompt": "x", "max_tokens": 4})
    {'prompt': 'x', 'max_tokens': 3}
    >>> one_token_fewer({"prompt": "x"}) is None
    True
    """
    found = _length(body)
    if found is None or found[1] <= 1:
        return None
    return {**body, found[0]: found[1] - 1}


def one_token(body: dict[str, Any]) -> bool:
    """Whether the request asks for a single token (the engine reads the first length set)."""
    found = _length(body)
    return found is not None and found[1] == 1


def _length(body: dict[str, Any]) -> tuple[str, int] | None:
    for field in _LENGTHS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool):
            return field, value
    return None


def empty_answer(path: str, body: dict[str, Any]) -> bytes:
    """The answer mainline gives a request whose one generated token is part of a
    character: no text, stopped at its length, in the shape of the endpoint asked.

    >>> json.loads(empty_answer("/v1/completions", {"model": "m"}))["choices"][0]["text"]
    ''
    """
    model = body.get("model") if isinstance(body.get("model"), str) else ""
    if path == "/completion":
        answer: dict[str, Any] = {
            "content": "",
            "stop": True,
            "model": model,
            "tokens_predicted": 1,
            "stopped_eos": False,
            "stopped_word": False,
            "stopped_limit": True,
        }
        return json.dumps(answer).encode()
    chat = path.endswith("/chat/completions")
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": ""}
    else:
        choice["text"] = ""
    answer = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
    }
    return json.dumps(answer).encode()
