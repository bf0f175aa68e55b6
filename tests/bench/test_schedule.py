from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from tuner.bench.schedule import CHALLENGER, TUNER, schedule, tuner_stream


@given(
    n_items=st.integers(1, 12),
    arms=st.integers(1, 5),
    requests=st.integers(0, 60),
    repeats=st.integers(1, 3),
    seed=st.integers(0, 5),
)
def test_every_cell_once_and_the_stream_in_full(
    n_items: int, arms: int, requests: int, repeats: int, seed: int
) -> None:
    names = ["none", *(f"v{i}" for i in range(arms - 1))]
    steps = schedule(n_items, names, requests=requests, repeats=repeats, seed=seed)
    cells = Counter((s.arm, s.item, s.repeat) for s in steps if s.arm != TUNER)
    assert set(cells.values()) == {1}
    assert len(cells) == n_items * len(names) * repeats
    stream = [s for s in steps if s.arm == TUNER]
    assert [s.repeat for s in stream] == list(range(requests))
    assert steps == schedule(n_items, names, requests=requests, repeats=repeats, seed=seed)


def test_the_arms_of_one_item_run_back_to_back_and_spread_through_the_stream() -> None:
    names = ["none", "a", "b"]
    steps = schedule(10, names, requests=100, repeats=1, seed=3)
    matrix = [(i, s) for i, s in enumerate(steps) if s.arm != TUNER]
    for k in range(0, len(matrix), 3):
        block = matrix[k : k + 3]
        assert len({s.item for _, s in block}) == 1  # one item's arms together
        assert block[-1][0] - block[0][0] == 2  # and nothing in between
    positions = [i for i, _ in matrix]
    assert positions[0] < len(steps) * 0.2 and positions[-1] > len(steps) * 0.8


@given(
    n_items=st.integers(1, 12),
    requests=st.integers(1, 60),
    repeats=st.integers(1, 3),
    challenger=st.booleans(),
    seed=st.integers(0, 5),
)
def test_each_block_runs_beside_a_tuner_request_of_its_item(
    n_items: int, requests: int, repeats: int, challenger: bool, seed: int
) -> None:
    """Where the stream meets an item at least as often as the matrix repeats it, each of
    its blocks runs right before or right after the daemons' request(s) of that item, at a
    different occurrence for each repeat, so the drift between them is a few requests'."""
    names = ["none", "a", "b"]
    steps = schedule(
        n_items, names, requests=requests, repeats=repeats, seed=seed, challenger=challenger
    )
    daemons = 2 if challenger else 1
    occurrences = Counter(s.item for s in steps if s.arm == TUNER)
    where: dict[tuple[int, int], list[int]] = {}
    for i, step in enumerate(steps):
        if step.arm not in (TUNER, CHALLENGER):
            where.setdefault((step.item, step.repeat), []).append(i)
    beside: dict[int, set[int]] = {}
    for (item, _), at in where.items():
        assert at == list(range(at[0], at[0] + len(names)))  # back to back
        if occurrences[item] < repeats:
            continue
        near = [*steps[max(0, at[0] - daemons) : at[0]], *steps[at[-1] + 1 : at[-1] + 1 + daemons]]
        mine = [s.repeat for s in near if s.arm == TUNER and s.item == item]
        assert mine
        beside.setdefault(item, set()).update(mine)
    for ks in beside.values():
        assert len(ks) >= repeats  # each repeat beside an occurrence of its own


def test_the_tuner_sees_every_item_once_per_cycle() -> None:
    import random

    stream = tuner_stream(5, 23, random.Random(1))
    assert len(stream) == 23
    for start in range(0, 20, 5):
        assert sorted(stream[start : start + 5]) == [0, 1, 2, 3, 4]
    assert tuner_stream(0, 10, random.Random(1)) == []


@given(requests=st.integers(0, 40), seed=st.integers(0, 5))
def test_a_challenger_gets_the_tuner_s_stream_side_by_side(requests: int, seed: int) -> None:
    """Each tuner request is paired with the challenger's of the same item, back to back in
    either order; without the challenger the schedule is the one it was."""
    names = ["none", "v"]
    plain = schedule(7, names, requests=requests, repeats=1, seed=seed)
    both = schedule(7, names, requests=requests, repeats=1, seed=seed, challenger=True)
    assert [s for s in both if s.arm != CHALLENGER] == plain
    index = {(s.arm, s.repeat): i for i, s in enumerate(both) if s.arm in (TUNER, CHALLENGER)}
    for k in range(requests):
        a, b = index[(TUNER, k)], index[(CHALLENGER, k)]
        assert abs(a - b) == 1 and both[a].item == both[b].item
    firsts = [s.arm for s in both if s.arm in (TUNER, CHALLENGER)][0::2]
    if requests >= 20:
        assert TUNER in firsts and CHALLENGER in firsts  # neither always goes first


@given(n_items=st.integers(1, 8), baseline=st.integers(1, 4), seed=st.integers(0, 5))
def test_the_baseline_can_be_measured_more_often_than_the_other_arms(
    n_items: int, baseline: int, seed: int
) -> None:
    names = ["none", "a", "b"]
    steps = schedule(n_items, names, requests=10, repeats=2, seed=seed, baseline=baseline)
    cells = Counter((s.arm, s.item) for s in steps if s.arm != TUNER)
    assert cells == {
        (arm, i): 2 * (baseline if arm == "none" else 1) for arm in names for i in range(n_items)
    }
    if baseline == 1:  # the default: the schedule it was
        assert steps == schedule(n_items, names, requests=10, repeats=2, seed=seed)
