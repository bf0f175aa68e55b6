"""What speculation must not change, on each engine: how much of the answer comes back."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import engine_caps, plain_server
from tuner.tuning.variants import parse_name

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test

FRESH = Path(__file__).parents[2] / "benchmarks" / "workloads" / "fresh.jsonl"
MAX_TOKENS = 96


def _prompts(count: int) -> list[str]:
    items = [json.loads(line) for line in FRESH.read_text().splitlines() if line.strip()]
    return [
        item.get("prompt") or "\n".join(m["content"] for m in item["messages"])
        for item in items[::5][:count]
    ]


def _answers(url: str, prompts: list[str]) -> list[tuple[str, int, int]]:
    """Each greedy answer's text, its usage's completion tokens, and its accepted drafts."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    answers = []
    for prompt in prompts:
        done = client.completions.create(
            model="gemma",
            prompt=prompt,
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"cache_prompt": False},
        )
        timings = (done.model_extra or {}).get("timings") or {}
        assert done.usage is not None
        answers.append(
            (done.choices[0].text, done.usage.completion_tokens, timings.get("draft_n_accepted", 0))
        )
    return answers


def _tokens(url: str, text: str) -> int:
    body = {"content": text, "add_special": False}
    return len(httpx.post(url + "/tokenize", json=body, timeout=30).json()["tokens"])


def test_an_answer_that_reaches_its_length_holds_every_accepted_draft(tmp_path: Path) -> None:
    """Greedy answers of ngram-simple.n3.m16 hold every token their usage counts, also the
    ones that stop at max_tokens. ik_llama.cpp's left out the accepted drafts of their last
    round (its build counted a round's tokens before emitting them) in 6 of these 12 before
    the build's patch (``tuner.upstream.patches``). The text itself is not compared with
    the plain server's: a batched verify rounds otherwise, and on mainline 5 of these 12
    answers part from the plain ones."""
    prompts = _prompts(12)
    flags = parse_name("ngram-simple.n3.m16").flags(engine_caps())
    with plain_server(tmp_path, extra=flags) as url:
        drafted = _answers(url, prompts)
        lengths = [_tokens(url, text) for text, _, _ in drafted]
    assert sum(accepted for _, _, accepted in drafted) > 0  # it did speculate
    full = [i for i, (_, usage, _) in enumerate(drafted) if usage == MAX_TOKENS]
    assert len(full) >= 6, drafted  # most reach their length: the case under test
    for (_, usage, _), length in zip(drafted, lengths, strict=True):
        assert length >= usage - 1, (usage, length)  # re-tokenized text: +-1
