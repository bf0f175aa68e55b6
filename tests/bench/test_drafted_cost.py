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


def test_an_arms_first_request_to_a_variant_is_apart() -> None:
    """The first request an arm sends to a variant (its instance loading) is priced apart
    from the rest, per arm: the static arm's first counts as first too."""
    rows = [row("none", "a", 50.0)]
    rows += [row("tuner", "a", 50.0, "ngram-mod.x", 0.9, 50, 40)]  # loading: slow
    rows += [row("tuner", "a", 50.0, "ngram-mod.x", 0.4, 50, 40) for _ in range(3)]
    rows += [row("challenger", "a", 50.0, "ngram-mod.x", 0.9, 50, 40)]  # its own first
    rows += [row("ngram-mod.x", "a", 50.0, "ngram-mod.x", 0.8, 50, 40)]
    rows += [row("ngram-mod.x", "a", 50.0, "ngram-mod.x", 0.4, 50, 40)]
    found = drafted_cost(rows)
    assert found["daemon"]["request:first"]["requests"] == 2
    assert found["daemon"]["request:first"]["c"] == pytest.approx(0.9)
    assert found["daemon"]["request:later"] == {"requests": 3, "c": 0.4, "drafted_per_step": 0.83}
    assert found["static"]["request:first"]["c"] == pytest.approx(0.8)
    assert found["static"]["request:later"]["c"] == pytest.approx(0.4)
