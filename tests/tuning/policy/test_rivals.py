"""Close rivals of a held variant and the race that serves them (pure)."""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from tuner.stats import Interval
from tuner.tuning.policy.rivals import MIN_RACED, TOP, Rival, cap, draw, judge, may_race

Z = 1.645

ratio = st.floats(0.5, 2.0)
half = st.floats(0.001, 0.3)  # the log half-width of a comparison's interval
interval = st.tuples(ratio, half).map(
    lambda t: Interval(t[0], t[0] * math.exp(-t[1]), t[0] * math.exp(t[1]))
)


@given(st.dictionaries(st.sampled_from("abcdef"), interval), st.floats(0.0, 0.3))
def test_rivals_are_those_that_may_be_faster_closest_first(
    over: dict[str, Interval], error: float
) -> None:
    found, gone = judge(over, {}, {}, error=error, z=Z, lost=set())
    names = [r.name for r in found]
    bounds = [math.log(r.ratio) + Z * r.sd for r in found]
    assert bounds == sorted(bounds, reverse=True) and all(b > 0 for b in bounds)
    for name, s in over.items():
        if s.low > 1.0:
            assert name in names  # clearly faster on the same requests: unresolved still
        if s.high < 1.0 and error == 0.0:
            assert name not in names  # clearly slower and nothing left to doubt
    assert not gone  # none of them served: none can have lost


@given(interval, st.floats(0.01, 0.3), st.integers(0, 200))
def test_serving_a_rival_only_narrows_its_doubt(over: Interval, error: float, n: int) -> None:
    def sd(served: int) -> float | None:
        found, _ = judge({"a": over}, {"a": served}, {}, error=error, z=Z, lost=set())
        return found[0].sd if found else None

    now, later = sd(n), sd(n + 1)
    if now is not None and later is not None:
        assert later < now


@given(interval, st.integers(0, 50))
def test_a_rival_lost_before_is_never_raced_again(over: Interval, served: int) -> None:
    found, gone = judge({"a": over}, {"a": served}, {}, error=0.1, z=Z, lost={"a"})
    assert found == [] and gone == set()


def test_a_rival_that_served_and_is_still_slower_has_lost_one_unserved_has_not() -> None:
    slower = Interval(0.80, 0.78, 0.82)
    for served, lost in ((0, False), (MIN_RACED - 1, False), (MIN_RACED, True)):
        found, gone = judge({"a": slower}, {"a": served}, {}, error=0.0, z=Z, lost=set())
        assert found == [] and (gone == {"a"}) == lost


def test_the_race_serves_a_rival_as_often_as_it_may_be_faster() -> None:
    """Thompson sampling: a rival priced level with the held variant is drawn about half
    the time, one priced 10 % lower with 5 % doubt about one time in 50, a sure loser never;
    of several, only the first ``TOP`` are drawn."""
    rng = random.Random(7)

    def share(rivals: list[Rival]) -> float:
        return sum(draw(rivals, rng) is not None for _ in range(4000)) / 4000

    assert 0.45 < share([Rival("a", 1.0, 0.1, 0, 0)]) < 0.55
    assert 0.005 < share([Rival("a", 0.9, 0.05, 0, 0)]) < 0.05
    assert share([Rival("a", 0.5, 0.01, 0, 0)]) == 0.0
    many = [Rival(f"r{i}", 0.5 if i < TOP else 2.0, 0.01, 0, 0) for i in range(TOP + 1)]
    assert share(many) == 0.0


@given(st.integers(0, 100_000), st.dictionaries(st.text(max_size=3), st.integers(0, 400)))
def test_the_race_spends_at_most_the_square_root_of_the_traffic(
    seen: int, raced: dict[str, int]
) -> None:
    assert cap(seen) >= MIN_RACED and cap(seen) <= max(MIN_RACED, math.sqrt(seen) + 1)
    assert may_race(seen, raced) == (sum(raced.values()) < cap(seen))
