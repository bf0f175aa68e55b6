"""Validation accepts what OpenAI clients send and refuses the rest with RequestError only."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import RequestError
from tuner.proxy.validation import CHAT, COMPLETIONS, ENDPOINTS, NATIVE, parse_body, validate

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ["prompt", "messages", "stream", "max_tokens", "temperature", "stop", "model", "n"]


@given(st.sampled_from(ENDPOINTS), st.dictionaries(st.sampled_from(FIELDS), json_values))
def test_any_json_object_is_accepted_or_refused_with_request_error(
    endpoint: str, body: dict[str, Any]
) -> None:
    try:
        validate(endpoint, body)
    except RequestError as exc:
        assert exc.status == 400 and exc.message


@given(st.binary(max_size=64))
def test_any_bytes_parse_or_raise_request_error(raw: bytes) -> None:
    try:
        body = parse_body(raw)
    except RequestError as exc:
        assert exc.status == 400
    else:
        assert isinstance(body, dict)


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
        (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}),
        (CHAT, {"messages": [{"role": "assistant", "content": None, "tool_calls": []}]}),
        (COMPLETIONS, {"prompt": "a", "max_tokens": -1, "stop": ["\n"], "stream": False}),
        (COMPLETIONS, {"prompt": [1, 2, 3]}),
        (COMPLETIONS, {"prompt": ["a", "b"], "temperature": 0.7, "top_p": 1}),
        (NATIVE, {"prompt": {"prompt_string": "a"}, "n_predict": 8, "cache_prompt": True}),
    ],
)
def test_valid_requests_pass(endpoint: str, body: dict[str, Any]) -> None:
    validate(endpoint, json.loads(json.dumps(body)))


def test_booleans_are_not_integers() -> None:
    with pytest.raises(RequestError) as caught:
        validate(COMPLETIONS, {"prompt": "a", "max_tokens": True})
    assert caught.value.param == "max_tokens"


def test_media_parts_are_checked_against_the_model_modalities() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, image]}]}
    validate(CHAT, body, frozenset({"vision"}))
    validate(CHAT, body, None)  # unknown: llama-server judges
    with pytest.raises(RequestError) as caught:
        validate(CHAT, body, frozenset())
    assert caught.value.code == "unsupported_modality"
    assert caught.value.param == "messages[0].content[1]"


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": ""}, {"role": "tool"}])
def test_a_message_that_is_not_the_assistants_needs_content(message: dict[str, str]) -> None:
    """Mainline llama-server refuses it with a 400; ik_llama.cpp answered it with a 500."""
    with pytest.raises(RequestError, match="non-assistant") as caught:
        validate(CHAT, {"messages": [message]})
    assert caught.value.status == 400 and caught.value.param == "messages[0]"


def test_an_assistant_message_needs_content_or_tool_calls() -> None:
    with pytest.raises(RequestError, match="'content' or 'tool_calls'") as caught:
        validate(CHAT, {"messages": [{"role": "assistant"}]})
    assert caught.value.status == 400


def test_content_parts_must_be_typed_objects() -> None:
    with pytest.raises(RequestError, match=r"messages\[0\]\.content\[0\]"):
        validate(CHAT, {"messages": [{"role": "user", "content": ["text"]}]})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tools", False),
        ("tools", [{}]),
        ("tools", [{"type": "function"}]),
        ("tools", [{"type": "function", "function": {"name": 3}}]),
        ("n_probs", -1),
        ("grammar", 5),
        ("response_format", "json"),
        ("cache_prompt", "yes"),
    ],
)
def test_structured_fields_llama_server_would_500_on_are_refused(field: str, value: object) -> None:
    """llama-server answers these with a 500; the proxy refuses them with a 400 first."""
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(RequestError) as caught:
        validate(CHAT, body)
    assert caught.value.param == field


def test_a_well_formed_tool_passes() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    validate(CHAT, {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]})
