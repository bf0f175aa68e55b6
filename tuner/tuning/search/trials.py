"""The trial search of one class: what to try next, when a trial is done, what it found.

Which variant a class tries next: first a variant a parent class measured best and this
class has not measured (siblings' findings are confirmed before anything new); then, for
the first ``prior.enqueue`` trials, the prior's best that no parent measured slower than
baseline, skipping what other classes are trying or the parents measured already (so
siblings cover the prior's list together); then the study's TPE. A trial serves
``trial_requests`` requests, or stops after ``min_trial_requests`` when its whole speedup
interval lies below 1; its speedup is told to the study. A class's search ends
(converged) after ``max_trials`` trials, or after ``patience`` trials in a row that
measured no better than its policy.

Every function here reads the engine's state under the engine's lock and returns plain
values (``Ask``, ``Outcome``); the study itself (``tuner.tuning.search.studies``) is asked
and told off the lock, on the engine's IO thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.tuning.config import TuningConfig
from tuner.tuning.evidence.classes import ClassState, Trial, levels
from tuner.tuning.pricing.prices import Pricing
from tuner.tuning.search.studies import Space
from tuner.tuning.variants import Variant

__all__ = ["Ask", "Outcome", "TrialSearch"]


@dataclass(frozen=True, slots=True)
class Ask:
    """What asking a class's study for its next trial needs."""

    space: Space
    suggest: Variant | None  # put ahead of the study's own choice
    known: dict[str, float] = field(default_factory=dict)  # measured already: speedups


@dataclass(frozen=True, slots=True)
class Outcome:
    """A finished trial, as its study is told and the class counts it."""

    value: float | None
    pruned: bool
    converged: bool  # the class stops searching
    attrs: dict[str, Any]


class TrialSearch:
    """The search's rules over a class's evidence (the caller holds the engine's lock)."""

    def __init__(self, pricing: Pricing, variants: Mapping[str, Variant]) -> None:
        self.pricing = pricing
        self.variants = variants

    def trial_done(self, config: TuningConfig, state: ClassState, trial: Trial) -> bool:
        """Whether a trial has served enough."""
        budget = config.budget
        n = len(trial.counts)
        if n >= budget.trial_requests:
            return True
        if n >= budget.min_trial_requests:
            found = self.pricing.trial_speedup(state, trial)
            return found is not None and found.high < 1.0
        return False

    def ask(
        self,
        config: TuningConfig,
        state: ClassState,
        classes: Mapping[str, ClassState],
        space: Space,
    ) -> Ask:
        """What the class's study is asked next: a suggestion, and the variants this class
        has measured over a trial's worth of requests already (told at once, not served)."""
        known: dict[str, float] = {}
        base = self.pricing.base(state)
        if base is not None:
            known = {
                name: self.pricing.arm_speedup(state.key, name, arm, base).value
                for name, arm in state.arms.items()
                if name in self.variants and arm.known >= config.budget.trial_requests
            }
        return Ask(space, self.suggest(config, state, classes, space), known)

    def suggest(
        self,
        config: TuningConfig,
        state: ClassState,
        classes: Mapping[str, ClassState],
        space: Space,
    ) -> Variant | None:
        """The next trial to put ahead of the study's own choice, if any: a parent's best
        that this class has not measured, else one of the prior's first picks (see the
        module's docstring)."""
        budget, guard = config.budget, config.guard
        key, prior = state.key, state.prior

        def candidate(name: str) -> bool:
            variant = self.variants.get(name)
            if variant is None or not variant.speculative or variant.spec_type not in space:
                return False
            arm = state.arms.get(name)
            return arm is None or arm.known < budget.min_trial_requests

        above = [classes[lv] for lv in levels(key) if lv != key and lv in classes]
        losing: set[str] = set()
        for parent in above:
            base = self.pricing.base(parent)
            if base is None:
                continue
            scored = []
            for name, found in self.pricing.speedups(
                parent, base, budget.min_trial_requests
            ).items():
                if found.value < 1.0:
                    losing.add(name)
                elif found.low > 1.0 and found.value >= guard.min_gain and candidate(name):
                    scored.append((found.value, name))
            if scored:
                return self.variants[max(scored)[1]]
        if prior is None or state.trials_done >= config.prior.enqueue:
            return None
        # what another class is trying now, or a parent has measured, is left to them
        elsewhere = {s.trial.variant.name for s in classes.values() if s.trial is not None}
        elsewhere |= {
            name
            for parent in above
            for name, arm in parent.arms.items()
            if arm.known >= budget.min_trial_requests
        }
        picks = [v for v, _ in prior.ranked if candidate(v.name) and v.name not in losing]
        return next((v for v in picks if v.name not in elsewhere), picks[0] if picks else None)

    def outcome(
        self,
        config: TuningConfig,
        state: ClassState,
        trial: Trial,
        clears: Callable[[ClassState], bool],
    ) -> Outcome:
        """What a finished trial found; counts it in the class's run of trials that measured
        no better than its policy (``clears``: whether some measured variant clears the
        guard in a class, asked only while the prior's verdict holds)."""
        budget = config.budget
        found = self.pricing.trial_speedup(state, trial)
        served = len(trial.counts)
        pruned = found is not None and found.high < 1.0 and served < budget.trial_requests
        bar = state.policy.gain if state.policy else 1.0
        state.stale = 0 if found is not None and found.value > bar else state.stale + 1
        done = state.trials_done + 1 >= self.max_trials(config, state, clears)
        attrs: dict[str, Any] = {"requests": served, "variant": trial.variant.name}
        if found is not None:
            attrs |= {"speedup": found.value, "speedup_low": found.low, "speedup_high": found.high}
        return Outcome(
            value=found.value if found else None,
            pruned=pruned,
            converged=done or 0 < budget.patience <= state.stale,
            attrs=attrs,
        )

    @staticmethod
    def max_trials(
        config: TuningConfig, state: ClassState, clears: Callable[[ClassState], bool]
    ) -> int:
        """Trials before a class is converged: the budget's, or, while the prior's verdict
        (structural cost, nothing can pay) still holds, only enough to check its best few."""
        limit = config.budget.max_trials
        policy = state.policy
        verdict = policy is not None and policy.kill_switch and not policy.override
        if verdict and not clears(state):
            limit = min(limit, max(1, config.prior.enqueue))
        return limit
