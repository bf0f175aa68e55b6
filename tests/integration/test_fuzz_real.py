"""The fuzz of tests/proxy/test_fuzz.py against the real daemon and llama-server.

Generation lengths are clamped (absent or large max_tokens / n_predict become small) so the
run stays bounded; everything else is as generated. No answer may be a 5xx.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import RunningDaemon
from tests.proxy.test_fuzz import FIELDS, ROUTES, bodies, headers, json_values

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test


def bounded(body: bytes) -> bytes:
    try:
        data: Any = json.loads(body)
    except ValueError:
        return body
    if isinstance(data, dict):
        for key in ("max_tokens", "n_predict"):
            value = data.get(key)
            if value is None or (
                isinstance(value, int) and not isinstance(value, bool) and (value > 4 or value < 0)
            ):
                data[key] = 2
        return json.dumps(data).encode()
    return body


# Mostly well-formed generation requests with arbitrary extra fields: what reaches llama-server.
text = st.text(min_size=1, max_size=40)
extras = st.dictionaries(st.sampled_from(FIELDS[4:]), json_values, max_size=4)
generation = st.one_of(
    st.tuples(st.just("/v1/completions"), st.builds(lambda p, e: {**e, "prompt": p}, text, extras)),
    st.tuples(st.just("/completion"), st.builds(lambda p, e: {**e, "prompt": p}, text, extras)),
    st.tuples(
        st.just("/v1/chat/completions"),
        st.builds(lambda p, e: {**e, "messages": [{"role": "user", "content": p}]}, text, extras),
    ),
)


def test_real_generation_requests_with_odd_fields_never_get_5xx(daemon: RunningDaemon) -> None:
    seen: list[int] = []
    with httpx.Client(base_url=daemon.url, timeout=120) as client:

        @settings(
            max_examples=300,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        @given(generation)
        def one(case: tuple[str, dict[str, Any]]) -> None:
            route, body = case
            body.pop("stream", None)  # streamed answers are checked in test_daemon
            response = client.post(route, content=bounded(json.dumps(body).encode()))
            seen.append(response.status_code)
            assert response.status_code < 500, (route, body, response.text[:500])

        one()
    assert len(seen) >= 300
    assert seen.count(200) >= 75, f"too few requests reached the model: {seen.count(200)}"


def test_real_stack_never_answers_5xx(daemon: RunningDaemon) -> None:
    seen: list[int] = []
    with httpx.Client(base_url=daemon.url, timeout=120) as client:

        @settings(
            max_examples=300,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )
        @given(st.sampled_from(ROUTES), st.sampled_from(["GET", "POST"]), bodies, headers)
        def one(route: str, method: str, body: bytes, extra: dict[str, str]) -> None:
            extra.pop("content-length", None)
            response = client.request(method, route, content=bounded(body), headers=extra)
            seen.append(response.status_code)
            assert response.status_code < 500, (route, method, body, response.text[:500])

        one()
    assert len(seen) >= 100
