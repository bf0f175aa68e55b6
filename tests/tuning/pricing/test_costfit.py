"""The per-variant cost of a drafted token and the plain step's time (pure maths)."""

from __future__ import annotations

import math
import random
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.tuning.pricing.costfit import CostFit


def test_calibration_recovers_each_variant_cost_from_noisy_requests() -> None:
    """Requests whose decode took ``n - a + c d`` steps of their class (times timing noise,
    as on a shared machine), in two classes of different baseline speeds: the cost per
    variant comes back, pooled across the classes, near its true value."""
    rng = random.Random(1)
    truth = {"ngram-simple.n3.m48": 0.45, "ngram-cache": 0.65}
    speeds = {"code/echo/greedy": 60.0, "prose/fresh/greedy": 45.0}
    calibration = CostFit(prior=0.0)
    for _ in range(100):
        for key, speed in speeds.items():
            for name, c in truth.items():
                n, d = 128, rng.randint(20, 200)
                a = rng.randint(0, min(d, n - 1))
                seconds = (n - a + c * d) / speed * rng.lognormvariate(0, 0.12)
                calibration.add(key, name, (n, d, a), seconds)
    found = calibration.costs([*truth, "ngram-mod"], speeds.get)
    for name, c in truth.items():
        value, se = found[name]
        assert value == pytest.approx(c, abs=0.05) and 0 < se < 0.05
    # a variant never seen gets the pooled cost, between the two
    assert 0.45 < found["ngram-mod"][0] < 0.65
    # a class whose baseline speed is not known yet does not count
    only = calibration.costs(["ngram-cache"], {"code/echo/greedy": 60.0}.get)["ngram-cache"]
    assert only[0] == pytest.approx(0.65, abs=0.07) and only[1] > found["ngram-cache"][1]


def _served(seed: int, plan: list[tuple[str, str, float, int]]) -> CostFit:
    """A calibration fed, per (class, variant, cost, count) of ``plan``, ``count`` requests
    of 128 tokens with random drafts, decoding ``n - a + cost * d`` steps at 60 a second."""
    rng, calibration = random.Random(seed), CostFit()
    for key, variant, c, count in plan:
        for _ in range(count):
            n, d = 128, rng.randint(20, 120)
            a = rng.randint(0, min(d, n - 1))
            calibration.add(key, variant, (n, d, a), (n - a + c * d) / 60.0)
    return calibration


@given(
    local=st.floats(0.1, 1.0),
    other=st.floats(0.1, 1.0),
    mine=st.integers(0, 40),
    seed=st.integers(0, 1000),
)
def test_a_class_prices_a_variant_by_its_own_requests_shrunk_toward_all_traffic(
    local: float, other: float, mine: int, seed: int
) -> None:
    """A variant drafting at ``local`` a token in class ``a`` and ``other`` in class ``b``
    (60 requests): priced in ``a``, its cost lies between all traffic's cost and ``local``,
    nearer ``local`` the more requests ``a`` has; a class with none of its requests gets all
    traffic's cost exactly, and so does asking without a class."""
    calibration = _served(seed, [("a", "v", local, mine), ("b", "v", other, 60)])
    speed = lambda _: 60.0  # noqa: E731
    overall = calibration.costs(["v"], speed)["v"]
    assert calibration.costs(["v"], speed, within="c".__eq__)["v"] == overall
    found = calibration.costs(["v"], speed, within="a".__eq__)["v"][0]
    low, high = sorted((overall[0], local))
    assert low - 1e-9 <= found <= high + 1e-9
    if mine >= 20:
        assert found == pytest.approx(local, abs=0.2 * abs(overall[0] - local) + 1e-6)


def test_the_baseline_speed_is_applied_when_asked_not_when_added() -> None:
    """The class's baseline speed is an estimate that improves: the cost uses the latest,
    so an early guess of it (two noisy requests) is not baked in."""
    calibration = CostFit()
    for _ in range(10):
        calibration.add("k", "v", (100, 100, 50), (50 + 0.4 * 100) / 60.0)  # at 60 tok/s
    # 0.4, a touch lower: the prior (0) still weighs one request's worth
    assert calibration.costs(["v"], lambda _: 60.0)["v"][0] == pytest.approx(0.4, abs=0.015)
    assert calibration.costs(["v"], lambda _: 66.0)["v"][0] > 0.4  # the same time, more steps


