"""The policy side of the engine: each class's policy from its evidence, and whose policy
serves it.

A class's own policy comes from the guard over its measurements (``tuner.tuning.policy.guard``),
an override, or the prior's kill-switch verdict. A class whose own policy is not settled
(it rests on no evidence or verdict yet) is served, until it has finished a trial of its
own, by the nearest settled policy along ``levels(key)`` (``code/echo/greedy`` ->
``code/echo`` -> ``code`` -> ``all``; a sampled class looks at ``*/sampled`` first), unless
its own requests already measured that variant slower than its baseline. Every request
counts at every level, so the levels learn first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from tuner.classify.classes import ROOT
from tuner.logs import get_logger
from tuner.model.speedup import CostModel
from tuner.tuning.config import Override, TuningConfig
from tuner.tuning.evidence.classes import ClassState, levels
from tuner.tuning.policy.guard import Best, Policy, choose, measured_policy, off_reason
from tuner.tuning.policy.prior import PriorView, rank
from tuner.tuning.pricing.prices import Pricing
from tuner.tuning.variants import BASELINE, Variant

__all__ = ["Rules"]

log = get_logger(__name__)


class Rules:
    """Policies over the classes' evidence. Holds no lock: the engine that owns it calls
    every method under its own."""

    def __init__(
        self,
        config: TuningConfig,
        variants: dict[str, Variant],
        classes: dict[str, ClassState],
        pricing: Pricing,
        cost: CostModel,
        draft_step: float,
        *,
        clock: Callable[[], float],
        excluded: Callable[[str], bool],
    ) -> None:
        self.config = config
        self.variants = variants
        self.classes = classes
        self.pricing = pricing
        self.cost = cost
        self.draft_step = draft_step
        self.clock = clock
        self.excluded = excluded  # variants that cannot run now (``runtime.quarantine``)
        self._overrides: dict[str, Override] = {}  # per class key; the config is frozen

    def configure(self, config: TuningConfig) -> list[str]:
        """Apply an edited tuning file (SIGHUP): budget, guard, prior and overrides at once;
        the sections that changed.

        The search space stays: its variants are llama-server presets fixed at start, so a
        changed space is kept for the next start (and said so).
        """
        old = self.config
        if config.search != old.search:
            log.warning(
                "tuning_search_needs_restart",
                detail="search-space changes apply at the next start",
            )
            config = config.model_copy(update={"search": old.search})
        overrides = {}
        for key, override in config.overrides.items():
            if override.pin is not None and override.pin not in self.variants:
                log.warning(
                    "tuning_pin_needs_restart",
                    class_key=key,
                    pin=override.pin,
                    detail="not among the running variants; applies at next start",
                )
                override = override.model_copy(update={"pin": None})
            overrides[key] = override
        config = config.model_copy(update={"overrides": overrides})
        changed = [
            name
            for name in ("budget", "guard", "prior", "overrides")
            if getattr(config, name) != getattr(old, name)
        ]
        self.config = config
        self.pricing.configure(config.guard.confidence)
        self._overrides.clear()
        for state in self.classes.values():
            if "prior" in changed:
                state.prior = self.rank(state.key)
            self.decide(state)
        return changed

    def state(self, key: str) -> ClassState:
        state = self.classes.get(key)
        if state is None:
            state = self.classes[key] = ClassState(key)
            state.prior = self.rank(key)
            state.policy = self._policy(state)
        return state

    def rank(self, key: str) -> PriorView:
        return rank(
            key, list(self.variants.values()), self.config.prior, self.cost, self.draft_step
        )

    def decide_all(self, key: str) -> bool:
        changed = False
        for level in levels(key):
            changed |= self.decide(self.state(level))
        return changed

    def decide(self, state: ClassState) -> bool:
        """Re-compute one class's policy from its evidence; True if the variant changed."""
        old = state.policy
        new = self._policy(state)
        if old is not None and old.variant == new.variant and old.kill_switch == new.kill_switch:
            new = new.model_copy(update={"since": old.since})
        state.policy = new
        if old is None or old.variant != new.variant:
            log.info("policy", class_key=state.key, variant=new.variant, reason=new.reason)
            state.switches += old is not None
            return True
        return False

    def _best(self, state: ClassState) -> Best:
        base = self.pricing.base(state)
        if base is None:
            return Best(None, None, None)
        need = self.config.budget.min_trial_requests
        # one pricing of the drafted tokens serves both the intervals and the paired check
        costs = self.pricing.costs(self.pricing.priced(state, need), state.key)
        speedups = self.pricing.speedups(state, base, need, costs)
        state.speedups = {name: found.value for name, found in speedups.items()}
        allowed = {
            name
            for name in speedups
            if not self.forbidden(state.key, name) and not self.excluded(name)
        }
        held = state.policy.variant if state.policy is not None else None
        gain = self.config.guard.min_gain
        # only a variant that clears the guard may move the class: price those alone
        rivals = {n for n in allowed if speedups[n].low > 1.0 and speedups[n].value >= gain}
        over_held = (
            self.pricing.paired(state, held, rivals, need, costs)
            if held in speedups and rivals - {held}
            else None
        )
        return choose(
            speedups,
            min_gain=gain,
            held=held,
            allowed=allowed,
            over_held=over_held,
        )

    def clears(self, state: ClassState) -> bool:
        """Whether some measured variant clears the guard in this class."""
        return self._best(state).chosen is not None

    def _policy(self, state: ClassState) -> Policy:
        now = self.clock()
        override = self.override(state.key)
        prior = state.prior
        if override.pin is not None and override.pin in self.variants:
            return Policy(
                class_key=state.key,
                variant=override.pin,
                speculation=override.pin != BASELINE.name,
                reason="pinned by override",
                override=True,
                settled=True,
                since=now,
            )
        if override.off:
            reason = "speculation forced off by override"
            return self._off(
                state, reason, override=True, kill_switch=True, settled=True, requests=0
            )
        best = self._best(state)
        if best.chosen is not None and best.interval is not None:
            name = best.chosen
            arm = state.arms[name]
            return measured_policy(
                state.key,
                name,
                best.interval,
                alpha=arm.alpha,
                requests=arm.requests,
                tokens_per_step=arm.tokens_per_step,
                predicted=prior.predicted(name) if prior else None,
                now=now,
                paired=best.paired,
            )
        predicted = prior.ranked[0][1] if prior and prior.ranked else None
        verdict = (
            prior.reason
            if prior is not None
            and not prior.pays
            and self.cost.structural
            and not self._refuted(state.key)
            else None
        )
        reason, kill, settled = off_reason(
            best.best_any, converged=state.converged, trials_done=state.trials_done, verdict=verdict
        )
        # a verdict, or variants measured slower, is shown beside the prior's prediction
        losing = best.best_any is not None and best.best_any[0] < 1.0
        extra = {"predicted_speedup": predicted} if kill or losing else {}
        return self._off(state, reason, kill_switch=kill, settled=settled, **extra)

    def _refuted(self, key: str) -> bool:
        """Whether a level above this class serves a variant that measured clear of the
        guard there: the prior's verdict is a guess from the cost model, and evidence this
        close says speculation pays, so the class borrows and searches instead."""
        for level in levels(key)[1:]:
            state = self.classes.get(level)
            policy = state.policy if state is not None else None
            if policy is not None and policy.speculation and policy.settled and not policy.override:
                return True
        return False

    def _off(self, state: ClassState, reason: str, **evidence: Any) -> Policy:
        """A no-speculation policy for a class (requests: the baseline's, unless given)."""
        base = state.arms.get(BASELINE.name)
        evidence.setdefault("requests", base.requests if base else 0)
        return Policy(
            class_key=state.key,
            variant=BASELINE.name,
            speculation=False,
            reason=reason,
            since=self.clock(),
            **evidence,
        )

    def effective_policy(self, key: str) -> tuple[str, Policy]:
        """The policy that serves a class, and whose it is.

        The class's own once it is settled on enough requests; until then, while the class
        has finished no trial of its own, the nearest parent's that is settled on enough
        requests (``may_borrow``); failing both, the class's own (or, with too few requests,
        the nearest parent's with enough, else the root's)."""
        need = self.config.budget.min_class_requests
        own = self.state(key)

        def lendable(level: str, policy: Policy) -> bool:
            return level == key or not policy.speculation or self.may_borrow(own, policy.variant)

        if own.policy is None:
            own.policy = self._policy(own)
        fallback: tuple[str, Policy] | None = None
        for level in levels(key):
            state = self.classes.get(level)
            if state is None or state.policy is None:
                continue
            policy = state.policy
            if policy.override:
                return level, policy
            enough = state.measured >= need
            if not lendable(level, policy):
                continue
            if enough and fallback is None:
                fallback = (level, policy)
            if enough and (policy.settled or state.converged):
                return level, policy
        if own.measured >= need:
            return key, own.policy
        if fallback is not None:
            return fallback
        root = self.state(ROOT).policy
        if root is not None and lendable(ROOT, root):
            return ROOT, root
        return key, own.policy

    def may_borrow(self, state: ClassState, variant: str) -> bool:
        """Whether a class may be served a parent's speculative ``variant``: only before it
        has finished a trial of its own, and unless it already measured that variant slower
        than its own baseline."""
        if state.trials_done > 0:
            return False
        arm, base = state.arms.get(variant), self.pricing.base(state)
        if arm is None or base is None or arm.known < self.config.budget.min_trial_requests:
            return True
        return self.pricing.arm_speedup(state.key, variant, arm, base).value >= 1.0

    def override(self, key: str) -> Override:
        found = self._overrides.get(key)
        if found is None:
            found = self._overrides[key] = self.config.override_for(key)
        return found

    def forbidden(self, key: str, variant: str) -> bool:
        return (
            variant in self.variants
            and self.variants[variant].spec_type in self.override(key).forbid
        )

    def space(self, key: str) -> dict[str, dict[str, list[Any]]]:
        """The configured search space minus forbidden or unbuildable spec types, with the
        engine's own autotune as a setting of the types it tunes where it has one."""
        types = {v.spec_type for v in self.variants.values() if v.speculative}
        tuned = {v.spec_type for v in self.variants.values() if v.autotuned}
        forbid = set(self.override(key).forbid)
        return {
            t: {p: list(vals) for p, vals in space.items()}
            | ({"autotune": [0, 1]} if t in tuned else {})
            for t, space in sorted(self.config.search.items())
            if t in types and t not in forbid
        }

    def class_speedups(self, classes: Iterable[str]) -> dict[str, dict[str, float]]:
        """Per class, each speculative variant's measured speedup over its baseline: the
        class's own evidence, else its nearest parent's (enough requests of both)."""
        need = self.config.budget.min_trial_requests
        out: dict[str, dict[str, float]] = {}
        for key in classes:
            found: dict[str, float] = {}
            for level in levels(key):
                state = self.classes.get(level)
                for name, s in (self.pricing.measured(state, need) if state else {}).items():
                    found.setdefault(name, s.value)
            out[key] = found
        return out
