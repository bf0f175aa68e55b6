"""``benchmarks/draft_costs.py``: counts per token and a drafted token's cost, per arm."""

from __future__ import annotations

import pytest

from benchmarks.draft_costs import draft_costs


def row(arm: str, item: int, ms: float, drafted: int = 0, accepted: int = 0) -> dict[str, object]:
    return {
        "arm": arm,
        "item": item,
        "tokens": 100,
        "ms": ms,
        "drafted": drafted,
        "accepted": accepted,
    }


def test_each_arm_is_priced_in_its_own_binarys_plain_steps() -> None:
    rows = [
        row("none", 0, 1000),
        row("peer:none", 0, 500),
        # 100 tokens, 40 accepted of 80 drafted, 800 ms = 80 plain steps: c = (80-100+40)/80
        row("ngram-mod", 0, 800, 80, 40),
        # the peer's steps are 5 ms: 300 ms is 60 steps; c = (60-100+50)/50
        row("peer:auto", 0, 300, 50, 50),
        row("tuner", 0, 700, 60, 40),
        row("tuner", 1, 700, 60, 40),  # item 1: no baseline
        row("ngram-mod", 0, 0) | {"error": "timeout"},
    ]
    arms = draft_costs(rows)["arms"]
    assert set(arms) == {"ngram-mod", "peer:auto", "tuner"}
    assert arms["ngram-mod"]["cost"] == pytest.approx(0.25)
    assert arms["ngram-mod"]["steps_per_token"] == 0.8
    assert arms["peer:auto"]["cost"] == pytest.approx(0.2)
    assert arms["peer:auto"]["accepted_per_token"] == 0.5
    assert arms["tuner"]["tokens"] == 100  # the row without a baseline is left out
    for a in arms.values():  # steps = 1 - accepted + cost * drafted, per token
        assert a["steps_per_token"] == pytest.approx(
            1 - a["accepted_per_token"] + a["cost"] * a["drafted_per_token"], abs=1e-3
        )


def test_an_arm_that_never_drafted_has_no_cost() -> None:
    arms = draft_costs([row("none", 0, 1000), row("tuner", 0, 1000)])["arms"]
    assert arms["tuner"]["cost"] is None and arms["tuner"]["steps_per_token"] == 1.0
