"""Several choices in one request: split into one-choice bodies, answers joined in order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import RequestError
from tuner.proxy.choices import MAX_CHOICES, join_streams, join_whole, plan

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


@given(
    prompts=st.lists(st.text(max_size=5), min_size=1, max_size=4),
    n=st.integers(min_value=1, max_value=4),
)
def test_every_prompt_gets_n_choices_in_openai_order(prompts: list[str], n: int) -> None:
    body = {"prompt": prompts, "n": n, "max_tokens": 3}
    found = plan(COMPLETIONS, body)
    assert found is not None
    assert [b["prompt"] for b in found.bodies] == [p for p in prompts for _ in range(n)]
    assert all("n" not in b and b["max_tokens"] == 3 for b in found.bodies)
    assert body["n"] == n  # the client's body is left as it was


def test_one_plain_choice_is_sent_as_it_is() -> None:
    assert plan(COMPLETIONS, {"prompt": "x", "n": 1}) is None
    assert plan(CHAT, {"messages": [{"role": "user", "content": "x"}]}) is None
    assert plan("/completion", {"prompt": ["a", "b"], "n": 2}) is None  # the engine's own
    assert plan(COMPLETIONS, {"prompt": [1, 2, 3]}) is not None  # one prompt of tokens ...
    assert plan(COMPLETIONS, {"prompt": [1, 2, 3]}).bodies == ({"prompt": [1, 2, 3]},)  # type: ignore[union-attr]
    single = plan(COMPLETIONS, {"prompt": ["only"]})  # ... a list of one: its string
    assert single is not None and single.bodies == ({"prompt": "only"},)


def test_too_many_choices_are_refused_naming_n() -> None:
    with pytest.raises(RequestError) as refused:
        plan(COMPLETIONS, {"prompt": ["a", "b"], "n": MAX_CHOICES})
    assert refused.value.param == "n"


def _answer(text: str, tokens: int) -> bytes:
    usage = {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": 2 + tokens}
    choice = {"index": 0, "text": text, "finish_reason": "length"}
    return json.dumps({"id": "c", "object": "text_completion", "choices": [choice],
                       "usage": usage}).encode()  # fmt: skip


def test_whole_answers_join_indexed_with_usage_summed_and_echo() -> None:
    found = plan(COMPLETIONS, {"prompt": ["Hi", "Yo"], "echo": True})
    assert found is not None and found.echoes == ("Hi", "Yo")
    joined = json.loads(join_whole([_answer(" a", 1), _answer(" b", 2)], found.echoes))
    assert [(c["index"], c["text"]) for c in joined["choices"]] == [(0, "Hi a"), (1, "Yo b")]
    assert joined["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


async def _stream(*events: dict[str, Any] | str) -> AsyncIterator[bytes]:
    for event in events:
        data = event if isinstance(event, str) else json.dumps(event)
        raw = f"data: {data}\n\n".encode()
        yield raw[:7]  # cut anywhere: events are reassembled
        yield raw[7:]


async def test_streams_are_relayed_in_turn_with_their_index_and_one_end() -> None:
    def chunk(text: str) -> dict[str, Any]:
        return {"id": "c", "choices": [{"index": 0, "text": text}]}

    usage = {"id": "c", "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                                  "total_tokens": 3}}  # fmt: skip
    streams = [
        _stream(chunk("a"), chunk("b"), usage, "[DONE]"),
        _stream(chunk("c"), usage, "[DONE]"),
    ]
    out = b"".join([piece async for piece in join_streams(streams, ["P", None])])
    events = [e[6:] for e in out.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    decoded = [json.loads(e) for e in events[:-1]]
    texts = [(c["index"], c["text"]) for d in decoded for c in d["choices"]]
    assert texts == [(0, "P"), (0, "a"), (0, "b"), (1, "c")]
    assert decoded[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}


async def test_a_failed_choice_ends_the_joined_stream_with_its_error() -> None:
    error = {"error": {"message": "gone", "type": "server_error"}}
    streams = [_stream(error), _stream({"choices": [{"index": 0, "text": "x"}]}, "[DONE]")]
    out = b"".join([piece async for piece in join_streams(streams, [None, None])])
    assert b"gone" in out and b"[DONE]" not in out and b'"x"' not in out
