"""Fuzz the HTTP surface: 1,000+ hypothesis-built requests, no 5xx, no crash (fake upstream).

Bodies are arbitrary JSON (and arbitrary bytes) with OpenAI and llama.cpp field names mixed
in, sent to every route with random methods and headers. A healthy upstream answers every
well-formed request, so any 5xx here is the proxy's own fault.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from tests.fake_llama import FakeLlamaServer
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.records import RecordStore
from tuner.upstream.client import UpstreamClient

FIELDS = [
    "model",
    "prompt",
    "messages",
    "stream",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream_options",
    "n_predict",
    "cache_prompt",
    "n_probs",
    "grammar",
    "tools",
    "role",
    "content",
    "response_format",
    "logit_bias",
]
ROUTES = [
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/v1/models",
    "/health",
    "/ready",
    "/metrics",
    "/v1/nothing",
    "/",
]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda c: (
        st.lists(c, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), c, max_size=5)
    ),
    max_leaves=20,
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | st.text(max_size=5)},
    optional={"content": json_values},
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6).map(
        lambda v: json.dumps(v).encode()
    ),
    st.fixed_dictionaries(
        {"messages": st.lists(message, max_size=4)},
        optional={"stream": st.booleans(), "max_tokens": json_values},
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"prompt": json_values}, optional={"stream": st.booleans()}).map(
        lambda v: json.dumps(v).encode()
    ),
    st.binary(max_size=200),
)
headers = st.dictionaries(
    st.sampled_from(["content-type", "x-request-id", "authorization", "accept", "content-length"]),
    st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), max_size=30),
    max_size=3,
)


def test_no_request_gets_a_server_error(tmp_path: Any) -> None:
    fake = FakeLlamaServer()
    upstream = UpstreamClient("http://fake", transport=fake.transport(), default_model="m")
    upstream.health.answering(True)
    store = RecordStore(tmp_path / "records", linger_s=0)
    app = create_app(Backend(upstream), store, max_body_bytes=64 * 1024)
    seen: list[int] = []
    with TestClient(app, raise_server_exceptions=False) as client:

        @settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck))
        @given(
            st.sampled_from(ROUTES),
            st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
            bodies,
            headers,
        )
        def one(route: str, method: str, body: bytes, extra: dict[str, str]) -> None:
            extra.pop("content-length", None)  # a wrong length is the transport's business
            response = client.request(method, route, content=body, headers=extra)
            seen.append(response.status_code)
            assert response.status_code < 500, (route, method, body, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}

        one()
    assert len(seen) >= 1000
