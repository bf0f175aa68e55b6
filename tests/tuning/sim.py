"""A simulated upstream with known per-class speedups, for deterministic engine tests."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.records import RequestRecord, Timings
from tuner.tuning.config import TuningConfig, load_tuning
from tuner.tuning.runtime.engine import Decision, Engine
from tuner.tuning.search.studies import StudyBook
from tuner.tuning.variants import Variant, grid
from tuner.upstream.capabilities import Capabilities

BASE_TOK_S = 60.0
HELP = Path(__file__).parents[1] / "upstream" / "data" / "help-0c1e570.txt"
CODE, PROSE = "code/echo/greedy", "prose/fresh/sampled"


def config(guard: Mapping[str, Any] | None = None, **budget: float) -> TuningConfig:
    """The shipped tuning file with these ``[budget]`` values and ``[guard]`` settings."""
    base = load_tuning()
    update: dict[str, Any] = {"budget": base.budget.model_copy(update=budget)}
    if guard:
        update["guard"] = base.guard.model_copy(update=dict(guard))
    return base.model_copy(update=update)


def truth(variants: list[Variant]) -> dict[str, dict[str, float]]:
    """Code edits: short-lookup ngram-simple wins big; prose: every variant loses."""
    code = {}
    for v in variants:
        if v.spec_type == "ngram-simple":
            code[v.name] = 1.45 if v.param("size_n") == 3 else 1.15
        else:
            code[v.name] = 0.92
    return {CODE: code, PROSE: {v.name: 0.85 for v in variants}}


def make(
    tmp_path: Path, cfg: TuningConfig, caps: Capabilities, scope: str = "sim", **kw: object
) -> Engine:
    variants = grid(cfg.search, caps)
    book = StudyBook(tmp_path / "studies.db", scope, seed=3)
    return Engine(cfg, variants, book, **kw)  # type: ignore[arg-type]


def schedule(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice([CODE, PROSE]) for _ in range(n)]


class SimUpstream:
    """Decode speed = base x speedup x noise (log-normal; ``baseline_noise`` for requests
    without speculation, default the same). A speculative request's token counts follow
    the engine's own model: ``n`` tokens, ``d`` drafted, ``a`` accepted with
    ``n / (n - a + c d)`` = the nominal speedup of ``speedups``, ``c`` the machine's cost of a
    drafted token (``cost``, per variant in ``costs``, per class and variant in
    ``class_costs``); ``count_noise`` scatters ``a`` (prompts differ).
    ``bases``: a class's speed without speculation, relative to ``BASE_TOK_S`` (default 1).

    Where the real server departs from that model, so can the simulation
    (``SimUpstream.realistic``): ``overhead`` plain steps of time per verify round that
    the counts do not show (each of a speculative request's ``n - a`` target steps);
    ``class_factors``, a class's decode time over the one plain step the engine fits for
    all traffic (longer contexts decode slower); ``stalls``, the share of requests that
    take 2-10x longer (heavy-tailed: a page fault, a neighbour on the CPU).
    ``true_speedup`` is then what a variant really gives, not what its counts say."""

    def __init__(
        self,
        speedups: Mapping[str, Mapping[str, float]],
        *,
        noise: float = 0.04,
        baseline_noise: float | None = None,
        count_noise: float = 0.05,
        cost: float = 0.45,
        costs: Mapping[str, float] | None = None,
        class_costs: Mapping[str, Mapping[str, float]] | None = None,
        bases: Mapping[str, float] | None = None,
        overhead: float = 0.0,
        class_factors: Mapping[str, float] | None = None,
        stalls: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.speedups = {k: dict(v) for k, v in speedups.items()}
        self.noise = noise
        self.baseline_noise = noise if baseline_noise is None else baseline_noise
        self.count_noise = count_noise
        self.cost = cost
        self.costs = dict(costs or {})
        self.class_costs = {k: dict(v) for k, v in (class_costs or {}).items()}
        self.bases = dict(bases or {})
        self.overhead = overhead
        self.class_factors = dict(class_factors or {})
        self.stalls = stalls
        self.rng = random.Random(seed)
        self.count = 0

    @classmethod
    def realistic(
        cls, speedups: Mapping[str, Mapping[str, float]], *, seed: int = 0, **kw: Any
    ) -> SimUpstream:
        """A ground truth that differs from the engine's model as a real server does: 6 %
        of a step per verify round, each class 6-12 % faster or slower than the step
        fitted for all traffic, and 2 % of requests stalled."""
        rng = random.Random(seed + 1)
        factors = {key: 1.0 + rng.choice((-1.0, 1.0)) * rng.uniform(0.06, 0.12) for key in speedups}
        return cls(speedups, overhead=0.06, class_factors=factors, stalls=0.02, seed=seed, **kw)

    def _cost(self, class_key: str, variant: str) -> float:
        return self.class_costs.get(class_key, {}).get(variant, self.costs.get(variant, self.cost))

    def nominal_speedup(self, class_key: str, variant: str) -> float:
        """The speedup a variant's counts say (the engine's model of it)."""
        return 1.0 if variant == "none" else self.speedups[class_key].get(variant, 0.9)

    def true_speedup(self, class_key: str, variant: str) -> float:
        """What the variant really gives: its counts' time plus the rounds' overhead."""
        s = self.nominal_speedup(class_key, variant)
        if variant == "none" or not self.overhead:
            return s
        n = 64
        drafted = self._drafted(n, s, self._cost(class_key, variant))
        rounds = n / s - self._cost(class_key, variant) * drafted  # n - a, on average
        return n / (n / s + self.overhead * rounds)

    @staticmethod
    def _drafted(n: int, s: float, c: float) -> int:
        # enough drafts that the accepted count fits in [0, d]
        return max(48, math.ceil(n * (1 / s - 1) / c), math.ceil(n * (1 - 1 / s) / (1 - c)))

    def counts(self, class_key: str, variant: str, n: int = 64) -> tuple[int, int, float]:
        """Drafted and accepted tokens of one request, and the time they take in plain
        steps (the rounds' overhead included)."""
        s = self.nominal_speedup(class_key, variant)
        c = self._cost(class_key, variant)
        drafted = self._drafted(n, s, c)
        mean = n + c * drafted - n / s
        accepted = round(mean + self.rng.gauss(0.0, self.count_noise * drafted))
        accepted = min(drafted, max(0, accepted))
        steps = n - accepted + c * drafted + self.overhead * (n - accepted)
        return drafted, accepted, n / steps

    def answer(self, class_key: str, decision: Decision) -> RequestRecord:
        self.count += 1
        n = 64
        timings: dict[str, float | int] = {"predicted_n": n}
        s = 1.0
        if decision.variant != "none":
            drafted, accepted, s = self.counts(class_key, decision.variant, n)
            timings |= {"draft_n": drafted, "draft_n_accepted": accepted}
        spread = self.baseline_noise if decision.variant == "none" else self.noise
        base = BASE_TOK_S * self.bases.get(class_key, 1.0) / self.class_factors.get(class_key, 1.0)
        tok_s = base * s * self.rng.lognormvariate(0.0, spread)
        if self.stalls and self.rng.random() < self.stalls:
            tok_s /= min(10.0, 2.0 * self.rng.paretovariate(1.5))
        timings |= {"predicted_ms": 1000 * n / tok_s, "predicted_per_second": tok_s}
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
            role=decision.role,
        )


def drive(engine: Engine, sim: SimUpstream, schedule: list[str]) -> list[Decision]:
    """Send one request per class key in ``schedule``; the decisions made."""
    out = []
    for class_key in schedule:
        decision = engine.route(class_key)
        engine.observe(sim.answer(class_key, decision))
        out.append(decision)
    return out


def evidence(engine: Engine) -> dict[str, Any]:
    """Every class's evidence per variant: counts and the replayed rows."""
    return {
        key: {
            name: (a.requests, a.tokens, a.drafted, a.accepted, list(a.replays))
            for name, a in sorted(s.arms.items())
        }
        for key, s in sorted(engine.classes.items())
    }
