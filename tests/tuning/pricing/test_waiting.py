"""Whether waiting at the CPU gate for a class's variant pays (``tuner.tuning.pricing.waiting``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tuner.tuning.pricing.waiting import waiting_pays

SPEEDUP = st.floats(0.3, 4.0)
WAIT = st.floats(0.0, 120.0)
ANSWER = st.floats(1.0, 4096.0)
STEP = st.floats(0.001, 1.0)


@given(WAIT, ANSWER, STEP, SPEEDUP, SPEEDUP)
def test_a_variant_no_faster_than_the_busy_one_never_pays_a_wait(
    wait: float, answer: float, step: float, busy: float, wanted: float
) -> None:
    if wanted <= busy:
        assert not waiting_pays(wait, answer, step, busy, wanted)


@given(WAIT, WAIT, ANSWER, STEP, SPEEDUP, SPEEDUP)
def test_a_longer_wait_never_pays_where_a_shorter_one_does_not(
    short: float, long: float, answer: float, step: float, busy: float, wanted: float
) -> None:
    short, long = min(short, long), max(short, long)
    if waiting_pays(long, answer, step, busy, wanted):
        assert waiting_pays(short, answer, step, busy, wanted)


@given(WAIT, ANSWER, ANSWER, STEP, SPEEDUP, SPEEDUP)
def test_a_longer_answer_never_makes_a_wait_pay_less(
    wait: float, short: float, long: float, step: float, busy: float, wanted: float
) -> None:
    """The saving grows with the answer: what pays for a short one pays for a long one."""
    short, long = min(short, long), max(short, long)
    if waiting_pays(wait, short, step, busy, wanted):
        assert waiting_pays(wait, long, step, busy, wanted)


def test_the_saving_is_the_answers_decode_time_between_the_two_speeds() -> None:
    """100 tokens at 0.025 s a plain step: 1.25 s at 2x, 2.5 s at 1x; the saving 1.25 s."""
    assert waiting_pays(1.2, 100, 0.025, 1.0, 2.0)
    assert not waiting_pays(1.3, 100, 0.025, 1.0, 2.0)


@given(WAIT, WAIT, st.floats(0.0, 60.0), ANSWER, STEP, SPEEDUP, SPEEDUP)
def test_what_joining_costs_beyond_the_wait_never_makes_waiting_pay_less(
    wait: float, cheap: float, dear: float, answer: float, step: float, busy: float, wanted: float
) -> None:
    cheap, dear = min(cheap, dear), max(cheap, dear)
    if waiting_pays(wait, answer, step, busy, wanted, cheap):
        assert waiting_pays(wait, answer, step, busy, wanted, dear)


def test_a_turn_waits_for_a_slower_variant_where_joining_costs_its_history() -> None:
    """Joining a faster variant that lacks a turn's history: 6 s to process it again against
    a 1 s wait; behind a 10 s wait, joining is the cheaper."""
    assert waiting_pays(1.0, 96, 1 / 40, 1.5, 1.2, 6.0)
    assert not waiting_pays(10.0, 96, 1 / 40, 1.5, 1.2, 6.0)
