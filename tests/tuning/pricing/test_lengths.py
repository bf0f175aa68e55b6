"""A drafted token's cost by the variant's most tokens per round (``tuner.tuning.pricing.lengths``),
and how the calibration prices a variant that has not served with it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.model.speedup import CostModel
from tuner.tuning.pricing.costfit import CostFit
from tuner.tuning.pricing.lengths import by_length
from tuner.tuning.pricing.prices import Pricing
from tuner.tuning.variants import parse_name

LENGTHS = st.integers(2, 128)


@given(st.floats(0.0, 1.0), st.floats(0.0, 4.0), LENGTHS, LENGTHS, st.integers(1, 200))
def test_exact_costs_of_the_form_s_plus_j_over_l_are_recovered(
    s: float, j: float, short: int, long: int, asked: int
) -> None:
    """Between the served lengths the fit is the curve itself; outside them the nearest
    served length's cost (no extrapolation)."""
    if short == long:
        assert by_length([(short, s + j / short, 100.0)] * 2) is None
        return
    short, long = min(short, long), max(short, long)
    fit = by_length([(short, s + j / short, 500.0), (long, s + j / long, 3000.0)])
    assert fit is not None
    inside = min(long, max(short, asked))
    assert fit(asked) == pytest.approx(s + j / inside, abs=1e-9)


def test_a_variant_with_too_few_drafts_stays_out_of_the_fit() -> None:
    assert by_length([(16, 0.45, 1000.0), (64, 0.36, 10.0)]) is None
    fit = by_length([(16, 0.45, 1000.0), (64, 0.36, 3000.0), (8, 9.0, 10.0)])
    assert fit is not None and fit(8) == pytest.approx(0.45)


def _served(cal: CostFit, variant: str, c: float, requests: int, rng: random.Random) -> None:
    for _ in range(requests):
        n, d = rng.randint(60, 120), rng.randint(10, 50)
        a = rng.randint(0, d)
        cal.add("code", variant, (n, d, a), 0.01 * (n - a + c * d))
    cal.add("code", "none", (100, 0, 0), 1.0)


def test_an_unserved_variant_is_priced_at_its_length_and_a_served_one_by_its_own() -> None:
    """Served at 16 and 64 tokens per round (0.45 and 0.36 a drafted token, the shape the
    fresh bench measured), a 32-token variant starts at 0.39; the pooled cost, without
    lengths, is whatever mix of the two served most."""
    speed = lambda key: 100.0  # noqa: E731
    lengths = {"short": 16, "long": 64, "middle": 32, "own": 32}
    cal, plain = CostFit(0.2, 0.25, lengths), CostFit(0.2, 0.25)
    for each in (cal, plain):
        rng = random.Random(5)
        _served(each, "short", 0.45, 20, rng)
        _served(each, "long", 0.36, 80, rng)
    costs = cal.costs(["short", "long", "middle"], speed)
    assert costs["short"][0] == pytest.approx(0.45, abs=0.005)
    assert costs["long"][0] == pytest.approx(0.36, abs=0.005)
    assert costs["middle"][0] == pytest.approx(0.39, abs=0.005)
    assert plain.costs(["middle"], speed)["middle"][0] == pytest.approx(0.378, abs=0.005)
    # a variant off the curve that served: its own requests decide its cost
    _served(cal, "own", 0.60, 30, random.Random(6))
    assert cal.costs(["own"], speed)["own"][0] == pytest.approx(0.60, abs=0.03)


def test_the_engines_autotune_is_not_priced_by_its_most_tokens_per_round() -> None:
    """ik_llama.cpp's autotune may draft 16 a round but sets each round's length itself
    (most of them far shorter): its cost stays out of the fit by length, and it is priced
    by its own requests."""
    names = ["none", "ngram-mod.match12.max16", "ngram-mod.match12.auto1", "ngram-simple.n3.m8"]
    variants = {v.name: v for v in map(parse_name, names)}
    pricing = Pricing({}, variants, CostModel(), 0.0, confidence=0.9)
    lengths = pricing.costfit.lengths
    assert lengths == {"ngram-mod.match12.max16": 16, "ngram-simple.n3.m8": 8}
