"""``benchmarks/side_by_side.py``: an arm read against its baseline, answer by answer."""

from __future__ import annotations

import pytest

from benchmarks.side_by_side import Answer, over_baseline


def test_ratios_are_geometric_means_per_answer_and_per_kind() -> None:
    base = [Answer("code", 10.0, 0, 0), Answer("code", 20.0, 0, 0), Answer("doc", 10.0, 0, 0)]
    arm = [Answer("code", 40.0, 8, 6), Answer("code", 20.0, 4, 2), Answer("doc", 5.0, 0, 0)]
    got = over_baseline(arm, base)
    assert got["by_kind"] == {"code": 2.0, "doc": 0.5}  # sqrt(4 * 1); 0.5
    assert got["ratio"] == pytest.approx((4 * 1 * 0.5) ** (1 / 3), abs=1e-3)
    assert got["alpha"] == 0.667 and got["tok_s"] == pytest.approx(21.7)
    assert over_baseline(base, base)["alpha"] is None  # nothing drafted: no acceptance


def test_answers_must_pair_with_the_baseline() -> None:
    with pytest.raises(ValueError):
        over_baseline([Answer("code", 1.0, 0, 0)], [])
