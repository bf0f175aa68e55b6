"""The routing table: what the learner publishes for the request path to read (per class
the policy that serves it, its pin, the budget's counters, the running trial and its cost,
the conversation rule's inputs), and how the learner builds it from the evidence
(``table_of``) or counts routed requests into the last one (``recount``). Immutable: a
new table replaces the old by one assignment (``tuner.tuning.runtime.routing``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from tuner.tuning.config import Override, TuningConfig
from tuner.tuning.evidence.classes import ClassState, levels
from tuner.tuning.policy.guard import Policy
from tuner.tuning.pricing.prices import Pricing
from tuner.tuning.runtime.rules import Rules

__all__ = ["ClassRoute", "RouteTable", "Served", "recount", "table_of"]


@dataclass(frozen=True, slots=True)
class Served:
    """A policy as routing needs it: whose it is, its variant, and how firm it is."""

    policy_class: str
    variant: str
    speculation: bool
    settled: bool
    override: bool = False


@dataclass(frozen=True, slots=True)
class ClassRoute:
    """What routing needs of one class, as of the table it is in."""

    seen: int
    spent: float
    override: Override
    serves: Served  # the effective policy (``Rules.effective_policy``)
    own: Served | None  # the class's own policy, for classes below it without evidence
    enough: bool  # measured on enough requests to lend its policy
    converged: bool
    opening_ok: bool  # the opening variant may serve it (but for the quarantine)
    trial: tuple[str, int] | None  # the running trial's variant and number
    trial_cost: float  # what one trial request is expected to cost the budget
    wants_trial: bool  # a trial should be asked for (none running or being prepared)
    # the conversation rule's inputs (``sessions.moves``)
    plain: float | None  # decode tok/s without speculation
    prefill: float  # prompt tok/s
    answer: float | None  # the mean answer of its nearest level, in tokens
    speeds: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouteTable:
    """Everything routing reads, as of the ``applied``-th routed request the learner took."""

    config: TuningConfig
    variants: Mapping[str, str]  # name -> spec type
    classes: Mapping[str, ClassRoute]
    applied: int = 0
    seen_all: int = 0
    spent_all: float = 0.0
    anchors: int = 0  # plain requests routed, or observed in the root class
    opening: str | None = None
    searching: bool = False  # trials are asked of a study


def table_of(
    rules: Rules,
    pricing: Pricing,
    *,
    opening: str | None = None,
    applied: int = 0,
    anchors: int = 0,
    searching: bool = False,
    previous: RouteTable | None = None,
    priced: Collection[str] | None = None,
) -> RouteTable:
    """The table of the classes' evidence now (the learner holds its lock).

    The prices (speedups, a trial's cost, whether the opening variant may borrow) of the
    classes in ``priced`` are computed again, the others' kept from ``previous``; every
    class's policies and counters are read afresh. None prices every class."""
    config = rules.config
    need = config.budget.min_trial_requests
    levels_priced = None if priced is None else {lv for key in priced for lv in levels(key)}
    measured: dict[str, dict[str, float]] = {}

    def speeds_at(level: str) -> dict[str, float]:
        """A level's speedups: as its policy was last decided on them, unless every class
        is priced again."""
        found = measured.get(level)
        if found is None:
            state = rules.classes.get(level)
            if state is not None and state.speedups is not None and priced is not None:
                found = state.speedups
            else:
                intervals = pricing.measured(state, need) if state is not None else {}
                found = {name: i.value for name, i in intervals.items()}
            measured[level] = found
        return found

    classes = {}
    for key, state in list(rules.classes.items()):
        policy_class, policy = rules.effective_policy(key)
        trial = state.trial
        old = previous.classes.get(key) if previous is not None else None
        if old is None or levels_priced is None or key in levels_priced:
            speeds: dict[str, float] = {}
            for level in levels(key):
                for name, value in speeds_at(level).items():
                    speeds.setdefault(name, value)
            plain = pricing.baseline_speed(key)
            prices = _Prices(
                opening_ok=opening is not None and rules.may_borrow(state, opening),
                trial_cost=pricing.expected_cost(key, trial.variant.name, policy.gain, need)
                if trial is not None
                else 0.0,
                plain=plain,
                prefill=pricing.prefill_speed(plain) if plain is not None else 0.0,
                answer=pricing.mean_answer(key),
                speeds=speeds,
            )
        else:
            prices = _Prices(
                old.opening_ok, old.trial_cost, old.plain, old.prefill, old.answer, old.speeds
            )
        classes[key] = ClassRoute(
            seen=state.seen,
            spent=state.spent,
            override=rules.override(key),
            serves=_served(policy_class, policy),
            own=_served(key, state.policy) if state.policy is not None else None,
            enough=state.measured >= config.budget.min_class_requests,
            converged=state.converged,
            opening_ok=prices.opening_ok
            and not policy.speculation
            and not policy.settled
            and not rules.forbidden(key, opening or ""),
            trial=_trial(state),
            trial_cost=prices.trial_cost,
            wants_trial=_wants_trial(state, searching),
            plain=prices.plain,
            prefill=prices.prefill,
            answer=prices.answer,
            speeds=prices.speeds,
        )
    return RouteTable(
        config=config,
        variants={name: v.spec_type for name, v in rules.variants.items()},
        classes=classes,
        applied=applied,
        seen_all=sum(s.seen for s in rules.classes.values()),
        spent_all=sum(s.spent for s in rules.classes.values()),
        anchors=anchors,
        opening=opening,
        searching=searching,
    )


def recount(
    table: RouteTable, rules: Rules, routed: Collection[str], applied: int, anchors: int
) -> RouteTable:
    """``table`` with the counters of the classes ``routed`` read again: what the router's
    requests change (their seen and spent requests, a trial asked for or abandoned)."""
    classes = dict(table.classes)
    for key in routed:
        state = rules.classes[key]
        classes[key] = replace(
            classes[key],
            seen=state.seen,
            spent=state.spent,
            trial=_trial(state),
            wants_trial=_wants_trial(state, table.searching),
        )
    return replace(
        table,
        classes=classes,
        applied=applied,
        seen_all=sum(s.seen for s in rules.classes.values()),
        spent_all=sum(s.spent for s in rules.classes.values()),
        anchors=anchors,
    )


@dataclass(frozen=True, slots=True)
class _Prices:
    opening_ok: bool
    trial_cost: float
    plain: float | None
    prefill: float
    answer: float | None
    speeds: Mapping[str, float]


def _trial(state: ClassState) -> tuple[str, int] | None:
    trial = state.trial
    return (trial.variant.name, trial.number) if trial is not None else None


def _wants_trial(state: ClassState, searching: bool) -> bool:
    """A trial should be asked for: none running or being prepared, the class searching."""
    return searching and state.trial is None and not state.converged and not state.preparing


def _served(policy_class: str, policy: Policy) -> Served:
    return Served(
        policy_class, policy.variant, policy.speculation, policy.settled, override=policy.override
    )
