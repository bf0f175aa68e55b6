"""What the engine knows per class: each variant's evidence, the running trial, the counters.

A request counts as evidence in its class and in every level above it (``levels``), so
parent classes learn from all their children's traffic and can lend a policy to a class
that has not measured its own yet. The classes' evidence is persisted in the policy file
(``dump_class`` / ``parse_class``); a running trial is not (its study fails it at the
next start).
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, NonNegativeInt

from tuner.classify.classes import parents
from tuner.stats import Interval, wilson
from tuner.tuning.evidence.counts import Counts, StoredCounts
from tuner.tuning.evidence.load import Load, LoadRecord
from tuner.tuning.policy.guard import Policy
from tuner.tuning.policy.prior import PriorView
from tuner.tuning.variants import BASELINE, Variant

__all__ = [
    "PAIRS",
    "SAMPLED",
    "SAMPLES",
    "Arm",
    "ArmRecord",
    "ClassRecord",
    "ClassState",
    "Trial",
    "levels",
    "parse_class",
    "under",
]

SAMPLES = 256  # requests kept per (class, variant)
PAIRS = 128  # replayed requests kept per class with every variant's counts side by side
SAMPLED = "*/sampled"  # every sampled class's evidence, pooled


def levels(key: str) -> list[str]:
    """Where a request of this class counts as evidence, and where the class looks for a
    policy to borrow, nearest first: the class, then (for a sampled class) all sampled
    traffic pooled, then its parents.

    Sampling is the third part of a class key, so a sampled class's parents are mostly
    greedy traffic, which accepts far more drafts; the pooled sampled evidence is the
    nearest of its kind after the sampled class itself.

    >>> levels("code/echo/sampled")
    ['code/echo/sampled', '*/sampled', 'code/echo', 'code', 'all']
    >>> levels("code/echo/greedy")
    ['code/echo/greedy', 'code/echo', 'code', 'all']
    """
    chain = list(dict.fromkeys(parents(key)))
    if key != SAMPLED:
        sampled = [i for i, level in enumerate(chain) if level.endswith("/sampled")]
        if sampled:
            chain.insert(sampled[-1] + 1, SAMPLED)
    return chain


def under(key: str, leaf: str) -> bool:
    """Whether a request of class ``leaf`` counts as evidence in class ``key``.

    >>> under("code/echo", "code/echo/greedy"), under("*/sampled", "code/echo/greedy")
    (True, False)
    """
    return key in _levels_of(leaf)


@functools.lru_cache(maxsize=1024)
def _levels_of(leaf: str) -> frozenset[str]:
    return frozenset(levels(leaf))


@dataclass(slots=True)
class Arm:
    """Evidence for one variant in one class: what it served, and what replays of other
    variants' requests say it would have drafted and accepted."""

    requests: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))  # tok/s
    # the counts of each served request, beside its speed in ``samples``
    served: deque[Counts] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    replayed: int = 0
    replays: deque[Counts] = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def add(self, tok_s: float, counts: Counts) -> None:
        self.requests += 1
        self.tokens += counts.tokens
        self.drafted += counts.drafted
        self.accepted += counts.accepted
        self.samples.append(tok_s)
        self.served.append(counts)

    def add_replayed(self, counts: Counts) -> None:
        self.replayed += 1
        self.replays.append(counts)

    @property
    def known(self) -> int:
        """Requests measured: served, or replayed."""
        return self.requests + self.replayed

    @property
    def alpha(self) -> Interval | None:
        return wilson(
            self.accepted + sum(c.accepted for c in self.replays),
            self.drafted + sum(c.drafted for c in self.replays),
        )

    @property
    def tokens_per_step(self) -> float:
        if not self.requests and self.replays:
            n, a = sum(c.tokens for c in self.replays), sum(c.accepted for c in self.replays)
            return n / max(n - a, 1)
        return self.tokens / max(self.tokens - self.accepted, 1)

    @property
    def counts(self) -> list[Counts]:
        """The counts of the kept served requests."""
        return [c for c in self.served if c.tokens > 0]

    @property
    def evidence(self) -> list[Counts]:
        """The kept counts, served and replayed."""
        return [*self.counts, *self.replays]

    def record(self) -> ArmRecord:
        return ArmRecord(
            requests=self.requests,
            tokens=self.tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            samples=list(self.samples),
            served=list(self.served),
            replayed=self.replayed,
            replays=list(self.replays),
        )

    def dump(self) -> dict[str, Any]:
        return self.record().model_dump(mode="json")

    @classmethod
    def of(cls, found: ArmRecord) -> Arm:
        arm = cls(found.requests, found.tokens, found.drafted, found.accepted)
        arm.samples.extend(found.samples)
        arm.served.extend(found.served)
        arm.replayed = found.replayed
        arm.replays.extend(found.replays)
        return arm

    @classmethod
    def load(cls, data: object) -> Arm:
        """An arm as ``dump`` wrote it; raises ValueError on another shape."""
        return cls.of(ArmRecord.model_validate(data))


class ArmRecord(BaseModel):
    """An arm as the policy file stores it."""

    model_config = ConfigDict(extra="forbid")

    requests: NonNegativeInt
    tokens: NonNegativeInt
    drafted: NonNegativeInt
    accepted: NonNegativeInt
    samples: list[float]
    served: list[StoredCounts]
    replayed: NonNegativeInt
    replays: list[StoredCounts]


class PromptRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cached: NonNegativeInt
    processed: NonNegativeInt
    seconds: float


class TurnsRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stayed: NonNegativeInt = 0
    moved: dict[str, NonNegativeInt] = {}
    trials: NonNegativeInt = 0  # of those kept, turns that ran a trial there


