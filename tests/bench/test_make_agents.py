"""``benchmarks/workloads/make_agents.py``: agent sessions of 20 turns or more, past 16k
tokens, tool results as user turns and JSON tool calls as answers, two sub-agents at once."""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import pytest

from benchmarks.workloads import make_agents
from benchmarks.workloads.make_agents import agent_session, agent_system, context_chars, modules
from tuner.bench.conversations import load_sessions

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture
def found(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Path]]:
    # the module's tests are run by the script itself; here their output is a stand-in
    monkeypatch.setattr(make_agents, "test_output", lambda test: f"Ran 12 tests ({test.stem})\nOK")
    candidates = modules(STDLIB)
    if not candidates:
        pytest.skip("this Python has no test package beside its standard library")
    return candidates


def test_sessions_are_long_agents_with_a_fork_of_two(
    found: list[tuple[Path, Path]], tmp_path: Path
) -> None:
    rng = random.Random(3)
    system = agent_system(STDLIB)
    assert len(system) > 8_000  # a long shared prompt
    sessions = [agent_session(path, test, STDLIB, rng, system) for path, test in found[:3]]
    for session in sessions:
        turns = session["turns"]
        calls = [json.loads(t["assistant"]) for t in turns]
        assert all(set(c) == {"tool", "arguments"} for c in calls)
        assert calls[-1]["tool"] == "finish"
        assert calls[session["fork"]["after"]]["tool"] == "spawn_agents"
        subs = session["fork"]["subagents"]
        assert len(subs) == 2 and all(s["system"] == system for s in subs)
        assert all(json.loads(s["turns"][-1]["assistant"])["tool"] == "finish" for s in subs)
        reads = [c for c in calls if c["tool"] == "read_file"]
        assert reads and reads[0]["arguments"]["start"] == 1
    sizes = [(len(s["turns"]), context_chars(s)) for s in sessions]
    assert any(turns >= 20 and 50_000 <= chars <= 82_000 for turns, chars in sizes), sizes
    path = tmp_path / "agents.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    assert [s["id"] for s in load_sessions(path)] == [s["id"] for s in sessions]
