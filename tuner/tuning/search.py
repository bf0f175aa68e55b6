"""The trial search of one class, over its Optuna study (runs on the engine's IO thread).

Which variant a class tries next: first a variant a parent class measured best and this
class has not measured (siblings' findings are confirmed before anything new); then, for
the first ``prior.enqueue`` trials, the prior's best that no parent measured slower than
baseline, skipping what other classes are trying or the parents measured already (so
siblings cover the prior's list together); then the study's TPE. A trial serves
``trial_requests`` requests, or stops after ``min_trial_requests`` when its whole speedup
interval lies below 1; its speedup is told to the study. A class's search ends
(converged) after ``max_trials`` trials, or after ``patience`` trials in a row that
measured no better than its policy.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

from tuner.logs import get_logger
from tuner.tuning.config import TuningConfig
from tuner.tuning.evidence import ClassState, Trial, levels
from tuner.tuning.pooling import Event, trial_done
from tuner.tuning.pricing import Pricing
from tuner.tuning.prior import PriorView
from tuner.tuning.studies import Space, StudyBook
from tuner.tuning.variants import Variant

__all__ = ["Host", "TrialSearch"]

log = get_logger(__name__)

ASKS = 8  # study asks per trial, telling each already measured variant its value


class Host(Protocol):
    """What the search needs of the engine that owns the classes."""

    config: TuningConfig

    @property
    def classes(self) -> Mapping[str, ClassState]: ...

    def state(self, key: str) -> ClassState: ...
    def excluded(self, variant: str) -> bool: ...
    def space(self, key: str) -> dict[str, dict[str, list[Any]]]: ...
    def clears(self, state: ClassState) -> bool: ...
    def decide_all(self, key: str) -> bool: ...
    def changed(self) -> None: ...
    def own(self, event: Event) -> None: ...


class TrialSearch:
    def __init__(
        self,
        host: Host,
        pricing: Pricing,
        variants: Mapping[str, Variant],
        studies: StudyBook,
        lock: threading.RLock,
    ) -> None:
        self.host = host
        self.pricing = pricing
        self.variants = variants
        self.studies = studies
        self.lock = lock
        self._opened: set[str] = set()  # classes whose study this process has used

    def trial_done(self, state: ClassState, trial: Trial) -> bool:
        """Whether a trial has served enough (caller holds the lock)."""
        budget = self.host.config.budget
        n = len(trial.counts)
        if n >= budget.trial_requests:
            return True
        if n >= budget.min_trial_requests:
            found = self.pricing.trial_speedup(state, trial)
            return found is not None and found.high < 1.0
        return False

    def next_trial(self, key: str) -> None:
        """Ask the class's study for its next trial (IO thread)."""
        host = self.host
        space = host.space(key)
        try:
            with self.lock:
                state = host.state(key)
                first = key not in self._opened
                self._opened.add(key)
            if not space:
                with self.lock:
                    state.converged = True
                return
            if first:
                self.studies.fail_running(key, space)  # a trial a killed process left
            with self.lock:
                pick = self.suggest(key, space, state.prior)
            if pick is not None:
                self.studies.enqueue(key, space, [pick])
            number, variant = self._ask_new(key, space)
            if self.host.excluded(variant.name):
                self.abandon(key, Trial(number, variant))
                return
            with self.lock:
                if variant.name in self.variants:
                    state.trial = Trial(number, variant)
        except Exception:
            log.exception("tuning_ask_failed", class_key=key)
        finally:
            with self.lock:
                host.state(key).preparing = False

    def suggest(self, key: str, space: Space, prior: PriorView | None) -> Variant | None:
        """The next trial to put ahead of the study's own choice, if any (caller holds the
        lock): a parent's best that this class has not measured, else one of the prior's
        first picks (see the module's docstring)."""
        budget, guard = self.host.config.budget, self.host.config.guard
        state = self.host.state(key)
        classes = self.host.classes

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
        if prior is None or state.trials_done >= self.host.config.prior.enqueue:
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

    def _ask_new(self, key: str, space: Space) -> tuple[int, Variant]:
        """The study's next variant. One this class has already measured over a trial's worth
        of requests is told its value at once and the study asked again, up to ``ASKS``
        times; then the last answer runs again."""
        budget = self.host.config.budget
        for attempt in range(ASKS):
            number, variant = self.studies.ask(key, space)
            with self.lock:
                state = self.host.state(key)
                arm, base = state.arms.get(variant.name), self.pricing.base(state)
                value = None
                if arm is not None and base is not None and arm.known >= budget.trial_requests:
                    value = self.pricing.arm_speedup(key, variant.name, arm, base).value
            if value is None or attempt == ASKS - 1:
                return number, variant
            self.studies.tell(key, space, number, value, attrs={"reused": True})
        raise AssertionError("unreachable: the last ask returns")

    def abandon(self, key: str, trial: Trial) -> None:
        """A trial whose variant cannot run (quarantined): failed in its study (IO thread)."""
        try:
            attrs = {"variant": trial.variant.name, "quarantined": True}
            self.studies.tell(key, self.host.space(key), trial.number, None, attrs=attrs)
        except Exception:
            log.exception("tuning_tell_failed", class_key=key)
        log.info("trial_abandoned", class_key=key, variant=trial.variant.name)

    def finish_trial(self, key: str, trial: Trial) -> None:
        """Tell the study, re-decide, and ask for the class's next trial (IO thread)."""
        host = self.host
        budget = host.config.budget
        with self.lock:
            state = host.state(key)
            found = self.pricing.trial_speedup(state, trial)
            served = len(trial.counts)
            pruned = found is not None and found.high < 1.0 and served < budget.trial_requests
            bar = state.policy.gain if state.policy else 1.0
            state.stale = 0 if found is not None and found.value > bar else state.stale + 1
            done = state.trials_done + 1 >= self.max_trials(state)
            host.own(
                trial_done(key, trial.variant.name, done or 0 < budget.patience <= state.stale)
            )
            host.decide_all(key)
        attrs: dict[str, Any] = {"requests": served, "variant": trial.variant.name}
        if found is not None:
            attrs |= {"speedup": found.value, "speedup_low": found.low, "speedup_high": found.high}
        try:
            value = found.value if found else None
            self.studies.tell(key, host.space(key), trial.number, value, pruned=pruned, attrs=attrs)
        except Exception:
            log.exception("tuning_tell_failed", class_key=key)
        log.info(
            "trial_finished",
            class_key=key,
            variant=trial.variant.name,
            speedup=round(found.value, 3) if found else None,
            requests=served,
            pruned=pruned,
        )
        host.changed()
        if not state.converged:
            with self.lock:
                if state.preparing:
                    return
                state.preparing = True
            self.next_trial(key)

    def max_trials(self, state: ClassState) -> int:
        """Trials before a class is converged: the budget's, or, while the prior's verdict
        (structural cost, nothing can pay) still holds, only enough to check its best few."""
        config = self.host.config
        limit = config.budget.max_trials
        policy = state.policy
        verdict = policy is not None and policy.kill_switch and not policy.override
        if verdict and not self.host.clears(state):
            limit = min(limit, max(1, config.prior.enqueue))
        return limit
