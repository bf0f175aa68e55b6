from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.errors import RequestError, UpstreamNotReady, UpstreamTimeout
from tuner.proxy.openai_errors import error_for_exception, translate_upstream_error


@given(st.integers(min_value=400, max_value=599), st.binary(max_size=200))
def test_any_upstream_error_body_translates_to_a_4xx_or_5xx_shape(status: int, raw: bytes) -> None:
    error = translate_upstream_error(status, raw)
    assert 400 <= error.status <= 599
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["message"]


def test_client_errors_upstream_stay_client_errors() -> None:
    assert translate_upstream_error(422, b'{"error":"bad"}').status == 422
    assert translate_upstream_error(413, b"too big").status == 413


def test_exceptions_map_by_type() -> None:
    assert error_for_exception(RequestError("x", status=413)).status == 413
    not_ready = error_for_exception(UpstreamNotReady())
    assert not_ready.status == 503 and not_ready.headers() == {"retry-after": "2"}
    assert error_for_exception(UpstreamTimeout("slow")).status == 504


def test_a_prompt_longer_than_the_context_is_the_same_400_on_both_engines() -> None:
    mainline = b'{"error":{"code":400,"message":"the request exceeds the available context size, '
    mainline += b'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":40001}}'
    # ik_llama.cpp 55d3c05 with --no-context-shift: the same words, a server error's type
    ik = b'{"error":{"code":500,"message":"the request exceeds the available context size, '
    ik += b'try increasing it","type":"server_error"}}'
    for status, raw in ((400, mainline), (500, ik)):
        error = translate_upstream_error(status, raw)
        assert (error.status, error.code) == (400, "context_length_exceeded"), raw
        assert error.body()["error"]["type"] == "invalid_request_error"
