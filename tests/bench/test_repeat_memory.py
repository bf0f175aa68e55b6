"""``benchmarks/repeat_memory.py``: first against later requests of the same prompts."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.repeat_memory import repeat_effect


def row(arm: str, item: int, variant: str, accepted: int, tokens: int = 100) -> dict[str, Any]:
    return {"arm": arm, "item": item, "variant": variant, "accepted": accepted,
            "tokens": tokens, "ms": 1000.0}  # fmt: skip


def test_a_table_that_remembers_rises_and_the_control_does_not() -> None:
    rows = []
    for item in range(3):
        # the tuner's ngram-mod: 40 % accepted on a prompt's first request, 80 % once seen
        rows += [row("tuner", item, "ngram-mod.match24.max16", 40)]
        rows += [row("tuner", item, "ngram-mod.match12.max16", 80) for _ in range(5)]
        rows += [row("tuner", item, "none", 0)]  # no speculation: not counted
        rows += [row("ngram-simple", item, "ngram-simple", 30) for _ in range(5)]
    rows.append({"arm": "tuner", "item": 0, "error": "boom"})
    effect = repeat_effect(rows)
    mod = effect["tuner ngram-mod"]
    assert mod["items"] == 3 and mod["requests_per_item"] == 6
    assert mod["paired_first"] == pytest.approx(0.4) and mod["paired_later"] == pytest.approx(0.8)
    assert mod["paired_later_higher"] == 3
    control = effect["ngram-simple"]
    assert control["paired_first"] == control["paired_later"] == pytest.approx(0.3)
    assert control["paired_later_higher"] == 0
    assert "tuner none" not in effect


def test_items_seen_too_few_times_are_not_paired() -> None:
    effect = repeat_effect([row("ngram-mod", 0, "ngram-mod", 50)])
    assert effect["ngram-mod"] == {"items": 1, "requests_per_item": 1, "first": 0.5}
