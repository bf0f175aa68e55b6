"""Speedups and acceptance from token counts, with their intervals (pure maths)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.tuning.evidence.counts import Counts, alpha_interval, count_speedup, ratio_of_sums

Z = 1.645
costs = st.floats(min_value=0.0, max_value=2.0)
rows = st.lists(
    st.tuples(st.integers(1, 512), st.integers(0, 512), st.floats(0.0, 1.0)).map(
        lambda t: (t[0], t[1], min(t[0] - 1, round(t[1] * t[2])))  # accepted < generated
    ),
    min_size=1,
    max_size=30,
)


@given(rows, costs)
def test_count_speedup_is_the_token_weighted_formula(counts: list, c: float) -> None:
    found = count_speedup(counts, c, 0.0, Z)
    assert found is not None
    expected = sum(n for n, _, _ in counts) / sum(n - a + c * d for n, d, a in counts)
    assert found.value == pytest.approx(expected)
    assert found.low < found.value < found.high  # never a zero-width interval


@given(st.integers(1, 256), st.integers(1, 256), costs, costs)
def test_accepting_more_or_paying_less_is_faster(n: int, d: int, c: float, more: float) -> None:
    a = min(n - 1, d) // 2
    slow = count_speedup([(n, d, a)], c + more, 0.0, Z)
    fast = count_speedup([(n, d, min(n - 1, d, a + 1))], c, 0.0, Z)
    assert slow is not None and fast is not None
    assert fast.value >= slow.value


def test_no_drafts_is_exactly_no_speedup() -> None:
    found = count_speedup([(128, 0, 0)] * 5, 0.45, 0.1, Z)
    assert found is not None and found.value == 1.0


def test_the_interval_widens_with_the_spread_and_the_cost_uncertainty() -> None:
    same = [(128, 100, 80)] * 6
    spread = [(128, 100, 40), (128, 100, 95)] * 3
    tight = count_speedup(same, 0.45, 0.0, Z)
    wide = count_speedup(spread, 0.45, 0.0, Z)
    unsure = count_speedup(same, 0.45, 0.1, Z)
    assert tight is not None and wide is not None and unsure is not None
    width = [i.high / i.low for i in (tight, wide, unsure)]
    assert width[0] < width[1] and width[0] < width[2]


def test_ratio_of_sums_matches_a_direct_computation() -> None:
    x, y = [3.0, 5.0, 4.0, 9.0], [2.0, 3.0, 3.0, 5.0]
    r, se = ratio_of_sums(x, y)
    assert r == pytest.approx(21 / 13)
    resid = sum((a - r * b) ** 2 for a, b in zip(x, y, strict=True))
    assert se == pytest.approx(math.sqrt(resid / 12) / (13 / 4))
    assert ratio_of_sums([2.0], [1.0]) == (2.0, math.inf)
    with pytest.raises(ValueError):
        ratio_of_sums([], [])


def test_alpha_interval_is_per_request() -> None:
    """Two requests of 1,000 drafts each, one accepting all and one none: the binomial
    interval over 2,000 tokens would be +-2 %; the requests disagree completely."""
    found = alpha_interval([Counts(2000, 1000, 1000), Counts(2000, 1000, 0)], Z)
    assert found is not None and found.value == 0.5
    assert found.low == 0.0 and found.high == 1.0
    assert alpha_interval([Counts(20, 10, 5)], Z) is None
    assert alpha_interval([Counts(20, 0, 0), Counts(20, 0, 0), Counts(20, 10, 5)], Z) is None
