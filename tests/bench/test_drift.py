"""``benchmarks/drift.py``: the machine's speed through a run, and ratios at one speed."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.drift import analyse, drift, robust_line, trimmed_mean

PROMPTS = 200


def _run(
    aligned: bool, seed: int = 0, slow: float = 1.5, noise: float = 0.0, hiccups: int = 0
) -> list[dict[str, Any]]:
    """A run of 200 prompts in two classes (20 and 30 ms a token at the machine's normal
    speed). The machine starts ``slow`` times as slow and speeds up linearly to normal. The
    tuner decodes every prompt plainly, a minute apart; the static arm takes 0.8 of the
    time per token. The matrix (no speculation, then the static arm) runs each prompt
    beside the tuner's request (``aligned``) or at a shuffled moment of the run. Each
    request's time is off by a log-normal ``noise`` of its own, and ``hiccups``
    no-speculation requests take three times as long."""
    moments = list(range(PROMPTS))
    rng = random.Random(seed)
    if not aligned:
        rng.shuffle(moments)
    slowed = set(rng.sample(range(PROMPTS), hiccups))

    def machine(t: float) -> float:
        return slow - (slow - 1.0) * t / (PROMPTS * 60)

    rows: list[dict[str, Any]] = []
    for i in range(PROMPTS):
        cls, base = ("a", 20.0) if i % 2 else ("b", 30.0)
        at = moments[i] * 60.0 + 1
        for arm, t, per_token in (
            ("tuner", i * 60.0, base * machine(i * 60.0)),
            ("none", at, base * machine(at)),
            ("static", at + 1, 0.8 * base * machine(at + 1)),
        ):
            hiccup = 3 if arm == "none" and i in slowed else 1
            per_token *= math.exp(rng.gauss(0.0, noise)) * hiccup
            rows.append({"arm": arm, "item": i, "id": f"p{i}", "class": cls, "t": t, "tokens": 100,
                         "ms": per_token * 100, "drafted": 0})  # fmt: skip
    return sorted(rows, key=lambda r: r["t"])


def test_the_machine_s_speed_is_traced_from_the_no_speculation_arm() -> None:
    eighths = analyse(_run(aligned=True))["drift_by_eighth"]
    assert len(eighths) == 8
    assert eighths == sorted(eighths, reverse=True)  # it speeds up all run
    assert eighths[0] / eighths[-1] == pytest.approx(1.5 / 1.03, rel=0.05)


@given(seed=st.integers(0, 10_000), slow=st.floats(1.1, 2.0))
@settings(max_examples=20, deadline=None)
def test_drift_moves_raw_readings_and_adjusted_ones_undo_it(seed: int, slow: float) -> None:
    found = analyse(_run(aligned=False, seed=seed, slow=slow))["daemons"]["tuner"]
    quarters = found["plain_quarters"]
    assert quarters[0]["raw"] > 1.02  # early requests, slow machine, partners at any moment
    assert quarters[-1]["raw"] < 0.98
    for quarter in quarters:
        assert quarter["adjusted"] == pytest.approx(1.0, abs=0.02)
    assert found["vs_static"]["static"]["adjusted"] == pytest.approx(0.8, abs=0.02)
    assert found["minutes_apart"] > 10


@pytest.mark.parametrize("seed", range(5))
def test_the_traced_speed_follows_the_machine_through_noise_and_hiccups(seed: int) -> None:
    """Requests 2 % off at random and 8 no-speculation requests three times as slow: the
    traced speed stays within 2 % of the machine's (up to one factor for the whole run),
    at the run's ends too (a fit that kept the hiccups is 10 % off)."""
    machine = drift(_run(aligned=False, seed=seed, slow=1.6, noise=0.02, hiccups=8))
    off = [machine.at(t) - math.log(1.6 - 0.6 * t / (PROMPTS * 60)) for t in range(0, 12_000, 300)]
    assert max(off) - min(off) < 0.04


@given(
    slope=st.floats(-1.0, 1.0),
    intercept=st.floats(-5.0, 5.0),
    far=st.lists(st.integers(0, 19), max_size=2, unique=True),
)
def test_a_robust_line_recovers_a_line_with_two_points_thrown_far_off(
    slope: float, intercept: float, far: list[int]
) -> None:
    xs = [float(x) for x in range(20)]
    ys = [intercept + slope * x + (100.0 if k in far else 0.0) for k, x in enumerate(xs)]
    found = robust_line(xs, ys)
    assert found == pytest.approx((slope, intercept), abs=1e-6)
    assert robust_line([3.0] * 5, [1.0, 2.0, 3.0, 4.0, 5.0]) == (0.0, 3.0)  # one moment: flat
    assert trimmed_mean([0.0] * 9 + [100.0]) == 0.0


def test_beside_each_other_raw_is_adjusted() -> None:
    found = analyse(_run(aligned=True))["daemons"]["tuner"]
    assert found["minutes_apart"] < 0.1
    assert found["vs_static"]["static"]["raw"] == pytest.approx(0.8, abs=0.005)
    assert found["vs_static"]["static"]["adjusted"] == pytest.approx(0.8, abs=0.005)
    for quarter in found["plain_quarters"]:
        assert quarter["raw"] == pytest.approx(1.0, abs=0.005)


def test_a_run_without_a_no_speculation_arm_has_nothing_to_trace() -> None:
    rows = [r for r in _run(aligned=True) if r["arm"] != "none"]
    assert analyse(rows) == {"drift_by_eighth": [], "daemons": {}}
    assert drift(rows).logs == []


def test_a_daemon_s_warm_seconds_are_charged_to_it_as_every_bench_ratio_does() -> None:
    rows = _run(aligned=True)
    for row in rows:
        if row["arm"] == "tuner":
            row["warm_ms"] = row["ms"] / 4  # a quarter more time on the daemon's side
    found = analyse(rows)["daemons"]["tuner"]
    assert found["vs_static"]["static"]["raw"] == pytest.approx(0.8 / 1.25, abs=0.005)
