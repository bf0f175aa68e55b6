"""What a drafted token costs where requests decode together (``tuner.tuning.pricing.batching``,
``tuner.model.speedup.batched_cost``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.model.speedup import CostModel, batched_cost, batched_curve, leviathan
from tuner.tuning.pricing.batching import BATCHES, batch_of, costs_in_batch, model_in_batch

COST = st.floats(0.0, 3.0)
BATCH = st.integers(1, 64)


@given(COST)
def test_alone_a_drafted_token_costs_what_it_was_fitted_at(c: float) -> None:
    assert batched_cost(c, 1) == c
    assert costs_in_batch({"v": (c, 0.1)}, 1) == {"v": (c, 0.1)}


@given(COST, BATCH, BATCH)
def test_a_drafted_token_never_costs_less_with_more_decoding_together(
    c: float, small: int, large: int
) -> None:
    small, large = min(small, large), max(small, large)
    assert batched_cost(c, small) <= batched_cost(c, large) + 1e-12


@given(st.floats(0.0, 0.999), BATCH)
def test_verify_never_costs_more_than_a_whole_step_or_more_than_the_batch_times_alone(
    c: float, batch: int
) -> None:
    """Compute-bound at worst (a whole step a token); at best each sequence's drafts add to
    a shared step that costs no more than one sequence's."""
    found = batched_cost(c, batch)
    assert c <= found <= min(1.0, batch * c) + 1e-12


@given(st.floats(0.001, 2.0), st.sampled_from(BATCHES), st.integers(1, 32))
def test_the_priors_batched_curve_and_the_fitted_cost_agree_on_an_affine_step(
    slope: float, batch: int, drafts: int
) -> None:
    """A verify curve ``1 + s (n - 1)`` prices a drafted token at ``s`` alone; batched, the
    curve's extra time per drafted token is what ``batched_cost`` gives from ``s``, for
    any draft length (the prior and the fitted cost move alike with the load)."""
    curve = batched_curve(lambda n: 1.0 + slope * (n - 1), batch)
    per_token = (curve(1 + drafts) - curve(1)) / drafts
    alone = slope if slope < 1.0 else None
    if alone is not None:
        assert per_token == pytest.approx(batched_cost(alone, batch), rel=1e-9)


def test_short_drafts_still_pay_in_a_batch_where_long_ones_stop() -> None:
    """Drafting on a CPU whose verify costs 0.3 of a step alone: a short draft still pays
    with four decoding together, a long one that paid alone does not."""
    alone, four = batched_cost(0.3, 1), batched_cost(0.3, 4)
    assert leviathan(0.8, 2, alone) > 1.0 and leviathan(0.8, 2, four) > 1.0
    assert leviathan(0.9, 16, alone) > 1.0 > leviathan(0.9, 16, four)


def test_requests_in_flight_fall_in_the_buckets_the_decision_keeps_apart() -> None:
    assert [batch_of(n) for n in (None, 0, 1, 2, 3, 4, 5, 8, 40)] == [1, 1, 1, 2, 4, 4, 8, 8, 8]


def test_the_prior_in_a_batch_prices_drafts_dearer_and_alone_as_it_was() -> None:
    cost = CostModel(verify=lambda n: 1.0 + 0.1 * (n - 1))
    assert model_in_batch(cost, 1) is cost
    batched = model_in_batch(cost, 4)
    assert batched.verify(1) == 1.0 and batched.verify(17) > cost.verify(17)


@given(st.floats(0.01, 0.99), st.floats(0.0, 0.5), st.sampled_from(BATCHES[1:]))
def test_the_cost_in_a_batch_carries_its_error(c: float, se: float, batch: int) -> None:
    value, error = costs_in_batch({"v": (c, se)}, batch)["v"]
    low, _ = costs_in_batch({"v": (max(0.0, c - 0.001), se)}, batch)["v"]
    assert value >= low and error >= 0.0
