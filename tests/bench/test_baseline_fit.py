"""``benchmarks/baseline_fit.py``: the no-speculation speed from speculative requests alone."""

from __future__ import annotations

import random
from typing import Any

import pytest

from benchmarks.baseline_fit import baseline_fit, fit


def spec_row(arm: str, variant: str, n: int, d: int, a: int, step: float, c: float,
             noise: float = 0.0, rng: random.Random | None = None) -> dict[str, Any]:  # fmt: skip
    seconds = step * (n - a + c * d) * (1 + (rng.gauss(0, noise) if rng else 0.0))
    return {"arm": arm, "variant": variant, "tokens": n, "drafted": d, "accepted": a,
            "ms": 1000 * seconds}  # fmt: skip


def test_an_exact_model_gives_back_its_step_and_costs() -> None:
    step = 1 / 70  # 70 tok/s without speculation
    rows = [spec_row("t", "v1", 128, d, a, step, 0.4) for d, a in ((60, 50), (10, 2), (90, 85))]
    rows += [spec_row("t", "v2", 128, d, a, step, 0.3) for d, a in ((30, 20), (80, 40), (5, 5))]
    found = fit(rows)
    assert found is not None and found["tok_s"] == pytest.approx(70.0, rel=1e-3)
    assert found["cost"] == {"v1": pytest.approx(0.4, abs=1e-3), "v2": pytest.approx(0.3, abs=1e-3)}


def test_noisy_requests_land_near_the_measured_baseline() -> None:
    rng = random.Random(4)
    step = 1 / 72
    rows: list[dict[str, Any]] = [
        {
            "arm": "none",
            "variant": "none",
            "tokens": 128,
            "drafted": 0,
            "accepted": 0,
            "ms": 1000 * 128 * step,
        }
    ]
    for _ in range(200):
        d = rng.randint(5, 100)
        a = rng.randint(0, d)
        rows.append(spec_row("tuner", rng.choice(["v1", "v2"]), 128, d, a, step, 0.4, 0.08, rng))
    rows.append({"arm": "tuner", "variant": "v1", "error": "boom", "tokens": 0, "ms": 0})
    found = baseline_fit(rows)
    assert found["measured_tok_s"] == pytest.approx(72.0, rel=1e-3)
    tuner = found["arms"]["tuner"]
    assert set(tuner) == {"30", "100", "200"}
    assert tuner["200"]["over_measured"] == pytest.approx(1.0, abs=0.03)
    assert "none" not in found["arms"]  # no speculative requests there


def test_too_few_requests_fit_nothing() -> None:
    assert fit([spec_row("t", "v1", 128, 10, 5, 0.01, 0.4)]) is None


def test_the_engine_fit_keeps_only_the_two_anchoring_plain_requests() -> None:
    """A daemon's requests as run: plain ones (a third of them, slower than the model's
    step, as if their minutes were slower) and speculative ones of two variants. The engine's
    fit keeps the first two plain requests only, so it lands on the speculative requests'
    step, not between it and the slow plain ones."""
    rng = random.Random(9)
    step = 1 / 80
    rows: list[dict[str, Any]] = []
    for i in range(150):
        if i % 3 == 0:
            slow = 1.0 if i < 6 else 1.3  # the first two plain requests at the true step
            rows.append({"arm": "tuner", "variant": "none", "tokens": 128, "drafted": 0,
                         "accepted": 0, "ms": 1000 * 128 * step * slow})  # fmt: skip
        else:
            d = rng.randint(5, 100)
            rows.append(spec_row("tuner", rng.choice(["v1", "v2"]), 128, d, rng.randint(0, d),
                                 step, 0.4, 0.05, rng))  # fmt: skip
    found = baseline_fit(rows)["engine"]["tuner"]
    assert set(found) == {"20", "40", "100", str(150 - 48)}
    assert found["100"]["tok_s"] == pytest.approx(80.0, rel=0.03)
    assert "challenger" not in baseline_fit(rows)["engine"]
