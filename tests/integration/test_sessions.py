"""Conversations through the real daemon: a turn stays on the instance holding its history."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import RunningDaemon, report_json, start_daemon
from tests.integration.test_daemon import records_with
from tuner.records import RequestRecord

pytestmark = pytest.mark.llama

PIN = "ngram-simple.n3.m8"
TUNING = f"""
[search.ngram-simple]
size_n = [3]
size_m = [8]

[overrides.code]
pin = "{PIN}"

[overrides.text]
pin = "none"
"""
CODE = (
    "def summarize(items):\n    total = 0\n    for item in items:\n        if item.price > 0:\n"
    "            total += item.price * item.quantity\n        else:\n"
    "            total -= item.discount\n    return total\n"
)
EDIT = "Rewrite the function below with the variable total renamed to acc. Keep everything "
EXPLAIN = "Thanks. In one plain English sentence, explain why someone would write this."


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_a_conversation_that_changes_class_stays_where_its_history_is_cached(
    tmp_path: Path, engine: str
) -> None:
    """Turn 1, a code edit, runs on the code class's pin; turn 2 asks for an explanation (a
    text class pinned to no speculation) and stays on turn 1's instance, whose cache holds the
    history (the server's own ``cache_n``); a new conversation of that text class goes to its
    pin. /metrics and the records say how each turn went. On both engines: router presets on
    mainline, the pool's instances on ik_llama.cpp (whose ``cache_n`` comes from ``n_past``)."""
    running, client = _daemon(tmp_path, TUNING, engine)
    try:
        (first_variant, first), (second_variant, second) = _converse(running, client, [EXPLAIN])
        assert first_variant == PIN and first.session == "new"
        assert first.class_key is not None and first.class_key.startswith("code/")
        assert second.class_key is not None and second.class_key.startswith("text/")
        assert second_variant == PIN and second.session == "stayed"
        assert first.timings is not None and second.timings is not None
        first_prompt = (first.timings.cache_n or 0) + (first.timings.prompt_n or 0)
        assert second.timings.cache_n is not None and second.timings.cache_n >= first_prompt - 8

        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": EXPLAIN}], max_tokens=8, temperature=0
        )
        fresh = records_with(running, raw.headers["x-request-id"])
        assert raw.headers["x-spec-variant"] == "none" and fresh.session == "new"

        text = httpx.get(running.url + "/metrics", timeout=10).text
        stayed = [
            s
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "tuner_session_turns_total" and s.labels["outcome"] == "stayed"
        ]
        assert [(s.labels["class_key"], s.value) for s in stayed] == [(second.class_key, 1.0)]
    finally:
        assert running.stop() == 0


def _daemon(tmp_path: Path, tuning: str, engine: str) -> tuple[RunningDaemon, openai.OpenAI]:
    """A daemon on ``engine`` from a fresh state with this tuning file, and a client of it."""
    path = tmp_path / "tuning.toml"
    path.write_text(tuning)
    state = tmp_path / "state"
    state.mkdir()
    running = start_daemon(state, env={"TUNER_TUNING_FILE": str(path), "TUNER_ENGINE": engine})
    return running, openai.OpenAI(base_url=running.v1, api_key="unused", max_retries=0)


def _converse(
    running: RunningDaemon, client: openai.OpenAI, asks: list[str]
) -> list[tuple[str, RequestRecord]]:
    """A code edit, then each of ``asks`` as the next turn: each turn's variant and record."""
    messages: list[dict[str, str]] = [
        {"role": "user", "content": EDIT + "else identical.\n\n" + CODE}
    ]
    turns = []
    for ask in [None, *asks]:
        if ask is not None:
            messages.append({"role": "user", "content": ask})
        raw = client.chat.completions.with_raw_response.create(
            model="m",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=48,
            temperature=0,
        )
        messages.append(
            {"role": "assistant", "content": raw.parse().choices[0].message.content or ""}
        )
        turns.append(
            (raw.headers["x-spec-variant"], records_with(running, raw.headers["x-request-id"]))
        )
    return turns


SHARED = "ngram-mod.match12.max16"  # n_max is per request on ik_llama.cpp: max64 shares it
IN_PLACE = f"""
[budget]
explore_share = 1.0

[search.ngram-mod]
n_match = [12]
n_max = [16, 64]
autotune = [0]  # ik_llama.cpp's own autotune runs on an instance of its own

[overrides.code]
pin = "{SHARED}"
"""


@pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
def test_later_turns_explore_only_on_the_instance_holding_their_history(
    tmp_path: Path, engine: str
) -> None:
    """Every request free to explore, a conversation opened on the code class's pin goes on
    with questions of another class: each later turn stays on that instance and processes
    only its new tokens. On ik_llama.cpp, whose pool runs ngram-mod's max16 and max64 on one
    instance (``n_max`` per request), the later turns also run that class's trials there,
    counted in /metrics and the report."""
    running, client = _daemon(tmp_path, IN_PLACE, engine)
    try:
        for topic in ["rivers", "bridges"]:  # the anchors: the first plain requests of all
            client.completions.create(model="m", prompt=f"Two facts about {topic}:", max_tokens=8)
        asks = [f"{EXPLAIN} Answer {n}." for n in range(1, 7)]
        turns = _converse(running, client, asks)
        assert turns[0][0] == SHARED
        trials = 0
        for (_, before), (variant, later) in pairwise(turns):
            assert later.session == "stayed", (variant, later.role)
            assert before.timings is not None and later.timings is not None
            history = (before.timings.cache_n or 0) + (before.timings.prompt_n or 0)
            assert (later.timings.cache_n or 0) >= history - 8, (variant, later.role)
            trials += later.role == "trial"
        if engine == "ik_llama.cpp":
            assert trials >= 1, [(v, r.role) for v, r in turns]
        text = httpx.get(running.url + "/metrics", timeout=10).text
        counted = sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "tuner_session_trials_total"
        )
        assert counted == trials
    finally:
        assert running.stop() == 0
    kept = sum(c.get("turns_trials", 0) for c in report_json(running.state_dir)["classes"])
    assert kept == trials
