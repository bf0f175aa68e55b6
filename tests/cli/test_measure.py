"""Live statistics from records: acceptance, tokens per step, speedup with intervals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuner.cli.measure import arm_stats, compare
from tuner.records import RequestRecord, Timings
from tuner.stats import wilson


def rec(
    variant: str,
    tps: float,
    n: int = 100,
    drafted: int = 0,
    accepted: int = 0,
    klass: str | None = "code",
    status: int = 200,
) -> RequestRecord:
    timings = Timings(
        predicted_n=n,
        predicted_per_second=tps,
        draft_n=drafted or None,
        draft_n_accepted=accepted if drafted else None,
    )
    return RequestRecord(
        id="r",
        ts=0,
        endpoint="/v1/completions",
        stream=False,
        status=status,
        proxy_ms=1,
        timings=timings,
        class_key=klass,
        variant=variant,
    )


def test_arms_and_speedup() -> None:
    records = [rec("none", 60 + i % 3) for i in range(10)]
    records += [rec("ngs", 90 + i % 3, drafted=80, accepted=60) for i in range(10)]
    records.append(rec("ngs", 500, status=400))  # failed requests do not count
    arms = arm_stats(records)
    spec, base = arms[("code", "ngs")], arms[("code", "none")]
    assert spec.requests == 10 and spec.drafted == 800 and spec.accepted == 600
    assert spec.alpha is not None and spec.alpha.value == 0.75
    assert spec.alpha.low < 0.75 < spec.alpha.high
    assert spec.tokens_per_step == pytest.approx(1000 / 400)  # 1000 tokens in 400 steps
    assert base.alpha is None and base.tokens_per_step == 1.0
    result = compare(spec, base)
    assert result.speedup.value == pytest.approx(91 / 61, rel=0.01)
    assert result.speedup.low < result.speedup.value < result.speedup.high
    assert result.effective_c is not None


def test_records_without_class_or_variant_group_under_defaults() -> None:
    arms = arm_stats([rec(None, 50, klass=None)])  # type: ignore[arg-type]
    assert list(arms) == [("all", "default")]


@given(st.integers(0, 500), st.integers(1, 500))
def test_wilson_interval_holds_the_estimate(successes: int, trials: int) -> None:
    successes = min(successes, trials)
    w = wilson(successes, trials)
    assert w is not None and 0 <= w.low <= w.value <= w.high <= 1


def test_wilson_narrows_with_more_trials() -> None:
    small, large = wilson(8, 10), wilson(800, 1000)
    assert small and large and (large.high - large.low) < (small.high - small.low)
    assert wilson(0, 0) is None
