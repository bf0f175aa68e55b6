"""The speedup maths: the seed table exactly, and its invariants as properties."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tuner.model.speedup import (
    CostModel,
    best_gamma,
    copy_speedup,
    distinct_experts,
    effective_draft_cost,
    expected_tokens,
    interpolated_curve,
    leviathan,
    moe_verify_curve,
    speedup,
    tokens_for_coverage,
    verdict,
)

alphas = st.floats(min_value=0.0, max_value=0.999)
gammas = st.integers(min_value=1, max_value=32)
costs = st.floats(min_value=0.0, max_value=2.0)


@pytest.mark.parametrize(
    ("alpha", "gamma", "c", "expected"),
    [
        (0.80, 4, 0.05, "2.80"),
        (0.70, 4, 0.05, "2.31"),
        (0.70, 4, 0.20, "1.54"),
        (0.55, 4, 0.20, "1.17"),
        (0.55, 4, 0.30, "0.96"),
    ],
)
def test_seed_table(alpha: float, gamma: int, c: float, expected: str) -> None:
    assert f"{leviathan(alpha, gamma, c):.2f}" == expected
    assert f"{speedup(alpha, gamma, CostModel(draft_step=c)):.2f}" == expected


def test_eight_of_256_experts_reach_95_percent_near_94_tokens() -> None:
    assert 94 <= tokens_for_coverage(256, 8, 0.95) <= 95
    assert distinct_experts(256, 8, 94) / 256 == pytest.approx(0.95, abs=0.002)


@given(alphas, alphas, gammas, costs)
def test_speedup_rises_with_alpha(a1: float, a2: float, gamma: int, c: float) -> None:
    lo, hi = sorted((a1, a2))
    assert leviathan(lo, gamma, c) <= leviathan(hi, gamma, c) + 1e-12


@given(alphas, gammas, costs, costs)
def test_speedup_falls_with_cost(alpha: float, gamma: int, c1: float, c2: float) -> None:
    lo, hi = sorted((c1, c2))
    assert leviathan(alpha, gamma, hi) <= leviathan(alpha, gamma, lo) + 1e-12


@given(alphas, costs)
def test_no_draft_means_no_change(alpha: float, c: float) -> None:
    assert speedup(alpha, 0, CostModel(draft_step=c)) == 1.0
    assert leviathan(alpha, 0, c) == pytest.approx(1.0)


@given(st.floats(min_value=0.0, max_value=1.0), gammas, costs)
def test_speedup_bounded_by_gamma_plus_one(alpha: float, gamma: int, c: float) -> None:
    assert 0 < leviathan(alpha, gamma, c) <= gamma + 1 + 1e-9
    assert 1 <= expected_tokens(alpha, gamma) <= gamma + 1 + 1e-9


@given(st.integers(2, 512), st.integers(1, 64), st.integers(1, 200))
def test_distinct_experts_grow_and_saturate(n_experts: int, k: int, n: int) -> None:
    assume(k <= n_experts)
    now, later = distinct_experts(n_experts, k, n), distinct_experts(n_experts, k, n + 1)
    assert k - 1e-9 <= now <= later <= n_experts + 1e-9


@given(alphas, gammas, st.floats(min_value=0.0, max_value=1.0))
def test_moe_verify_cost_never_beats_dense(alpha: float, gamma: int, fraction: float) -> None:
    dense = CostModel(draft_step=0.05)
    moe = CostModel(draft_step=0.05, verify=moe_verify_curve(256, 8, expert_fraction=fraction))
    assert speedup(alpha, gamma, moe) <= speedup(alpha, gamma, dense) + 1e-12


@given(alphas, gammas, st.floats(min_value=0.0, max_value=3.0))
def test_recurrent_restore_only_costs(alpha: float, gamma: int, restore: float) -> None:
    plain = CostModel(draft_step=0.1)
    hybrid = CostModel(draft_step=0.1, restore=restore)
    assert speedup(alpha, gamma, hybrid) <= speedup(alpha, gamma, plain) + 1e-12


def test_restore_is_free_when_every_draft_is_accepted() -> None:
    hybrid = CostModel(draft_step=0.1, restore=5.0)
    assert speedup(1.0, 4, hybrid) == speedup(1.0, 4, CostModel(draft_step=0.1))


def test_best_gamma_and_verdict() -> None:
    gamma, s = best_gamma(0.8, CostModel(draft_step=0.05))
    assert gamma >= 4 and s > 2.8
    assert best_gamma(0.1, CostModel(draft_step=0.5)) == (0, 1.0)
    moe = CostModel(draft_step=0.2, verify=moe_verify_curve(256, 8, expert_fraction=0.7), moe=True)
    off = verdict(0.55, moe)
    assert not off.pays and off.gamma == 0 and off.speedup == 1.0 and off.best_speculative < 1
    assert "cannot pay" in off.reason and "MoE" in off.reason
    on = verdict(0.8, CostModel(draft_step=0.05))
    assert on.pays and on.speedup > 2.8


def test_a_dense_target_is_not_blamed_on_experts() -> None:
    dense = CostModel(verify=lambda n: 1.0 + 0.3 * (n - 1))
    v = verdict(0.3, dense)
    assert not v.pays and "verify cost growth" in v.reason and "MoE" not in v.reason


def test_verdict_names_the_recurrent_restore_when_it_dominates() -> None:
    v = verdict(0.5, CostModel(draft_step=0.01, restore=3.0))
    assert not v.pays and "recurrent" in v.reason


@given(alphas, st.integers(1, 16), st.floats(min_value=0.0, max_value=1.0))
def test_effective_cost_inverts_leviathan(alpha: float, gamma: int, c: float) -> None:
    measured = leviathan(alpha, gamma, c)
    assert effective_draft_cost(measured, alpha, gamma) == pytest.approx(c, abs=1e-9)


def test_interpolated_curve_is_a_valid_verify_cost() -> None:
    curve = interpolated_curve([(1, 1.0), (8, 1.1), (64, 3.0)])
    assert curve(1) == 1.0 and curve(64) == 3.0 and curve(100) == 3.0
    assert 1.0 < curve(4) < 1.1


@pytest.mark.parametrize("bad", [-0.1, 1.1])
def test_alpha_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        expected_tokens(bad, 4)


def test_worked_examples_in_the_docs_hold() -> None:
    import doctest

    import tuner.model.speedup as module

    result = doctest.testmod(module)
    assert result.attempted >= 10 and result.failed == 0


@given(alphas, st.integers(1, 12))
def test_replay_after_restore_costs_the_expected_prefix(alpha: float, gamma: int) -> None:
    """With flat verify cost the replay adds exactly P(some draft rejected) steps."""
    plain = CostModel(draft_step=0.1)
    replaying = CostModel(draft_step=0.1, replay=True)
    extra = replaying.round_time(alpha, gamma) - plain.round_time(alpha, gamma)
    assert extra == pytest.approx(1.0 - alpha**gamma)


matches = st.floats(min_value=0.01, max_value=1.0)
copies = st.floats(min_value=1.0, max_value=64.0)


@given(alphas, alphas, gammas, matches, copies)
def test_copy_speedup_rises_with_alpha(
    a1: float, a2: float, gamma: int, match: float, copy: float
) -> None:
    lo, hi = sorted((a1, a2))
    cost = CostModel(verify=moe_verify_curve(64, 4, expert_fraction=0.5))
    assert copy_speedup(lo, gamma, cost, match, copy) <= copy_speedup(hi, gamma, cost, match, copy)


@given(alphas, gammas, copies)
def test_copy_speedup_is_one_without_matches_or_drafts(
    alpha: float, gamma: int, copy: float
) -> None:
    cost = CostModel(verify=lambda n: 1.0 + 0.2 * (n - 1))
    assert copy_speedup(alpha, gamma, cost, 0.0, copy) == 1.0
    assert copy_speedup(alpha, 0, cost, 0.5, copy) == 1.0


@given(alphas, gammas, matches, copies)
def test_copy_speedup_lies_between_plain_and_one_drafted_round(
    alpha: float, gamma: int, match: float, copy: float
) -> None:
    """Mixing plain steps into the rounds moves the speedup toward 1, never past the
    speedup of a round that drafts every time (match = 1)."""
    cost = CostModel(verify=lambda n: 1.0 + 0.17 * (n - 1))
    every = copy_speedup(alpha, gamma, cost, 1.0, copy)
    mixed = copy_speedup(alpha, gamma, cost, match, copy)
    assert min(1.0, every) - 1e-12 <= mixed <= max(1.0, every) + 1e-12


def test_copies_pay_where_independent_guesses_do_not() -> None:
    """On this machine's measured verify curve a 48-token draft costs 9 decode steps:
    guessed token by token at alpha 0.7 it loses; copied as a run (accepted share 0.7,
    drafts on 15 % of rounds) it pays, as the measured n-gram variants do."""
    curve = interpolated_curve([(1, 1.06), (8, 2.45), (16, 3.69), (32, 6.40), (48, 9.23)])
    cost = CostModel(verify=curve)
    assert speedup(0.7, 48, cost) < 0.5
    assert copy_speedup(0.7, 48, cost, 0.15, 16.0) > 1.3
    with pytest.raises(ValueError, match="match"):
        copy_speedup(0.7, 4, cost, 1.5, 16.0)
    with pytest.raises(ValueError, match="copy"):
        copy_speedup(0.7, 4, cost, 0.5, 0.5)
