"""A simulated upstream with known per-class speedups, for deterministic engine tests."""

from __future__ import annotations

import random
from collections.abc import Mapping

from tuner.records import RequestRecord, Timings
from tuner.tuning.engine import Decision, Engine

BASE_TOK_S = 60.0


class SimUpstream:
    """Decode speed = base x true speedup x noise; drafts from a true acceptance."""

    def __init__(
        self,
        speedups: Mapping[str, Mapping[str, float]],
        alphas: Mapping[str, float] | None = None,
        *,
        noise: float = 0.04,
        seed: int = 0,
    ) -> None:
        self.speedups = {k: dict(v) for k, v in speedups.items()}
        self.alphas = dict(alphas or {})
        self.noise = noise
        self.rng = random.Random(seed)
        self.count = 0

    def true_speedup(self, class_key: str, variant: str) -> float:
        return 1.0 if variant == "none" else self.speedups[class_key].get(variant, 0.9)

    def answer(self, class_key: str, decision: Decision) -> RequestRecord:
        self.count += 1
        s = self.true_speedup(class_key, decision.variant)
        tok_s = BASE_TOK_S * s * self.rng.lognormvariate(0.0, self.noise)
        n = 64
        timings: dict[str, float | int] = {
            "predicted_n": n,
            "predicted_ms": 1000 * n / tok_s,
            "predicted_per_second": tok_s,
        }
        if decision.variant != "none":
            drafted = 40
            alpha = self.alphas.get(class_key, 0.5)
            timings |= {"draft_n": drafted, "draft_n_accepted": round(drafted * alpha)}
        return RequestRecord(
            id=f"r{self.count}",
            ts=float(self.count),
            endpoint="/v1/completions",
            stream=False,
            status=200,
            proxy_ms=1.0,
            timings=Timings.model_validate(timings),
            class_key=class_key,
            variant=decision.variant,
            trial=decision.trial,
        )


def drive(engine: Engine, sim: SimUpstream, schedule: list[str]) -> list[Decision]:
    """Send one request per class key in ``schedule``; the decisions made."""
    out = []
    for class_key in schedule:
        decision = engine.route(class_key)
        engine.observe(sim.answer(class_key, decision))
        out.append(decision)
    return out
