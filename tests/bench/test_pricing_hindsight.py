"""``benchmarks/pricing_hindsight.py``: cost models fitted on a run's own times."""

from __future__ import annotations

import random
from typing import Any

from benchmarks.pricing_hindsight import hindsight, with_rounds

PORTS = {"none": 1, "short": 2, "long": 3}


def _run(seed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
    """Two classes of 6 prompts; ``short`` drafts 8 tokens a round, ``long`` 32. Time is
    10 ms a step, 2 ms a drafted token and 20 ms a round, exactly."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    log = [
        f"srv load: spawning server instance with name={n} on port {p}" for n, p in PORTS.items()
    ]
    t = 0.0
    for item in range(12):
        key = "code" if item < 6 else "text"
        share = rng.uniform(0.3, 0.9)
        for arm, length in (("none", 0), ("short", 8), ("long", 32)):
            rounds = 0 if not length else rng.randint(3, 6)
            d = rounds * length
            a = round(d * share * (0.9 if arm == "long" else 1.0))
            n = 128
            ms = 10 * (n - a) + 2 * d + 20 * rounds
            t += 1
            rows.append(
                {
                    "arm": arm,
                    "item": item,
                    "id": f"p{item}",
                    "repeat": 0,
                    "class": key,
                    "t": t,
                    "variant": arm,
                    "tokens": n,
                    "ms": ms,
                    "drafted": d,
                    "accepted": a,
                }
            )
            if d:
                mean = 1 + a / rounds
                log.append(
                    f"[{PORTS[arm]}] 0.01.000 I slot print_timing: id  0 | task {item} | draft "
                    f"acceptance = {a / d:.5f} ({a:5d} accepted / {d:5d} generated), "
                    f"mean len = {mean:5.2f}"
                )
    rows.append({**rows[-1], "arm": "tuner", "variant": "long"})  # not a static arm
    return rows, log


def test_rounds_come_from_the_servers_log() -> None:
    rows, log = _run()
    priced = with_rounds(rows, log)
    assert {r["arm"] for r in priced} == {"none", "short", "long"}
    for r in priced:
        if r["arm"] == "short":
            assert r["rounds"] == r["drafted"] // 8
        if r["arm"] == "long":
            assert r["rounds"] == r["drafted"] // 32


def test_a_model_of_the_runs_own_structure_prices_every_class_and_arm() -> None:
    rows, log = _run()
    found = hindsight(rows, log)
    assert found["drafted_per_round"] == {"long": 32.0, "short": 8.0}
    models = found["models"]
    exact = models["per_round"]
    assert exact["pairs"] == 4 and exact["within"] == 4 and exact["mean_error"] < 1e-6
    # one cost per drafted token cannot see that short rounds pay more per token
    assert models["one_cost"]["mean_error"] > exact["mean_error"]
