"""Whether moving a turn pays (pure)."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from tuner.sessions.moves import Turn, move_cost, move_pays, move_saving

SPEED = st.floats(0.3, 4.0)
POSITIVE = st.floats(1e-3, 1e4)


@given(SPEED, st.floats(0.1, 1.0), POSITIVE, st.floats(1e-4, 1.0))
def test_moving_to_a_slower_variant_never_pays(
    held: float, slower: float, n: float, step: float
) -> None:
    assert not move_pays(0, 100.0, n, step, held, held * slower)


def test_more_history_to_process_never_makes_a_move_pay() -> None:
    checked: list[bool] = []

    @given(SPEED, SPEED, POSITIVE, st.floats(1e-4, 1.0), st.floats(0, 1e5), st.floats(1.0, 1e5))
    def check(held: float, wanted: float, n: float, step: float, extra: float, rate: float) -> None:
        assume(not move_pays(extra, rate, n, step, held, wanted))
        checked.append(True)
        assert not move_pays(extra * 2 + 1, rate, n, step, held, wanted)

    check()
    assert len(checked) >= 50  # the property was checked, not assumed away


def test_a_longer_wait_to_stay_never_stops_a_move_paying() -> None:
    checked: list[bool] = []

    @given(SPEED, SPEED, POSITIVE, st.floats(1e-4, 1.0), st.floats(0, 1e5), st.floats(-60, 60))
    def check(held: float, wanted: float, n: float, step: float, extra: float, wait: float) -> None:
        assume(move_pays(extra, 500.0, n, step, held, wanted, wait))
        checked.append(True)
        assert move_pays(extra, 500.0, n, step, held, wanted, wait + 1.0)

    check()
    assert len(checked) >= 50


def test_a_wait_to_stay_that_outweighs_the_history_moves_even_to_a_slower_variant() -> None:
    """2,000 tokens at 500 tokens/s are 4 s; behind a 10 s wait, staying costs more than
    losing 0.05x over 96 tokens."""
    assert not move_pays(2000, 500.0, 96, 1 / 40, 1.2, 1.15)
    assert move_pays(2000, 500.0, 96, 1 / 40, 1.2, 1.15, 10.0)
    assert not move_pays(2000, 500.0, 96, 1 / 40, 1.2, 1.15, 3.0)


@given(SPEED, SPEED, POSITIVE, st.floats(1e-4, 1.0))
def test_the_saving_is_the_decode_time_between_the_two_speeds(
    held: float, wanted: float, n: float, step: float
) -> None:
    saving = move_saving(n, step, held, wanted)
    assert abs(saving - (n * step / held - n * step / wanted)) <= 1e-9 * max(1.0, n * step)


def test_a_turns_extra_tokens_are_what_the_target_does_not_hold() -> None:
    turn = Turn("a", {"a": 2000.0, "b": 500.0})
    assert turn.extra("b") == 1500.0 and turn.extra("c") == 2000.0 and turn.extra("a") == 0.0
    assert move_cost(1500.0, 300.0) == 5.0 and move_cost(-3, 300.0) == 0.0