class ClassRecord(BaseModel):
    """A class as the policy file stores it: what ``ClassState.dump`` writes, and what the
    engine adds beside it for the report (``served_by``, ``prior``, ``speedups``), which is
    derived again on restore."""

    model_config = ConfigDict(extra="forbid")

    seen: NonNegativeInt
    explored: NonNegativeInt
    spent: float
    trials_done: NonNegativeInt
    converged: bool
    prompt: PromptRecord
    turns: TurnsRecord = TurnsRecord()  # absent from files written before conversations
    load: LoadRecord = LoadRecord()  # absent from files written before it was kept
    policy: Policy | None
    arms: dict[str, ArmRecord] = {}
    pairs: list[dict[str, StoredCounts]]
    served_by: str | None = None
    prior: dict[str, Any] | None = None
    speedups: dict[str, list[float]] | None = None


@dataclass(slots=True)
class Trial:
    """One Optuna trial being served: a variant and the counts of its requests so far."""

    number: int
    variant: Variant
    counts: list[Counts] = field(default_factory=list)


@dataclass(slots=True)
class ClassState:
    key: str
    seen: int = 0
    explored: int = 0
    trials_done: int = 0
    converged: bool = False
    switches: int = 0  # times the chosen variant changed (this process)
    spent: float = 0.0  # exploration cost, in requests at the served policy's speed
    stale: int = 0  # trials in a row that measured no better than the class's policy
    # prompt tokens of its answered requests: held by the server's cache, processed, and the
    # seconds processing took (a conversation that moved instance processes its history again)
    prompt_cached: int = 0
    prompt_processed: int = 0
    prompt_s: float = 0.0
    # conversations' later turns: kept on the instance that held their history, or moved
    # (by reason: the move paid, or the instance was unavailable)
    stayed: int = 0
    moved: dict[str, int] = field(default_factory=dict)
    turn_trials: int = 0  # kept turns that ran a trial on the instance holding them
    load: Load = field(default_factory=Load)  # in flight as they arrived, gate waits, joins
    trial: Trial | None = None
    preparing: bool = False  # a trial is being asked for on the IO thread
    arms: dict[str, Arm] = field(default_factory=dict)
    # per replayed request, the counts of every variant that measured it (the served one's
    # from the server): two variants compared on the same requests (``Pricing.paired``)
    pairs: deque[dict[str, Counts]] = field(default_factory=lambda: deque(maxlen=PAIRS))
    policy: Policy | None = None
    prior: PriorView | None = None
    speedups: dict[str, float] | None = None  # as last priced to decide its policy

    def arm(self, name: str) -> Arm:
        found = self.arms.get(name)
        if found is None:
            found = self.arms[name] = Arm()
        return found

    @property
    def measured(self) -> int:
        return sum(a.requests for a in self.arms.values())

    @property
    def baseline_requests(self) -> int:
        """Requests this class has observed without speculation."""
        base = self.arms.get(BASELINE.name)
        return base.requests if base is not None else 0

    def counters(self) -> ClassState:
        """A copy of the counters alone (for summaries read off the engine's lock)."""
        return ClassState(
            self.key,
            seen=self.seen,
            explored=self.explored,
            trials_done=self.trials_done,
            converged=self.converged,
            switches=self.switches,
            spent=self.spent,
            prompt_cached=self.prompt_cached,
            prompt_processed=self.prompt_processed,
            prompt_s=self.prompt_s,
            stayed=self.stayed,
            moved=dict(self.moved),
            turn_trials=self.turn_trials,
            load=self.load.copy(),
        )

    def count_turn(self, outcome: str, role: str | None = None) -> None:
        """A request's session outcome (``new``, ``stayed`` or ``moved:<reason>``) and its
        routing role (a kept turn may run a trial in place)."""
        if outcome == "stayed":
            self.stayed += 1
            self.turn_trials += role == "trial"
        elif outcome.startswith("moved:"):
            reason = outcome.removeprefix("moved:")
            self.moved[reason] = self.moved.get(reason, 0) + 1

    def dump(self) -> dict[str, Any]:
        """The persisted part (the policy file's entry adds what the engine derives)."""
        return ClassRecord(
            seen=self.seen,
            explored=self.explored,
            spent=round(self.spent, 4),
            trials_done=self.trials_done,
            converged=self.converged,
            prompt=PromptRecord(
                cached=self.prompt_cached,
                processed=self.prompt_processed,
                seconds=round(self.prompt_s, 3),
            ),
            turns=TurnsRecord(stayed=self.stayed, moved=dict(self.moved), trials=self.turn_trials),
            load=self.load.record(),
            policy=self.policy,
            arms={name: arm.record() for name, arm in self.arms.items()},
            pairs=[dict(row) for row in self.pairs],
        ).model_dump(mode="json", exclude={"served_by", "prior", "speedups"})


def parse_class(key: str, data: object) -> ClassState:
    """One class of a policy file, parsed; raises (ValueError) on a malformed entry."""
    found = ClassRecord.model_validate(data)
    return ClassState(
        key,
        seen=found.seen,
        explored=found.explored,
        spent=found.spent,
        trials_done=found.trials_done,
        converged=found.converged,
        prompt_cached=found.prompt.cached,
        prompt_processed=found.prompt.processed,
        prompt_s=found.prompt.seconds,
        stayed=found.turns.stayed,
        moved=dict(found.turns.moved),
        turn_trials=found.turns.trials,
        load=Load.of(found.load),
        arms={name: Arm.of(arm) for name, arm in found.arms.items()},
        pairs=deque(found.pairs, maxlen=PAIRS),
        policy=found.policy,
    )
