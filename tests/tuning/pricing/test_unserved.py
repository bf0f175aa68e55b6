"""The pricing error of a variant that has not served: measured on those that have."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.tuning.replay.test_worker import _drive
from tests.tuning.sim import CODE, TEXT, code_and_text, config, make
from tuner.tuning.pricing.calibration import Calibration
from tuner.tuning.pricing.unserved import DEFAULT_ERROR
from tuner.tuning.replay.drafters import EXACT
from tuner.tuning.runtime.engine import Engine
from tuner.upstream.capabilities import Capabilities


def test_a_blind_cost_leaves_out_the_variants_own_requests() -> None:
    """Priced blind, a variant gets the cost the others' requests set, as one that never
    served would: 0.5 for a variant whose own requests cost 0.2."""
    rng, calibration = random.Random(3), Calibration()
    for name, c in (("a", 0.2), ("b", 0.5), ("c", 0.5)):
        for _ in range(40):
            n, d = 128, rng.randint(20, 120)
            a = rng.randint(0, min(d, n - 1))
            calibration.add(CODE, name, (n, d, a), (n - a + c * d) / 60.0)
    calibration.add(CODE, "none", (128, 0, 0), 128 / 60.0)
    speed = {CODE: 60.0}.get
    own = calibration.costs(["a", "b"], speed)
    blind = calibration.costs(["a", "b"], speed, blind=True)
    assert own["a"][0] == pytest.approx(0.2, abs=0.03)
    assert blind["a"][0] == pytest.approx(0.5, abs=0.03)
    assert blind["b"][0] == pytest.approx((0.2 + 0.5) / 2, abs=0.06)  # a's and c's


def _engine_after(tmp_path: Path, caps: Capabilities, code_cost: float) -> Engine:
    """300 requests, two thirds prose: every ngram-simple variant 1.5x there at a drafted
    token's 0.45 of a step, 1.3x in code at ``code_cost``."""
    engine = make(tmp_path, config(explore_share=0.2), caps, rng=random.Random(1))
    sim = code_and_text(engine, {}, 1.3, code_cost, seed=2)
    _drive(engine, sim, random.Random(2).choices([CODE, TEXT], weights=[1, 2], k=300), EXACT)
    return engine


def test_the_error_is_what_served_variants_would_have_been_mispriced_by(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Where code's drafted tokens cost what all traffic's do, the variants it served price
    unserved ones about right (an error near the model error); where they cost half, a
    variant code never served is priced at all traffic's cost and the error says so."""
    alike = _engine_after(tmp_path / "alike", caps, 0.45)
    cheap = _engine_after(tmp_path / "cheap", caps, 0.2)
    with alike.locked(), cheap.locked():
        assert alike.pricing.unserved_error(CODE) < 0.05
        assert cheap.pricing.unserved_error(CODE) > 0.05
        assert alike.pricing.unserved_error("chat/fresh/greedy") < DEFAULT_ERROR  # pooled