@given(
    tau=st.floats(0.005, 0.05),
    costs=st.lists(st.floats(0.0, 1.5), min_size=1, max_size=4),
    plain=st.integers(0, 2),
    seed=st.integers(0, 1000),
)
def test_the_step_time_is_fitted_on_speculative_requests(
    tau: float, costs: list[float], plain: int, seed: int
) -> None:
    """Requests of several variants, each decoding ``tau (n - a + c_v d)`` seconds (with 5 %
    timing noise; ``c_v`` up to 1.5 steps, an MoE's verify), and at most two plain requests:
    the fitted step time comes back near ``tau``, whatever each variant's cost, with no
    baseline request needed. (At 30 requests of one variant it lands within 1-2 % as a
    rule, 6-9 % at worst; dearer drafts leave the step less determined.)"""
    rng = random.Random(seed)
    calibration = CostFit()
    for _ in range(plain):
        calibration.add("k", "none", (128, 0, 0), 128 * tau * rng.lognormvariate(0, 0.05))
    for i, c in enumerate(costs):
        for _ in range(100):
            n, d = 128, rng.randint(10, 200)
            a = rng.randint(0, min(d, n - 1))
            seconds = tau * (n - a + c * d) * rng.lognormvariate(0, 0.05)
            calibration.add(f"class{i % 2}", f"v{i}", (n, d, a), seconds)
    found = calibration.step_time()
    assert found is not None and found == pytest.approx(tau, rel=0.08)


def test_a_few_stalled_requests_do_not_move_the_step_time() -> None:
    """Early in a run the router loads instances, and a request decoding beside a load ran
    3.5x slower: one in twenty here. Counted at most 1.5x its expected time, they move the
    fitted step by little; counted whole, an unweighted fit would land far off."""
    tau = 0.011

    def fitted(stall: float) -> float | None:
        rng, calibration = random.Random(2), CostFit(prior=0.4)
        with patch("tuner.tuning.pricing.costfit.STALL", stall):
            for i in range(200):
                n, d = 128, rng.randint(10, 120)
                a = rng.randint(0, min(d, n - 1))
                seconds = (tau * (n - a) + 0.4 * tau * d) * rng.lognormvariate(0, 0.08)
                calibration.add("k", "v", (n, d, a), seconds * (3.5 if i % 20 == 10 else 1.0))
        return calibration.step_time()

    capped, whole = fitted(1.5), fitted(math.inf)
    assert capped is not None and capped == pytest.approx(tau, rel=0.05)
    assert whole is not None and abs(whole / tau - 1) > 0.1


def test_a_rebuilt_step_time_does_not_depend_on_the_order_of_the_kept_requests() -> None:
    """A restart rebuilds the fit from each class's kept requests, variant by variant, the
    plain ones last. A variant's first four requests with nearly the same counts fit a step
    by themselves; one of them 10 % slow made that fit far too fast, and the stall cap then
    clipped every later request against it (the real-server restart test read 204 tok/s
    where 89 were measured). ``rebuilt`` caps against the fit of all of them."""
    tau = 0.011
    plan = [
        ("a", "cache", (64, 59, 49), 3),
        ("a", "cache", (64, 61, 47), 1),
        ("a", "s16", (64, 58, 50), 8),
        ("a", "s8", (64, 48, 48), 10),
        ("a", "none", (64, 0, 0), 3),
        ("b", "cache", (64, 30, 10), 4),
        ("b", "s16", (64, 20, 5), 4),
        ("b", "s8", (64, 10, 2), 4),
        ("b", "none", (64, 0, 0), 12),
    ]
    kappa = {"cache": 0.003, "s16": 0.001, "s8": 0.001, "none": 0.0}
    for seed in range(3):
        rng = random.Random(seed)
        rows = []
        for key, variant, (n, d, a), count in plan:
            for _ in range(count):
                seconds = (tau * (n - a) + kappa[variant] * d) * rng.lognormvariate(0, 0.01)
                slow = 1.1 if (variant, a) == ("cache", 47) else 1.0
                rows.append((key, variant, (n, d, a), seconds * slow))
        in_order = CostFit()
        for row in rows:
            in_order.add(*row)
        found, rebuilt = in_order.step_time(), CostFit.rebuilt(rows).step_time()
        assert found is not None and tau / found > 1.3, found  # what a restart did
        assert rebuilt is not None and rebuilt == pytest.approx(tau, rel=0.02)
        assert CostFit.rebuilt(reversed(rows)).step_time() == pytest.approx(rebuilt)


