"""The daemon answers as the llama-server it fronts, or better: the conformance suite.

Every request of ``conformance.cases()`` (made from the proxy's field table) goes to a plain
llama-server of the engine beneath the suite and to the daemon in front of that engine;
each pair is compared (``conformance.differences``). Then the requests an app, an editor or
an agent sends every day, through the official SDK, and a client that hangs up.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.integration.conformance import Answer, Case, cases, differences
from tests.integration.conftest import RunningDaemon, plain_server, start_daemon

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test


def _send(client: httpx.Client, url: str, case: Case) -> Answer:
    headers = {"content-type": "application/json"}
    try:
        return _answer(client, url, case, headers)
    except httpx.TransportError as exc:  # the server closed the connection: it died
        return Answer(0, str(exc))


def _answer(client: httpx.Client, url: str, case: Case, headers: dict[str, str]) -> Answer:
    if not case.stream:
        response = client.request(case.method, url + case.path, content=case.body, headers=headers)
        try:
            return Answer(response.status_code, response.json())
        except ValueError:
            return Answer(response.status_code, response.text)
    answer = Answer(0)
    with client.stream("POST", url + case.path, content=case.body, headers=headers) as response:
        answer.status = response.status_code
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                answer.done = True
            else:
                answer.events.append(json.loads(data))
        if response.status_code != 200:
            answer.json = answer.events[0] if answer.events else None
    return answer


@pytest.fixture(scope="module")
def pinned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningDaemon]:
    """A daemon whose every class is served without speculation: its answers are the plain
    server's tokens (the tuned daemon's are too, greedily, but later than a preset loads)."""
    state = tmp_path_factory.mktemp("pinned")
    tuning = state / "tuning.toml"
    tuning.write_text('[overrides.all]\npin = "none"\n')
    running = start_daemon(state, env={"TUNER_TUNING_FILE": str(tuning)}, owned=False)
    yield running
    running.stop()


def test_every_request_of_the_table_is_answered_as_the_engine_does_or_better(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    found: dict[str, list[str]] = {}
    with plain_server(tmp_path) as plain, httpx.Client(timeout=120) as client:
        for case in cases():
            got = differences(case, _send(client, plain, case), _send(client, daemon.url, case))
            if got:
                found[case.name] = got
    assert not found, json.dumps(found, indent=1)


def test_the_sdk_gets_choices_lengths_and_tools(daemon: RunningDaemon) -> None:
    sdk = OpenAI(base_url=daemon.v1, api_key="unused", max_retries=0)
    two = sdk.completions.create(model="any", prompt=["One", "Two"], n=2, max_tokens=3)
    assert [c.index for c in two.choices] == [0, 1, 2, 3]
    assert two.usage is not None and two.usage.completion_tokens <= 4 * 3
    messages = [{"role": "user", "content": "What time is it?"}]
    short = sdk.chat.completions.create(model="any", messages=messages, max_completion_tokens=4)  # type: ignore[arg-type]
    assert short.usage is not None and short.usage.completion_tokens <= 4
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    tools = sdk.chat.completions.create(
        model="any",
        messages=messages,
        tools=[tool],
        tool_choice="auto",
        max_tokens=4,  # type: ignore[list-item,arg-type]
    )
    assert tools.choices[0].finish_reason in ("length", "stop", "tool_calls")
    streamed = sdk.chat.completions.create(
        model="any",
        messages=messages,
        n=2,
        max_tokens=3,
        stream=True,  # type: ignore[arg-type]
    )
    assert {choice.index for chunk in streamed for choice in chunk.choices} == {0, 1}
    tokens = httpx.post(daemon.url + "/tokenize", json={"content": "hi"}, timeout=30).json()
    assert isinstance(tokens["tokens"], list) and tokens["tokens"]


def _hang_up_after(port: int, seconds: float, index: int) -> None:
    """A client that sends a request with no length and closes its socket ``seconds`` later."""
    body = json.dumps({"prompt": f"Tell a long story, number {index}.", "stream": index % 2 == 0})
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head.encode() + body.encode())
        time.sleep(seconds)


def _first_token_s(url: str) -> float:
    started = time.perf_counter()
    body = {"prompt": "Hi", "max_tokens": 2, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - started
    raise AssertionError("no token came")


def test_ten_clients_that_hang_up_leave_the_server_free(pinned: RunningDaemon) -> None:
    """Ten requests with no length, streamed and not, each abandoned after a second: the next
    request's first token comes within 2 s (it waited for all ten's generations before)."""
    _first_token_s(pinned.url)  # warm
    port = int(pinned.url.rsplit(":", 1)[1])
    clients = [threading.Thread(target=_hang_up_after, args=(port, 1.0, i)) for i in range(10)]
    for client in clients:
        client.start()
    for client in clients:
        client.join()
    assert _first_token_s(pinned.url) < 2.0
    deadline = time.monotonic() + 30  # the records reach the metrics off the request path
    while _abandoned(pinned.url) < 10 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _abandoned(pinned.url) >= 10


def _abandoned(url: str) -> float:
    metrics = httpx.get(url + "/metrics", timeout=30).text.splitlines()
    counts = [line for line in metrics if line.startswith("tuner_requests_abandoned_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in counts)
