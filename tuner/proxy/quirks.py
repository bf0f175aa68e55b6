"""What an engine answers otherwise than mainline llama.cpp, told apart here so that the
proxy answers the same on each (pure: an answer or a body in, a verdict or a body out).

- A reply whose last token ends inside a UTF-8 character: mainline drops the partial
  character; ik_llama.cpp 55d3c05 throws writing the JSON of a whole (not streamed)
  answer and says 500. The same request one token shorter ends on a character boundary
  within three tries (a character is at most four bytes).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CUT_CHARACTER_TRIES", "cut_character", "one_token_fewer"]

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
    for field in _LENGTHS:
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return {**body, field: value - 1}
    return None