def test_the_step_time_needs_steps_that_vary_apart_from_drafts() -> None:
    """Nothing measured, or every request of a variant with steps in proportion to its
    drafts (the same counts each time): the step time cannot be told from the drafted
    token's cost, and is not guessed. One plain request fixes it."""
    calibration = CostFit()
    assert calibration.step_time() is None
    for _ in range(5):
        calibration.add("k", "v", (128, 100, 50), 78 * 0.01 + 100 * 0.004)
    assert calibration.step_time() is None
    calibration.add("k", "none", (100, 0, 0), 1.0)
    assert calibration.step_time() == pytest.approx(0.01)


def test_calibration_starts_at_its_prior_and_ignores_what_cannot_count() -> None:
    calibration = CostFit(prior=0.2, prior_se=0.3)
    speed = lambda _: 50.0  # noqa: E731
    assert calibration.costs(["x"], speed)["x"] == (0.2, 0.3)
    calibration.add("k", "x", (128, 0, 0), 2.0)  # nothing drafted: says nothing about c
    calibration.add("k", "x", (128, 50, 10), math.nan)
    calibration.add("k", "x", (0, 50, 10), 1.0)
    assert calibration.costs(["x"], speed)["x"] == (0.2, 0.3)
    calibration.add("k", "x", (100, 100, 50), (50 + 0.6 * 100) / 50.0)  # one request at c = 0.6
    value, _ = calibration.costs(["x"], speed)["x"]
    assert 0.2 < value < 0.6  # shrunk toward the prior: one request is not proof


def _cost_after(first: list[tuple[str, float, float]], seed: int = 3) -> dict[str, float]:
    """Each (variant, true cost, slowdown) in turn, after 120 requests of a settled n-gram
    variant (cost 0.3) and 20 plain ones: the costs the calibration prices them at. ``new``
    is an n-gram type too; ``draft`` (a draft model) is not."""
    tau, rng = 0.011, random.Random(seed)
    calibration = CostFit(prior=0.2, lengths={"settled": 16, "new": 24})

    def add(variant: str, c: float, slow: float = 1.0) -> None:
        n, d = 128, rng.randint(20, 120)
        a = rng.randint(0, min(d, n - 1))
        seconds = tau * (n - a + c * d) * rng.lognormvariate(0, 0.05) * slow
        calibration.add("k", variant, (n, d, a), seconds)

    for i in range(140):
        add("settled", 0.3) if i % 7 else calibration.add("k", "none", (128, 0, 0), 128 * tau)
    for variant, c, slow in first:
        add(variant, c, slow)
    names = {v for v, _, _ in first}
    return {v: cost for v, (cost, _) in calibration.costs(names, lambda _: 1 / tau).items()}


def test_an_early_stall_does_not_price_an_ngram_variant_out_for_good() -> None:
    """A variant's second request stalls (5x its time, as a run's 20th request did beside
    another process); it is not served again, so nothing dilutes what it costs. Before it
    has requests of its own, its time counts at most 1.5x what it is priced at by the
    others: its cost reads under twice the truth (0.51, 0.3 without the stall), where
    counted whole it read 6.6x (over six seeds: 0.5-0.8 against 2.0-4.6)."""
    plan = [("new", 0.3, 1.0), ("new", 0.3, 5.0), ("new", 0.3, 1.0)]
    capped = _cost_after(plan)["new"]
    with patch("tuner.tuning.pricing.costfit.STALL", math.inf):
        whole = _cost_after(plan)["new"]
    assert capped < 0.6, capped
    assert whole > 1.5, whole


@pytest.mark.parametrize("seed", range(4))
def test_a_draft_models_dearer_cost_is_not_clipped_to_the_ngram_ones(seed: int) -> None:
    """A draft model's drafted token costs far more than an n-gram's (2 steps against
    0.3): its first requests are not capped against the n-gram traffic, so it is priced as
    if nothing were capped (within the shrink toward the pooled cost)."""
    plan = [("draft", 2.0, 1.0)] * 12
    found = _cost_after(plan, seed)["draft"]
    with patch("tuner.tuning.pricing.costfit.STALL", math.inf):
        whole = _cost_after(plan, seed)["draft"]
    assert found == pytest.approx(whole, rel=0.02) and found > 1.5, (found, whole)
