"""The conversations bench (``tuner bench --sessions``) and its workload: identical history
for every arm, growing contexts, and the sums it reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.bench.conversation_summary import looping, messages_for, summarise
from tuner.bench.conversations import load_sessions
from tuner.bench.schedule import TUNER
from tuner.classify import classify, load_definitions
from tuner.errors import ConfigError
from tuner.settings import Settings

SESSIONS = Path(__file__).resolve().parents[2] / "benchmarks/workloads/sessions.jsonl"


def _sessions() -> list[dict[str, Any]]:
    return [json.loads(line) for line in SESSIONS.read_text().splitlines()]


def test_the_workload_is_agents_and_chats_whose_contexts_grow_past_6k_tokens() -> None:
    sessions = _sessions()
    kinds = {s["kind"] for s in sessions}
    assert kinds == {"agent", "chat"}
    agents = [s for s in sessions if s["kind"] == "agent"]
    assert len({s["system"] for s in agents}) == 1  # one system prompt all agents share
    for session in sessions:
        assert len(session["turns"]) >= 6
        final = json.dumps(messages_for(session, len(session["turns"]) - 1))
        assert len(final) >= 20_000  # about 6k tokens and more at 3-4 characters a token


def test_every_turn_re_sends_the_previous_turns_history() -> None:
    for session in _sessions():
        for turn in range(1, len(session["turns"])):
            before, now = messages_for(session, turn - 1), messages_for(session, turn)
            assert now[: len(before)] == before
            assert now[len(before)]["content"] == session["turns"][turn - 1]["assistant"]


def test_a_sessions_turns_change_class() -> None:
    """Edits, explanations and JSON lists: what moves a conversation between classes."""
    definitions = load_definitions(Settings().classes_file)
    for session in _sessions():
        keys = {
            classify({"messages": messages_for(session, t), "temperature": 0}, definitions).key
            for t in range(len(session["turns"]))
        }
        assert len(keys) >= 2, session["id"]


def test_an_answer_that_loops_is_flagged() -> None:
    assert looping("The end. " + "def f(x): return x\n" * 6)
    assert not looping("A plain answer that says one thing once and stops there.")
    assert not looping("ab" * 3)


def _row(arm: str, session: str, turn: int, **values: Any) -> dict[str, Any]:
    base = {
        "arm": arm,
        "clients": 1,
        "session": session,
        "turn": turn,
        "variant": arm,
        "cache_n": 0,
        "prompt_n": 1000,
        "prompt_ms": 2500.0,
        "predicted_n": 100,
        "predicted_ms": 2000.0,
        "wall_s": 4.6,
        "ttft_s": 2.6,
        "looping": False,
    }
    return base | values


def test_the_summary_counts_history_processed_again_and_compares_the_tuner() -> None:
    rows = []
    for arm, speed in (("none", 2000.0), ("ngram-mod", 1000.0), (TUNER, 1100.0)):
        rows.append(_row(arm, "s", 0, predicted_ms=speed))
        cached = 0 if arm == TUNER else 990  # the tuner moved its second turn
        rows.append(_row(arm, "s", 1, cache_n=cached, prompt_n=1010 - cached, predicted_ms=speed))
    walls = {(arm, 1): 10.0 for arm in ("none", "ngram-mod", TUNER)}
    found = summarise(rows, walls, ["none", "ngram-mod", TUNER])["clients_1"]["all"]
    assert found["best_static"] == "ngram-mod"
    assert found["arms"]["none"]["reprocessed_share"] == round(20 / 1010, 4)
    assert found["arms"][TUNER]["reprocessed_share"] == 1.0
    assert found["tuner_reprocessed_above_plain_pp"] == round(100 * (1 - 20 / 1010), 2)
    tuner, best = found["arms"][TUNER], found["arms"]["ngram-mod"]
    assert found["tuner_vs_best_static_time"] == round(best["total_s"] / tuner["total_s"], 3)
    assert tuner["later_prefill_s"] == 2.5 and best["decode_s"] == 2.0


def test_a_sessions_file_is_read_or_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    good = {"system": "You help.", "turns": [{"user": "Hi", "assistant": "Hello."}]}
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({**good, "id": "b"}) + "\n")
    assert [s["id"] for s in load_sessions(path)] == ["session-1", "b"]
    for bad in ({"system": "x", "turns": []}, {"turns": [{"user": "a"}]}, [1, 2]):
        path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ConfigError, match=r"s.jsonl:2"):
            load_sessions(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="no sessions"):
        load_sessions(path)
    with pytest.raises(ConfigError, match="cannot read sessions"):
        load_sessions(tmp_path / "missing.jsonl")


def _forked() -> dict[str, Any]:
    def chat(name: str, turns: int) -> dict[str, Any]:
        return {
            "system": "You help.",
            "turns": [{"user": f"{name} {t}", "assistant": "ok"} for t in range(turns)],
        }

    return {
        **chat("parent", 3),
        "id": "p",
        "fork": {"after": 1, "subagents": [chat("a", 2), chat("b", 2)]},
    }


def test_a_fork_names_its_turn_and_sub_agent_sessions(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_forked()) + "\n")
    (session,) = load_sessions(path)
    assert [s["id"] for s in session["fork"]["subagents"]] == ["p:sub0", "p:sub1"]
    for fork in ({"after": 3, "subagents": [_forked()]}, {"after": 0, "subagents": []}):
        path.write_text(json.dumps({**_forked(), "fork": fork}) + "\n")
        with pytest.raises(ConfigError, match=r"s.jsonl:1: a session needs"):
            load_sessions(path)
    broken = _forked()
    del broken["fork"]["subagents"][0]["system"]
    path.write_text(json.dumps(broken) + "\n")
    with pytest.raises(ConfigError, match=r"s.jsonl:1: not a session"):
        load_sessions(path)


async def test_sub_agents_run_at_once_after_their_turn_and_before_the_next(
    tmp_path: Path,
) -> None:
    """Both sub-agents' first turns are in flight together; the parent's turn after the
    fork waits for all of theirs; every turn is a row."""
    import asyncio

    import httpx

    from tuner.bench.conversations import _replay

    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps(_forked()) + "\n")
    sessions = load_sessions(path)
    order: list[str] = []
    in_flight: set[str] = set()
    together: list[set[str]] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        said = json.loads(request.content)["messages"][-1]["content"]
        order.append(said)
        in_flight.add(said)
        together.append(set(in_flight))
        await asyncio.sleep(0.05)
        in_flight.discard(said)
        chunk = {"choices": [{"delta": {"content": "ok"}}], "timings": {"predicted_n": 1}}
        body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async def after() -> None:
        return None

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        rows, _ = await _replay(http, "http://d", "m", sessions, 1, 8, after)
    assert order[:2] == ["parent 0", "parent 1"] and order[-1] == "parent 2"
    assert {"a 0", "b 0"} in together  # at once
    assert sorted(order[2:6]) == ["a 0", "a 1", "b 0", "b 1"]
    assert {(r["session"], r["turn"]) for r in rows} == {
        ("p", 0),
        ("p", 1),
        ("p", 2),
        ("p:sub0", 0),
        ("p:sub0", 1),
        ("p:sub1", 0),
        ("p:sub1", 1),
    }
    assert not any("error" in r for r in rows)
