"""The tuning engine: per class, exploit the best-known variant, spend a bounded share on trials.

``route(class_key)`` is called on the request path and reads only the routing table the
engine last published (``tuner.tuning.runtime.routing``), never its lock: it returns the
variant to use and why (``exploit``, ``trial``, ``control``, ``pinned``).
``observe(record)`` is called after the response went back: it adds the request's counts
to the evidence of its class and every level above it (``tuner.tuning.evidence.classes``),
finishes trials and re-decides. ``observe_replayed`` adds what replays say other n-gram
variants would have done on it. Optuna is touched only through ``io`` (one background
thread in the daemon, inline in tests), never on the request path.

Per class:

- Budget: a request explores only while ``spent < explore_share * seen``, in its class and
  over all traffic (else every new class's first request could explore); ``spent`` is
  what exploring cost, in requests at the speed of the class's policy (a trial request
  at half that speed costs 1, one at least as fast costs nothing), so exploring is cheap
  where the variants tried are as fast as what the class runs and rare where they lose.
  A conversation's turn held on another variant than its class's (it stays where its
  history is cached) spends it too: an explored opening holds its conversation.
- Anchors: the first two requests of all traffic run without speculation; with every
  later request they fit one plain decode step's time (``tuner.tuning.pricing.prices``).
- Opening: until a trial's worth of speculative requests has been served, a class whose
  policy runs no speculation only for lack of evidence runs the variant with the highest
  lower bound on all traffic's counts (replays included), if its speedup is above 1, and
  before anything is measured the prior's best where the prior says speculation pays.
- Borrowing: a class whose own policy is not settled is served, until it finishes a trial
  of its own, by the nearest settled policy along ``levels(key)``.
- Search, guard and kill switch: ``tuner.tuning.search.trials`` and ``tuner.tuning.policy.guard``;
  drift: ``tuner.tuning.evidence.drift``.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tuner.classify.classes import ROOT
from tuner.logs import get_logger
from tuner.model.speedup import CostModel
from tuner.records import RequestRecord
from tuner.sessions.moves import Turn
from tuner.tuning.config import Override, TuningConfig
from tuner.tuning.evidence.classes import SAMPLED, ClassState, Trial, levels, parse_class
from tuner.tuning.evidence.counts import Counts, served_counts
from tuner.tuning.evidence.drift import drift
from tuner.tuning.policy.guard import Decision, Policy
from tuner.tuning.policy.prior import PriorView
from tuner.tuning.pricing.costfit import CostFit
from tuner.tuning.pricing.prices import Pricing
from tuner.tuning.pricing.waiting import Busy
from tuner.tuning.runtime.events import Event, Served, apply, replayed, served, trial_done
from tuner.tuning.runtime.routing import Router
from tuner.tuning.runtime.rules import Rules
from tuner.tuning.runtime.table import recount, table_of
from tuner.tuning.search.studies import StudyBook
from tuner.tuning.search.trials import TrialSearch
from tuner.tuning.variants import BASELINE, Variant

__all__ = ["SAMPLED", "Decision", "Engine", "Policy", "levels"]

log = get_logger(__name__)

IO = Callable[[Callable[[], None]], None]
REPRICE_EVERY = 32  # routing tables published between two that price every class again


def _inline(job: Callable[[], None]) -> None:
    job()


class Engine:
    """Per-class decisions on live traffic. Thread-safe: one lock around the evidence, which
    routing never takes (it reads ``router.table``)."""

    def __init__(
        self,
        config: TuningConfig,
        variants: Iterable[Variant],
        studies: StudyBook | None,
        *,
        cost: CostModel | None = None,
        draft_step: float = 0.0,
        io: IO = _inline,
        on_change: Callable[[Engine], None] | None = None,
        clock: Callable[[], float] = time.time,
        excluded: Callable[[str], bool] = lambda _: False,
        publish: Callable[[Event], None] | None = None,
    ) -> None:
        self.variants = {v.name: v for v in variants}
        self.variants.setdefault(BASELINE.name, BASELINE)
        self.studies = studies
        self.io = io
        self.on_change = on_change
        self.excluded = excluded  # variants that cannot run now (``runtime.quarantine``)
        self.publish = publish  # the fleet's outbox (``tuner.fleet``): called under the lock
        self.classes: dict[str, ClassState] = {}
        cost = cost or CostModel()
        self.pricing = Pricing(
            self.classes, self.variants, cost, draft_step, confidence=config.guard.confidence
        )
        self.rules = Rules(
            config,
            self.variants,
            self.classes,
            self.pricing,
            cost,
            draft_step,
            clock=clock,
            excluded=excluded,
        )
        self.search = TrialSearch(self.pricing, self.variants)
        # requests observed that speculated, and those routed without speculation
        self._served = self._plain_routed = 0
        self._opening: str | None = None  # what an unsettled class runs (``_open``)
        self._applied = 0  # the last routed request whose counters the classes hold
        self._tables = 0  # routing tables published
        self._priced: set[str] | None = set()  # classes to price again (None: all)
        self._lock = threading.RLock()
        self._open()
        self.router = Router(
            table_of(
                self.rules, self.pricing, opening=self._opening, searching=studies is not None
            ),
            excluded=excluded,
            notify=self._notify,
        )

    @property
    def config(self) -> TuningConfig:
        return self.rules.config

    @property
    def per_class(self) -> bool:
        """Each class routes to its own variant's instance (``tuner.Tuner``)."""
        return True

    def reevaluate(self) -> None:
        self.check_drift()

    def describe(self) -> dict[str, Any]:
        return {}

    @property
    def costfit(self) -> CostFit:
        return self.pricing.costfit

    # -- the request path (``routing``: reads the published table, no lock) -----------

    def route(
        self,
        class_key: str | None,
        turn: Turn | None = None,
        busy: Busy | None = None,
        *,
        opens: bool = False,
    ) -> Decision:
        """The variant for one request of this class (``Router.route``)."""
        return self.router.route(class_key, turn, busy, opens=opens)

    def _notify(self) -> None:
        self.io(self.drain)

    def drain(self) -> None:
        """Apply what the router queued and publish the next table."""
        with self._learning(()):
            pass

    @contextlib.contextmanager
    def _learning(self, touched: Iterable[str] | None = None) -> Iterator[None]:
        """The lock, the router's counters applied first, and the table published after:
        every change to the evidence runs inside one. ``touched``: the only classes whose
        evidence may change (their prices are computed again); None for any, and none for
        the router's counters alone."""
        with self._lock:
            routed = self._drain()
            try:
                yield
            finally:
                if touched == () and routed <= self.router.table.classes.keys():
                    self.router.table = recount(
                        self.router.table, self.rules, routed, self._applied, self._anchors()
                    )
                else:
                    if touched is None:
                        self._priced = None
                    elif self._priced is not None:
                        self._priced.update(touched)
                    self._publish()

    def _anchors(self) -> int:
        return max(self._plain_routed, self.rules.state(ROOT).baseline_requests)

    def _drain(self) -> set[str]:
        """The routed requests' counters into the classes (caller holds the lock); the
        classes routed."""
        router = self.router
        router.taken()
        routed: set[str] = set()
        while True:
            try:
                note = router.queue.get_nowait()
            except queue.Empty:
                return routed
            routed.add(note.key)
            state = self.rules.state(note.key)
            state.seen += 1
            self._plain_routed += note.plain
            self._applied = note.seq
            if note.explored:
                state.explored += 1
                state.spent += 1.0  # until observed (``Pricing.explore_cost``)
            trial = state.trial
            if note.abandon is not None and trial is not None and trial.number == note.abandon:
                state.trial = None  # it cannot run: its study hears so, the class moves on
                self.io(functools.partial(self._abandon, note.key, trial))
            if (
                (note.prepare or note.abandon is not None)
                and state.trial is None
                and not state.converged
                and not state.preparing
                and self.studies is not None
            ):
                state.preparing = True
                self.io(functools.partial(self._next_trial, note.key))

    def _publish(self) -> None:
        """Build the routing table from the evidence and swap it in (caller holds the
        lock). Prices move with the shared calibration too: every ``REPRICE_EVERY``
        tables, every class's are computed again."""
        self._tables += 1
        priced = None if self._tables % REPRICE_EVERY == 0 else self._priced
        self.router.table = table_of(
            self.rules,
            self.pricing,
            opening=self._opening,
            applied=self._applied,
            anchors=self._anchors(),
            searching=self.studies is not None,
            previous=self.router.table,
            priced=priced,
        )
        self._priced = set()

    # -- learning ---------------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        """Add one finished request to the evidence; finish its trial when due."""
        t = record.timings
        if record.variant is None or record.status != 200 or record.error or t is None:
            return
        key = record.class_key or ROOT
        with self._learning((key,)):
            state = self.rules.state(key)
            state.load.count(record.active, record.wait_ms, record.role, record.batch)
            if t.prompt_n is not None:
                state.prompt_cached += t.cache_n or 0
                state.prompt_processed += t.prompt_n
                state.prompt_s += (t.prompt_ms or 0.0) / 1000
                if record.session is not None:
                    state.count_turn(record.session, record.role)
            if not t.predicted_per_second or not t.predicted_n:
                return
            tok_s = float(t.predicted_per_second)
            counts = served_counts(t.predicted_n, t.draft_n, t.draft_n_accepted)
            self._served += record.variant != BASELINE.name
            if record.role in ("trial", "control", "held"):
                gain = self.rules.effective_policy(key)[1].gain
                cost = self.pricing.explore_cost(key, tok_s, gain)
                if cost is None and record.variant == BASELINE.name:
                    # an anchor, before any baseline to time it by: it ran at 1 / gain of
                    # the policy's speed by definition (left at 1, it would hold the class's
                    # budget for 1 / explore_share requests)
                    cost = max(0.0, gain - 1.0)
                if cost is not None:
                    state.spent -= 1.0 - cost
            # a request that drafted nothing (a baseline one included) only fits a step
            self.own(served(key, record.variant, tok_s, counts))
            trial, finish = state.trial, None
            if trial is not None and record.trial == trial.number:
                trial.counts.append(counts)
                if self.search.trial_done(self.config, state, trial):
                    state.trial, finish = None, trial
            changed = self.rules.decide_all(key)
            self._open()
        if finish is not None:
            self.io(functools.partial(self._finish_trial, key, finish))
        elif changed:
            self.changed()

    def observe_replayed(
        self,
        class_key: str | None,
        served: str,
        counts: dict[str, Counts],
        served_counts: Counts | None = None,
    ) -> None:
        """Add what other variants would have drafted and accepted on a request that
        ``served`` answered (replayed from its tokens, ``tuner.tuning.replay.drafters``): evidence
        for each of them in the class and its parents. ``served_counts``, the server's
        counts of that request, keep every variant's counts of it side by side."""
        if not self.config.guard.replay:
            return
        key = class_key or ROOT
        row = {
            name: found
            for name, found in counts.items()
            if name != served and name in self.variants and name != BASELINE.name
        }
        if not row:
            return
        mine = (served, served_counts) if served_counts is not None else None
        with self._learning((key,)):
            self.own(replayed(key, row, mine))
            changed = self.rules.decide_all(key)
            self._open()
        if changed:
            self.changed()

    def own(self, event: Event) -> None:
        """Apply one of this daemon's events and publish it (caller holds the lock)."""
        apply(event, self.rules.state, self.costfit, self.variants.__contains__)
        if self.publish is not None:
            self.publish(event)

    def absorb(self, events: Iterable[Event]) -> int:
        """Add other daemons' events (parsed) to the evidence and re-decide the classes
        they touched; how many applied."""
        applied, touched = 0, set()
        with self._learning():
            for event in events:
                if apply(event, self.rules.state, self.costfit, self.variants.__contains__):
                    applied += 1
                    touched.add(event.class_key)
                    self._served += isinstance(event, Served) and event.variant != BASELINE.name
            changed = [self.rules.decide_all(key) for key in sorted(touched)]
            self._open()
        if any(changed):
            self.changed()
        return applied

    def _open(self) -> None:
        """Choose the opening variant (caller holds the lock): until a trial's worth of
        speculative requests has been served, the variant with the highest lower bound on
        all traffic's counts, if its speedup is above 1 on at least two requests; before
        any variant is measured, the prior's best where it says speculation pays (else
        requests routed at once, before any answer, would all run without it); else none.
        A drafted token's cost is still the cost model's guess, its error wide, so the
        lower bound prefers variants that draft little for what they accept."""
        self._opening = None
        if not self.config.guard.replay or self._served >= self.config.budget.trial_requests:
            return
        need = min(2, self.config.budget.min_trial_requests)
        root = self.classes.get(ROOT)  # not created here: a fresh engine has no classes
        measured = self.pricing.measured(root, need) if root is not None else {}
        if not measured:
            self._opening = self._predicted(root)
            return
        ranked = sorted((s.low, name) for name, s in measured.items() if s.value > 1.0)
        if ranked:
            self._opening = ranked[-1][1]

    def _predicted(self, root: ClassState | None) -> str | None:
        """The prior's best-predicted variant on all traffic that can run, if it pays."""
        prior = root.prior if root is not None and root.prior is not None else self.rules.rank(ROOT)
        if not prior.pays:
            return None
        return next(
            (v.name for v, s in prior.ranked if s > 1.0 and not self.excluded(v.name)), None
        )

    # -- the trial search (IO thread) -------------------------------------------------

    def _next_trial(self, key: str) -> None:
        """Ask the class's study for its next trial."""
        assert self.studies is not None
        try:
            with self._learning((key,)):
                state = self.rules.state(key)
                space = self.rules.space(key)
                if not space:
                    state.converged = True
                    return
                ask = self.search.ask(self.config, state, self.classes, space)
            number, variant = self.studies.open(key, ask.space).next(ask.suggest, ask.known)
            trial = Trial(number, variant)
            if self.excluded(variant.name):
                self._abandon(key, trial)
                return
            with self._learning((key,)):
                if variant.name in self.variants:
                    state.trial = trial
        except Exception:
            log.exception("tuning_ask_failed", class_key=key)
        finally:
            with self._learning((key,)):
                self.rules.state(key).preparing = False

    def _abandon(self, key: str, trial: Trial) -> None:
        """A trial whose variant cannot run (quarantined): failed in its study."""
        assert self.studies is not None
        with self._lock:
            space = self.rules.space(key)
        try:
            attrs = {"variant": trial.variant.name, "quarantined": True}
            self.studies.open(key, space).tell(trial.number, None, attrs=attrs)
        except Exception:
            log.exception("tuning_tell_failed", class_key=key)
        log.info("trial_abandoned", class_key=key, variant=trial.variant.name)

    def _finish_trial(self, key: str, trial: Trial) -> None:
        """Tell the study, re-decide, and ask for the class's next trial."""
        assert self.studies is not None
        with self._learning((key,)):
            state = self.rules.state(key)
            outcome = self.search.outcome(self.config, state, trial, self.rules.clears)
            self.own(trial_done(key, trial.variant.name, outcome.converged))
            self.rules.decide_all(key)
            space = self.rules.space(key)
        try:
            self.studies.open(key, space).tell(
                trial.number, outcome.value, pruned=outcome.pruned, attrs=outcome.attrs
            )
        except Exception:
            log.exception("tuning_tell_failed", class_key=key)
        log.info(
            "trial_finished",
            class_key=key,
            variant=trial.variant.name,
            speedup=round(outcome.value, 3) if outcome.value is not None else None,
            requests=len(trial.counts),
            pruned=outcome.pruned,
        )
        self.changed()
        with self._learning((key,)):
            if state.converged or state.preparing:
                return
            state.preparing = True
        self._next_trial(key)

    # -- what other parts read (each under the lock) ----------------------------------

    def state(self, key: str) -> ClassState:
        """A class's state, created on first use."""
        with self._lock:
            return self.rules.state(key)

    def effective_policy(self, key: str) -> tuple[str, Policy]:
        """The policy that serves a class, and whose it is (``Rules.effective_policy``)."""
        with self._lock:
            return self.rules.effective_policy(key)

    def override(self, key: str) -> Override:
        with self._lock:
            return self.rules.override(key)

    def forbidden(self, key: str, variant: str) -> bool:
        with self._lock:
            return self.rules.forbidden(key, variant)

    def space(self, key: str) -> dict[str, dict[str, list[Any]]]:
        """The configured search space minus forbidden or unbuildable spec types."""
        with self._lock:
            return self.rules.space(key)

    def prior_for(self, key: str) -> PriorView:
        with self._lock:
            prior = self.rules.state(key).prior
            return prior if prior is not None else self.rules.rank(key)

    def class_speedups(self, classes: Iterable[str]) -> dict[str, dict[str, float]]:
        """Per class, each speculative variant's measured speedup over its baseline: the
        class's own evidence, else its nearest parent's (enough requests of both)."""
        with self._lock:
            return self.rules.class_speedups(classes)

    # -- drift, reconfiguration, persistence ----------------------------------------------

    def check_drift(self) -> list[str]:
        """Re-open exploration where the chosen variant drifted; the classes re-opened."""
        window = self.config.guard.drift_window
        reopened = []
        with self._learning():
            for state in self.classes.values():
                policy = state.policy
                if not state.converged or policy is None or not policy.speculation:
                    continue
                arm = state.arms.get(policy.variant)
                if arm is None:
                    continue
                cost, _ = self.pricing.costs([policy.variant], state.key)[policy.variant]
                found = drift(arm, cost, window)
                if found is None:
                    continue
                state.converged = False
                state.trials_done = max(0, state.trials_done - self.config.budget.max_trials // 2)
                reopened.append(state.key)
                log.info(
                    "drift",
                    class_key=state.key,
                    variant=policy.variant,
                    speedup_now=round(found.speedup_now, 3),
                    alpha_now=found.alpha_now,
                )
        if reopened:
            self.changed()
        return reopened

    def reconfigure(self, config: TuningConfig) -> list[str]:
        """Apply an edited tuning file (SIGHUP); the sections that changed."""
        with self._learning():
            changed = self.rules.configure(config)
        if changed:
            self.changed()
        return changed

    def refresh(self) -> None:
        """Re-decide every class (a variant became unusable, or usable again)."""
        with self._learning():
            changed = [self.rules.decide(state) for state in list(self.classes.values())]
        if any(changed):
            self.changed()

    def changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def summary(self) -> list[tuple[ClassState, Policy]]:
        """Each class's counters and policy (copies of the counters, shared frozen policies)."""
        with self._lock:
            return [
                (s.counters(), p)
                for _, s in sorted(self.classes.items())
                if (p := s.policy) is not None
            ]

    def locked(self) -> threading.RLock:
        """The engine's lock, to read something beside a snapshot that must match it."""
        return self._lock

    def snapshot(self) -> dict[str, Any]:
        """The whole learned state, JSON-ready (``tuner.tuning.runtime.policy_file`` writes it)."""
        need = self.config.budget.min_trial_requests
        with self._lock:
            return {
                key: {
                    **s.dump(),
                    "served_by": self.rules.effective_policy(key)[0] if s.seen else None,
                    "prior": {
                        "pays": s.prior.pays,
                        "reason": s.prior.reason,
                        "ranked": [[v.name, round(p, 4)] for v, p in s.prior.ranked],
                    }
                    if s.prior
                    else None,
                    # what the engine measured each variant at, as it decides (the report
                    # shows these rather than re-deriving them)
                    "speedups": {
                        name: [round(x, 4) for x in (i.value, i.low, i.high)]
                        for name, i in self.pricing.measured(s, need).items()
                    },
                }
                for key, s in sorted(self.classes.items())
            }

    def restore(self, classes: dict[str, Any]) -> None:
        """Load a snapshot (trials that were running are not resumed: their study fails them).

        All or nothing: every class is parsed before any is changed, so a file with a
        malformed entry raises (KeyError, TypeError or ValueError) and leaves the engine as
        it was."""
        parsed = {key: parse_class(key, data) for key, data in classes.items()}
        with self._learning():
            for key, found in parsed.items():
                state = self.rules.state(key)
                state.seen, state.explored, state.spent = found.seen, found.explored, found.spent
                state.trials_done, state.converged = found.trials_done, found.converged
                state.arms, state.pairs = found.arms, found.pairs
                state.prompt_cached = found.prompt_cached
                state.prompt_processed = found.prompt_processed
                state.prompt_s = found.prompt_s
                state.stayed, state.moved = found.stayed, found.moved
                state.turn_trials, state.load = found.turn_trials, found.load
                if found.policy is not None:
                    state.policy = found.policy
            self.pricing.recalibrate()
            for state in self.classes.values():
                self.rules.decide(state)
            self._open()
