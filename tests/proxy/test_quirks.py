"""What an engine answers otherwise, made the same by the proxy (on the fake server; the
real ik_llama.cpp: ``tests/integration/test_fuzz_real.py``): a whole answer the engine
failed to write because its reply ended inside a UTF-8 character is asked again a token
shorter, and the client gets the answer, not a 5xx."""

from __future__ import annotations

import httpx

from tests.fake_llama import FakeLlamaServer
from tests.proxy.test_app import next_record
from tuner.records import RecordStore

CUT = (
    b'{"error":{"code":500,"message":"[json.exception.type_error.316] invalid UTF-8 byte '
    b'at index 3: 0xE0","type":"server_error"}}'
)


async def test_a_reply_cut_inside_a_character_is_asked_again_a_token_shorter(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    fake.plain_error, fake.plain_error_times = (500, CUT), 2
    answer = await proxy.post("/v1/completions", json={"prompt": "\u0cf0", "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert [r["body"]["max_tokens"] for r in fake.requests] == [4, 3, 2]
    assert (await next_record(store)).status == 200


async def test_an_incomplete_character_at_the_end_is_the_same_case(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer
) -> None:
    """What ik_llama.cpp 55d3c05 said to the prompt "\u1e94" (the real fuzz run)."""
    incomplete = (
        b'{"error":{"message":"[json.exception.type_error.316] incomplete UTF-8 string; '
        b'last byte: 0xBA","type":"server_error"}}'
    )
    fake.plain_error, fake.plain_error_times = (500, incomplete), 1
    answer = await proxy.post("/v1/completions", json={"prompt": "\u1e94", "max_tokens": 16})
    assert answer.status_code == 200 and len(fake.requests) == 2


async def test_it_gives_up_after_three_shorter_tries_or_with_nothing_to_shorten(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    fake.plain_error = (500, CUT)
    answer = await proxy.post("/v1/completions", json={"prompt": "x", "max_tokens": 9})
    assert answer.status_code == 502
    assert [r["body"]["max_tokens"] for r in fake.requests] == [9, 8, 7, 6]
    fake.requests.clear()
    answer = await proxy.post("/v1/completions", json={"prompt": "x"})
    assert answer.status_code == 502 and len(fake.requests) == 1


async def test_a_single_token_inside_a_character_is_answered_with_no_text(
    proxy: httpx.AsyncClient, fake: FakeLlamaServer, store: RecordStore
) -> None:
    """ik_llama.cpp 55d3c05 on the prompt "a\\U000e9383b" (the real fuzz run): its one token
    is part of a character, so no shorter request exists; mainline answers no text."""
    fake.plain_error = (500, CUT)
    for path, body, text in (
        ("/v1/completions", {"prompt": "x", "max_tokens": 2}, lambda a: a["choices"][0]["text"]),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
            lambda a: a["choices"][0]["message"]["content"],
        ),
        ("/completion", {"prompt": "x", "n_predict": 1}, lambda a: a["content"]),
    ):
        answer = await proxy.post(path, json=body)
        assert answer.status_code == 200, (path, answer.text)
        assert text(answer.json()) == "", path
        assert (await next_record(store)).status == 200
    assert [r["body"].get("max_tokens", r["body"].get("n_predict")) for r in fake.requests] == [
        *[2, 1, 1, 1]
    ]
