"""``benchmarks/drafted_cost.py``: the counts model's drafted-token cost, measured per variant."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.drafted_cost import drafted_cost


def row(arm: str, pid: str, base: float, variant: str = "none", c: float = 0.0,
        d: int = 0, a: int = 0, n: int = 100) -> dict[str, Any]:  # fmt: skip
    """A request of ``n`` tokens on a prompt decoding at ``base`` tok/s without speculation:
    ``d`` drafted, ``a`` accepted, each drafted token costing ``c`` steps."""
    steps = n - a + c * d
    return {"arm": arm, "id": pid, "tokens": n, "ms": 1000 * steps / base, "variant": variant,
            "drafted": d, "accepted": a}  # fmt: skip


def test_each_variant_and_spec_type_gets_back_its_cost() -> None:
    rows = []
    for pid, base in (("a", 50.0), ("b", 80.0)):
        rows += [row("none", pid, base), row("none", pid, base)]
        rows += [row("ngram-mod.x", pid, base, "ngram-mod.x", 0.3, 90, 80)]
        rows += [row("tuner", pid, base, "ngram-simple.y", 0.6, 40, 20) | {"class": pid}]
        rows += [row("tuner", pid, base, "ngram-simple.z", 0.5, 60, 30)]
        rows += [row("challenger", pid, base, "ngram-simple.z", 0.0, 0, 0)]  # drafted nothing
        rows += [row("tuner", pid, base, "none")]
    rows.append({"arm": "tuner", "id": "a", "tokens": 0, "ms": 0, "error": "boom"})
    found = drafted_cost(rows)
    static, daemon = found["static"], found["daemon"]
    assert static["ngram-mod.x"] == {"requests": 2, "c": 0.3, "drafted_per_step": 4.5}
    assert daemon["ngram-simple.y"]["c"] == pytest.approx(0.6)
    assert daemon["ngram-simple.z"]["c"] == pytest.approx(0.5)
    # the spec type: its variants' extra steps over their drafted tokens (0.54 here)
    assert daemon["type:ngram-simple"]["c"] == pytest.approx((0.6 * 40 + 0.5 * 60) / 100)
    assert daemon["type:ngram-simple"]["requests"] == 4
    # and within each class of prompts (here only y's requests name theirs)
    assert daemon["a type:ngram-simple"] == {"requests": 1, "c": 0.6, "drafted_per_step": 0.5}
    assert daemon["? type:ngram-simple"]["c"] == pytest.approx(0.5)
    assert set(found) == {"static", "daemon"}


def test_a_prompt_without_a_baseline_is_left_out() -> None:
    rows = [row("ngram-mod.x", "a", 50.0, "ngram-mod.x", 0.3, 90, 80)]
    assert drafted_cost(rows) == {}
