"""Conversations through the real daemon: a turn stays on the instance holding its history."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import start_daemon
from tests.integration.test_daemon import records_with

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
    tuning = tmp_path / "tuning.toml"
    tuning.write_text(TUNING)
    state = tmp_path / "state"
    state.mkdir()
    running = start_daemon(state, env={"TUNER_TUNING_FILE": str(tuning), "TUNER_ENGINE": engine})
    try:
        client = openai.OpenAI(base_url=running.v1, api_key="unused", max_retries=0)
        messages: list[dict[str, str]] = [
            {"role": "user", "content": EDIT + "else identical.\n\n" + CODE}
        ]
        turns = []
        for ask in [None, EXPLAIN]:
            if ask is not None:
                messages.append({"role": "user", "content": ask})
            raw = client.chat.completions.with_raw_response.create(
                model="m",
                messages=messages,
                max_tokens=48,
                temperature=0,  # type: ignore[arg-type]
            )
            answer = raw.parse().choices[0].message.content or ""
            messages.append({"role": "assistant", "content": answer})
            turns.append(
                (raw.headers["x-spec-variant"], records_with(running, raw.headers["x-request-id"]))
            )
        (first_variant, first), (second_variant, second) = turns
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
