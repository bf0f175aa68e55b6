"""``benchmarks/process_spread.py``: identical llama-server processes against each other."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.process_spread import quarter_means, spread


def test_a_process_slower_in_one_quarter_reads_slower_there_only() -> None:
    """Two processes, eight rounds: the first takes 30 ms a token in the first quarter and
    20 after, the second always 20: 1.2 and 0.8 in the first quarter, 1.0 after."""
    first = [30.0, 30.0] + [20.0] * 6
    second = [20.0] * 8
    assert spread([first, second]) == [[1.2, 1.0, 1.0, 1.0], [0.8, 1.0, 1.0, 1.0]]


def test_rounds_beyond_the_shortest_process_are_left_out() -> None:
    assert spread([[10.0] * 4 + [99.0], [10.0] * 4], parts=2) == [[1.0, 1.0], [1.0, 1.0]]


@given(
    st.lists(st.lists(st.floats(1.0, 100.0), min_size=8, max_size=8), min_size=2, max_size=5),
    st.floats(0.5, 2.0),
)
def test_spread_is_relative_and_averages_to_one(times: list[list[float]], scale: float) -> None:
    found = spread(times)
    for q in range(4):
        assert sum(p[q] for p in found) / len(found) == pytest.approx(1.0, abs=0.01)
    # the same run on a machine `scale` times as fast reads the same
    scaled = spread([[t * scale for t in p] for p in times])
    for mine, theirs in zip(scaled, found, strict=True):
        assert mine == pytest.approx(theirs, abs=0.0015)  # each rounded to 3 places


def test_quarter_means_average_the_processes_per_quarter() -> None:
    """Two processes at 20 and 30 ms a token, the machine twice as slow in the second half:
    25 in the first two quarters, 50 in the last two."""
    first = [20.0] * 4 + [40.0] * 4
    second = [30.0] * 4 + [60.0] * 4
    assert quarter_means([first, second]) == [25.0, 25.0, 50.0, 50.0]
