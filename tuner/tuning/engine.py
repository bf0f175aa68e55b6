"""The tuning engine: per class, exploit the best-known variant, spend a bounded share on trials.

``route(class_key)`` is called on the request path and only reads memory: it
returns the variant to use and why (``exploit``, ``trial``, ``control``,
``pinned``). ``observe(record)`` is called after the response went back (from
the record writer's thread): it adds the request's decode speed and draft
counts to the evidence of its class and of every parent class, finishes trials
and re-decides. Optuna and the policy file are touched through ``io`` (a
single background thread in the daemon; inline in tests), never on the request
path.

Decisions, per class:

- Budget: a request explores only while ``spent < explore_share * seen``, where
  ``spent`` is what exploring has cost the class, in requests at the speed of the
  policy that would have served it: a trial request that ran at half that speed
  costs 1 (it took two requests' time), one that ran at least as fast costs
  nothing. Each exploring request is charged 1 when routed and its measured cost
  when it is observed (a request never observed stays charged 1). So exploring
  is cheap where the variants tried are as fast as what the class runs now (a
  dense target whose n-gram drafts pay) and stays rare where they lose (a
  small-active MoE). Exploring means a trial request, or a control (no speculation):
  controls interleave with every trial so that it is compared with baseline requests
  from the same minutes (with counts and ``trial_controls_until`` > 0, only until the
  class has that many baseline requests: a count needs a baseline speed only to price a
  drafted token; off by default, it measured no better; with ``controls_pooled``, until all
  traffic has, and a class with fewer than two baseline requests of its own is measured
  against its nearest level's: measured slower, the few baseline requests left each
  drafted token's cost unsteady and the policies flapping; a class of one request form,
  ``[split] form``, always is, as its form's share of a class seldom buys two controls of
  its own at the budget and decodes as fast as the class it shares); with
  ``trial_replayed`` off, a
  class served speculation also sends one while it has fewer than two (its replayed
  arms are measured against its own baseline). A converged class
  sends a control (for drift checks) at most once per ``drift_window`` of its requests.
  All of that is ``guard.baseline = "controls"``, and timing mode. With ``"fitted"`` (the
  default; counts mode) no class sends controls: the plain decode speed that prices a
  drafted token is one step's time fitted on all traffic's requests, speculative ones
  included (``Calibration.step_time``; rebuilt order-free after a restart), anchored by
  the first two requests of all traffic run without speculation; every class is measured
  against its nearest level's baseline arm, and a held variant's drift is judged by its
  counts.
- Speedups (``guard.speedup_from = "counts"``, the default): a request that
  generated ``n`` tokens, drafted ``d`` and had ``a`` accepted is priced at
  ``n / (n - a + c d)`` (``tuner.tuning.counts``), with ``c``, what a drafted token
  costs, calibrated per variant on every class's requests against their class's
  baseline speed (a variant that has served little is shrunk toward the cost pooled over
  every variant; with ``guard.cost_pool = "spec_type"`` toward its spec type's, itself
  shrunk toward that: on Gemma an ``ngram-simple`` drafted token cost 0.44-0.49 of a step
  where ``ngram-mod``'s, which served most, cost 0.35-0.40; off by default, measured no
  better side by side; with ``"draft_length"`` toward the cost of the variants that draft
  as long a round: an m8 drafted token cost 0.53-0.66, m16 and max16 ones 0.38-0.47; an
  option, measured no better on average; with ``guard.class_cost``, the default, each
  class prices a variant by its own requests of it, shrunk toward all traffic's cost). Its
  counts carry no timing noise and need no baseline request on the same prompt, so a 6-request trial
  measures what the class's prompts accept, not which minutes it ran in. ``"timing"``:
  the ratio of the variant's mean decode speed to the class's baseline requests
  (controls interleaved in the same minutes).
- Replays (``guard.replay``, counts mode): every answered request is replayed through
  each ``ngram-simple`` variant of the space from its token ids
  (``tuner.tuning.counterfactual``); ``observe_replayed`` adds what each would have
  drafted and accepted to its arm in the class and its parents (``Arm.shadow``). Those
  counts are exact (the drafter is a pure function of the tokens), so such a variant is
  measured on every request without a trial and without costing the class anything;
  its drafted token's cost ``c`` still comes from the calibration (the pooled cost until
  it has served). With ``guard.replay_mod`` each ``ngram-mod`` variant is replayed too,
  through a simulated table fed by all traffic (an estimate, not exact: its table
  persists across requests). With ``guard.confirm_served`` > 0 such an estimate only
  proposes: once the variant has served that many requests of a class, its served counts
  alone measure it there (off by default: the simulation overstates every ``ngram-mod``
  variant alike, so confirmed ones then lose to simulated ones; measured slower).
  Every variant is tried, replayed or not (``guard.trial_replayed``, the default): a
  served trial anchors a class's choice; side by side the tuner was slower without them
  (BENCHMARKS.md). With ``trial_replayed = false`` trials go only to what cannot be
  replayed exactly (``ngram-mod``'s estimate only ranks, trials confirm it), once the
  engine has served a trial's worth of speculative requests (until then every
  ``c`` is the cost model's guess, too uncertain for replayed counts to clear the guard,
  and the first trials, the prior's picks, serve and calibrate it):
  a class's first ``trial_requests`` requests measure the replayed variants before its
  first trial; an exactly replayed variant is never a trial (its study is told its replayed
  value at once); a search whose study asks eight times in a row only for such variants is
  over (what it has not measured does not look better). While replays do not arrive
  (none after the engine's first ``trial_requests`` requests, or a class whose replayed
  arm stays under ``min_trial_requests`` after ``2 x trial_requests`` requests) every
  variant is tried as before.
- A trial runs ``trial_requests`` requests; after ``min_trial_requests`` it stops
  early when its whole speedup interval is below its bar: 1 (``guard.trial_bar =
  "baseline"``), or with ``"policy"`` the measured speedup of the policy serving the
  class, where that is higher (a variant clearly slower than what the class runs now is
  not worth three more requests); with ``"policy"`` and replays, an exactly replayed
  variant whose replayed interval already lies below that bar is not tried at all (its
  study is told its replayed value; off by default: within the budget, the requests it
  saves went to more trials, and side by side it measured no better). Its value (its
  speedup, as above) is told to the class's Optuna study. A class's search
  ends (converged) after ``max_trials`` trials, or after ``patience`` trials in a row
  that measured no better than its policy.
- Trials: a variant a parent class measured best, not yet measured here, goes
  first (siblings' findings are confirmed before anything new); then, for the
  first few, the prior's best that no parent measured slower than baseline,
  skipping what other classes are trying or the parents measured already (so
  siblings cover the prior's list together); then the class's Optuna study decides.
- Policy: the speculative variant with the highest lower confidence bound,
  if that bound is above 1 and its measured speedup at least ``min_gain``;
  else no speculation. The class keeps its current variant (if that clears the guard)
  unless the best one's lower bound lies above the current one's speedup; with
  ``guard.consolidate``, it then joins the same way the ``ngram-mod`` variant that has
  served the most requests of all traffic (``"served"``; ``STATEFUL``: that drafter's
  table, one per instance, learns from every answer it serves, so traffic spread over
  several such instances leaves each table colder) or the variant the root's policy
  runs (``"root"``: chosen on all traffic, the most evidence). With ``"one"`` no class
  chooses a stateful variant but the one that ran fastest on all traffic's replays (each
  through a table fed by all traffic, which the one instance's table then is), changed only
  when another ran ``min_gain`` faster on the same requests (``_choose_stateful``); every
  class follows a change at once, and joins the one as above where it clears the guard.
  With ``guard.paired``, the test for leaving a held variant is paired instead: on the
  class's last ``drift_window`` requests replayed under both, the other ran ``min_gain``
  faster (``_clearly_better``; the spread between prompts cancels in the pairs). With
  ``guard.revisit``, before its study's next trial (or once its search is over) a class
  gives a trial's worth of requests (``REVISIT``, not told to its study) to the best rated
  variant it has served fewer times than that whose interval reaches above the held one's
  speedup (``_rival``): priced at its cost over all traffic, a variant never served in a
  class may be rated below what it runs there, and only serving it there measures its cost
  there. With
  ``guard.warm_tables`` the replayer
  feeds each answer to the other ``ngram-mod`` instances classes exploit
  (``warm_targets``), so their tables learn from all traffic. A policy is settled when
  it rests on evidence or a verdict: a variant measured to clear the guard, every measured
  variant slower than baseline, a kill-switch verdict, or a finished search. A class whose
  own policy is not settled is served, until it has finished a trial of its own, by the nearest
  settled policy along ``levels(key)`` (``code/echo/greedy`` -> ``code/echo`` ->
  ``code`` -> ``all``; a sampled class looks at ``*/sampled``, all sampled traffic,
  first; every request counts at every level, so those levels learn first), unless
  its own requests already measured that variant slower than its baseline.
- Opening (``guard.opening``, counts mode with replay; the default): a fresh engine's
  classes run no speculation until some level's evidence clears the guard (after the
  fitted step's two anchors, 1-3 more plain requests on Gemma). With it, until a trial's
  worth of speculative requests has been served (``_calibrated``), a request whose policy
  runs no speculation only for lack of evidence (not settled, no verdict) runs the variant
  with the highest lower bound on all traffic's counts, replayed ones included, if its
  speedup is above 1 on two requests (``_open``): the policy rule without the guard's bar.
- Kill switch: before data, on targets with a structural verify cost (small-active
  MoE, hybrid recurrent) where the speedup model predicts no variant above 1, the
  class starts off with that reason and explores only inside the budget (on a
  dense target the prior only orders the first trials: its acceptance is a guess);
  if its ``prior.enqueue`` best candidates confirm the verdict the search stops there;
  after ``max_trials`` trials with no variant faster than baseline it is off with
  the measured reason.
- Drift: ``check_drift`` compares the chosen variant's recent requests with its
  earlier ones (decode speed against the baseline, and acceptance per request, each
  at 99 %); when the two intervals part, exploration re-opens.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from tuner.classify.classes import ROOT, is_form, parents
from tuner.logs import get_logger
from tuner.measure import Interval, ratio_interval, wilson
from tuner.model.speedup import CostModel
from tuner.records import RequestRecord
from tuner.tuning.config import Override, TuningConfig
from tuner.tuning.counts import (
    GUESS_SE,
    Calibration,
    Counts,
    Row,
    alpha_interval,
    count_speedup,
    paired_speedup,
)
from tuner.tuning.prior import PriorView, rank
from tuner.tuning.shadow import EXACT
from tuner.tuning.studies import Space, StudyBook
from tuner.tuning.variants import BASELINE, Variant

__all__ = ["SAMPLED", "Decision", "Engine", "Policy", "levels"]

log = get_logger(__name__)

Role = Literal["exploit", "trial", "control", "pinned"]
IO = Callable[[Callable[[], None]], None]
SAMPLES = 256  # decode speeds kept per (class, variant)
# a drafted token's cost before served drafts price it, measured by the profile's variant
# checks: on the EPYC, Gemma's gave 0.31-0.46 by variant, its served drafts 0.35-0.55
CHECKED_COST_SE = 0.1
REVISIT = -1  # the trial number of a revisit (guard.revisit), never told to a study
MAX_COST = 3.0  # most one exploring request is charged, in requests at the policy's speed
# upstream time beyond prompt and decode that means the request waited for its instance to
# load (a router loads a preset on first use; on Gemma CPU runs loads took 1.1-2.0 s, every
# other request's overhead stayed under 45 ms)
LOAD_MS = 500.0


SAMPLED = "*/sampled"  # every sampled class's evidence, pooled
# spec types whose drafter keeps state across requests in its instance: llama.cpp's
# ngram-mod adds every prompt and answer it sees to one hash table per instance
# (common/speculative.cpp), so what it drafts depends on which requests it served
STATEFUL = frozenset({"ngram-mod"})


def levels(key: str) -> list[str]:
    """Where a request of this class counts as evidence, and where the class looks for a
    policy to borrow, nearest first: the class, then (for a sampled class) all sampled
    traffic pooled, then its parents.

    Sampling is the third part of a class key, so a sampled class's parents are mostly
    greedy traffic, which accepts far more drafts; the pooled sampled evidence is the
    nearest of its kind, after the sampled class itself (and its form's class, when the
    classes are split by form).

    >>> levels("code/echo/sampled")
    ['code/echo/sampled', '*/sampled', 'code/echo', 'code', 'all']
    >>> levels("code/echo/greedy")
    ['code/echo/greedy', 'code/echo', 'code', 'all']
    >>> levels("code/echo/sampled/messages")
    ['code/echo/sampled/messages', 'code/echo/sampled', '*/sampled', 'code/echo', 'code', 'all']
    """
    chain = list(dict.fromkeys(parents(key)))
    if key != SAMPLED:
        sampled = [i for i, level in enumerate(chain) if level.endswith("/sampled")]
        if sampled:
            chain.insert(sampled[-1] + 1, SAMPLED)
    return chain


def _under(key: str, leaf: str) -> bool:
    """Whether a request of class ``leaf`` counts as evidence in class ``key``.

    >>> _under("code/echo", "code/echo/greedy"), _under("*/sampled", "code/echo/greedy")
    (True, False)
    """
    return key in _levels_of(leaf)


@functools.lru_cache(maxsize=1024)
def _levels_of(leaf: str) -> frozenset[str]:
    return frozenset(levels(leaf))


def waited_for_load(record: RequestRecord) -> bool:
    """Whether a request spent more than ``LOAD_MS`` upstream beyond its prompt and decode
    time: its llama-server instance was loading (its decode, the instance's first, ran
    slower than the same request's on a warm instance).

    >>> from tuner.records import Timings
    >>> def rec(upstream: float) -> RequestRecord:
    ...     t = Timings(prompt_ms=40.0, predicted_ms=2000.0)
    ...     return RequestRecord(id="r", ts=0.0, endpoint="/v1/completions", stream=False,
    ...                          status=200, proxy_ms=upstream + 5, upstream_ms=upstream, timings=t)
    >>> waited_for_load(rec(2060.0)), waited_for_load(rec(3800.0))
    (False, True)
    """
    t = record.timings
    if record.upstream_ms is None or t is None or t.predicted_ms is None:
        return False
    return record.upstream_ms - (t.prompt_ms or 0.0) - t.predicted_ms > LOAD_MS


def _z(confidence: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + confidence / 2)


DRIFT_Z = _z(0.99)  # drift: two 99 % intervals must part (checked again and again)


def _log_finished(event: str, key: str, trial: Trial, found: Interval | None, **extra: Any) -> None:
    log.info(
        event,
        class_key=key,
        variant=trial.variant.name,
        speedup=round(found.value, 3) if found else None,
        requests=len(trial.samples),
        **extra,
    )


def _inline(job: Callable[[], None]) -> None:
    job()


@dataclass(frozen=True, slots=True)
class Decision:
    variant: str
    role: Role
    trial: int | None = None
    policy_class: str = ROOT  # whose policy an exploit decision used


class Policy(BaseModel):
    """What the engine decided for one class, with its evidence (persisted, reported)."""

    model_config = ConfigDict(frozen=True)

    class_key: str
    variant: str
    speculation: bool
    reason: str
    kill_switch: bool = False
    override: bool = False
    settled: bool = False  # rests on evidence or a verdict, not on a lack of data
    requests: int = 0
    alpha: float | None = None
    alpha_low: float | None = None
    alpha_high: float | None = None
    tokens_per_step: float | None = None
    speedup: float | None = None
    speedup_low: float | None = None
    speedup_high: float | None = None
    predicted_speedup: float | None = None
    since: float = 0.0

    @property
    def gain(self) -> float:
        """The measured speedup this policy delivers: 1.0 when it does not speculate (or
        speculates on a parent's word, with no measurement of its own)."""
        return self.speedup if self.speculation and self.speedup else 1.0


@dataclass(slots=True)
class Arm:
    """Evidence for one variant in one class."""

    requests: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    # (drafted, accepted, tokens, loaded) per request, beside ``samples``; tokens 0: not
    # known (a state file from before tokens were kept); loaded 1: it waited for its
    # instance to load (``waited_for_load``; 0 in a state file from before that was kept)
    recent: deque[tuple[int, int, int, int]] = field(default_factory=lambda: deque(maxlen=SAMPLES))
    # (tokens, drafted, accepted) this variant would have had on requests another variant
    # served: replayed from their token ids (``tuner.tuning.shadow``), no timing
    replayed: int = 0
    shadow: deque[Counts] = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def add(
        self, tok_s: float, tokens: int, drafted: int, accepted: int, loaded: bool = False
    ) -> None:
        self.requests += 1
        self.tokens += tokens
        self.drafted += drafted
        self.accepted += accepted
        self.samples.append(tok_s)
        self.recent.append((drafted, accepted, tokens, int(loaded)))

    def add_replayed(self, counts: Counts) -> None:
        self.replayed += 1
        self.shadow.append(counts)

    @property
    def known(self) -> int:
        """Requests measured: served, or replayed."""
        return self.requests + self.replayed

    @property
    def alpha(self) -> Interval | None:
        return wilson(
            self.accepted + sum(a for _, _, a in self.shadow),
            self.drafted + sum(d for _, d, _ in self.shadow),
        )

    def confirmed(self, confirm: int) -> bool:
        """Whether the variant has served ``confirm`` (> 0) requests with known counts: from
        then on its served counts alone measure it (a replay that is only an estimate
        proposes a variant, serving it confirms or refutes)."""
        return 0 < confirm <= len(self.counts)

    def evidence_for(self, confirm: int) -> list[Counts]:
        """The counts a speedup rests on: served and replayed, or only served once
        ``confirmed``."""
        return self.counts if self.confirmed(confirm) else self.evidence

    def alpha_for(self, confirm: int) -> Interval | None:
        return wilson(self.accepted, self.drafted) if self.confirmed(confirm) else self.alpha

    @property
    def tokens_per_step(self) -> float:
        if not self.requests and self.shadow:
            n, a = sum(c[0] for c in self.shadow), sum(c[2] for c in self.shadow)
            return n / max(n - a, 1)
        return self.tokens / max(self.tokens - self.accepted, 1)

    @property
    def counts(self) -> list[Counts]:
        """(tokens, drafted, accepted) of the kept requests whose token count is known."""
        return [(n, d, a) for d, a, n, _ in self.recent if n > 0]

    @property
    def evidence(self) -> list[Counts]:
        """The kept counts, served and replayed."""
        return [*self.counts, *self.shadow]

    def dump(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "tokens": self.tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "samples": list(self.samples),
            "recent": [list(r) for r in self.recent],
            "replayed": self.replayed,
            "shadow": [list(c) for c in self.shadow],
        }

    @classmethod
    def load(cls, data: dict[str, Any]) -> Arm:
        arm = cls(
            int(data["requests"]), int(data["tokens"]), int(data["drafted"]), int(data["accepted"])
        )
        arm.samples.extend(float(x) for x in data.get("samples", []))
        for r in data.get("recent", []):
            tokens, loaded = (int(r[i]) if len(r) > i else 0 for i in (2, 3))
            arm.recent.append((int(r[0]), int(r[1]), tokens, loaded))
        arm.replayed = int(data.get("replayed", 0))
        arm.shadow.extend((int(c[0]), int(c[1]), int(c[2])) for c in data.get("shadow", []))
        return arm


@dataclass(slots=True)
class Trial:
    number: int
    variant: Variant
    baseline_mark: int  # baseline requests observed when the trial started
    none_mark: int  # requests routed to baseline when the trial started
    sent: int = 0
    samples: list[float] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)


@dataclass(slots=True)
class ClassState:
    key: str
    seen: int = 0
    explored: int = 0
    none_routed: int = 0  # requests sent without speculation (exploit or control)
    trials_done: int = 0
    converged: bool = False
    switches: int = 0  # times the chosen variant changed (this process)
    spent: float = 0.0  # exploration cost, in requests at the served policy's speed
    last_control: int = 0  # ``seen`` when a converged class last sent a control
    stale: int = 0  # trials in a row that measured no better than the class's policy
    trial: Trial | None = None
    preparing: bool = False
    arms: dict[str, Arm] = field(default_factory=dict)
    policy: Policy | None = None
    prior: PriorView | None = None
    # with ``guard.paired``: one row per replayed request, every replayed variant's counts
    # and the served one's (working memory: not persisted, rebuilt from new requests)
    rows: deque[dict[str, Counts]] = field(default_factory=lambda: deque(maxlen=SAMPLES))

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


def _parse_class(key: str, data: dict[str, Any]) -> ClassState:
    """One class of a snapshot (``Engine.snapshot``), parsed; raises on a malformed entry."""
    explored = int(data["explored"])
    policy = data.get("policy")
    return ClassState(
        key,
        seen=int(data["seen"]),
        explored=explored,
        spent=float(data.get("spent", explored)),
        trials_done=int(data["trials_done"]),
        converged=bool(data["converged"]),
        arms={str(n): Arm.load(a) for n, a in data.get("arms", {}).items()},
        policy=Policy.model_validate(policy) if policy else None,
    )


class Engine:
    """Per-class decisions on live traffic. Thread-safe: one lock around the memory state."""

    def __init__(
        self,
        config: TuningConfig,
        variants: Iterable[Variant],
        studies: StudyBook | None,
        *,
        cost: CostModel | None = None,
        draft_step: float = 0.0,
        checked_cost: float | None = None,
        checked: Mapping[str, float] | None = None,
        io: IO = _inline,
        on_change: Callable[[Engine], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.variants = {v.name: v for v in variants}
        self.variants.setdefault(BASELINE.name, BASELINE)
        self.studies = studies
        self.cost = cost or CostModel()
        self.draft_step = draft_step
        self.checked_cost = checked_cost  # a drafted token's cost, the profile's checks'
        self.checked = dict(checked or {})  # spec type -> the profile's checks' speedup
        self.io = io
        self.on_change = on_change
        self.clock = clock
        self.z = _z(config.guard.confidence)
        # what a drafted token costs, per variant, from every class's requests (counts mode)
        self.calibration = Calibration(*self._prior_cost())
        self.classes: dict[str, ClassState] = {}
        self._opened: set[str] = set()  # classes whose study this process has used
        self._overrides: dict[str, Override] = {}  # per class key; the config is frozen
        # requests observed, speculative ones among them, and replays received
        self._observed = self._served = self._replays = 0
        # guard.consolidate = "one": recent requests' counts under every stateful variant,
        # each replayed (a table fed by all traffic), and the one classes may exploit
        self._stateful_rows: deque[dict[str, Counts]] = deque(maxlen=SAMPLES)
        self._stateful_one: str | None = None
        self._plain_routed = 0  # requests this process sent without speculation
        self._opening: str | None = None  # guard.opening: what an unsettled class runs
        self._lock = threading.RLock()

    # -- the request path -------------------------------------------------------------

    def route(self, class_key: str | None) -> Decision:
        """The variant for one request of this class (memory only, no IO)."""
        key = class_key or ROOT
        budget = self.config.budget
        with self._lock:
            state = self._state(key)
            state.seen += 1
            override = self._override(key)
            if override.pin is not None and override.pin in self.variants:
                return Decision(override.pin, "pinned", policy_class=key)
            policy_class, policy = self._effective_policy(key)
            may_explore = not override.off and state.spent < budget.explore_share * state.seen
            decision = self._explore(key, state, policy) if may_explore else None
            if decision is None:
                decision = self._exploit(key, state, policy_class, policy)
            else:
                state.explored += 1
                state.spent += 1.0  # until observed (``_cost``)
            if decision.variant == BASELINE.name:
                state.none_routed += 1
                self._plain_routed += 1
            return decision

    def _exploit(self, key: str, state: ClassState, policy_class: str, policy: Policy) -> Decision:
        """The serving decision: the policy's variant, or with ``guard.opening`` the opening
        variant where the policy runs no speculation only for lack of evidence."""
        opening = self._opening
        if (
            opening is not None
            and not policy.speculation
            and not policy.settled
            and not self._forbidden(key, opening)
            and self._may_borrow(state, opening)
        ):
            return Decision(opening, "exploit", policy_class=ROOT)
        return Decision(policy.variant, "exploit", policy_class=policy_class)

    def _explore(self, key: str, state: ClassState, policy: Policy) -> Decision | None:
        """A trial or control request, or None when there is nothing to explore right now."""
        fitted = self._fitted()
        if fitted and max(self._plain_routed, self._state(ROOT).baseline_requests) < 2:
            # the fitted step time is anchored by two plain requests of all traffic
            return Decision(BASELINE.name, "control", policy_class=key)
        trial = state.trial
        if trial is not None:
            controls = state.none_routed - trial.none_mark
            if (
                self._needs_controls(state)
                and controls < self.config.guard.control_share * trial.sent
            ):
                return Decision(BASELINE.name, "control", policy_class=key)
            trial.sent += 1
            return Decision(trial.variant.name, "trial", trial.number, key)
        replays = self._replays_arrive()
        if replays and policy.speculation and state.baseline_requests < 2 and not fitted:
            # replays measure a class's variants only against its own baseline speed
            return Decision(BASELINE.name, "control", policy_class=key)
        if not state.preparing and (rival := self._rival(state)) is not None:
            # a close rival's cost in this class is measured before anything new is tried
            state.trial = self._revisit(state, rival, sent=1)
            return Decision(rival.name, "trial", REVISIT, key)
        # with replays, a class's first requests measure every replayed variant before a
        # trial asks for what they cannot
        young = replays and self._calibrated() and state.seen <= self.config.budget.trial_requests
        if not state.converged and not state.preparing and self.studies is not None and not young:
            state.preparing = True
            self.io(lambda: self._next_trial(key))
        elif (
            state.converged
            and policy.speculation
            and not fitted
            and state.seen - state.last_control >= self.config.guard.drift_window
        ):
            state.last_control = state.seen  # keep the baseline fresh for drift checks
            return Decision(BASELINE.name, "control", policy_class=key)
        return None

    def _revisit(self, state: ClassState, rival: Variant, sent: int = 0) -> Trial:
        """A revisit of ``rival`` in this class (``guard.revisit``; caller holds the lock)."""
        log.info("revisit", class_key=state.key, variant=rival.name)
        return Trial(REVISIT, rival, state.arm(BASELINE.name).requests, state.none_routed, sent)

    def _rival(self, state: ClassState) -> Variant | None:
        """``guard.revisit``: the variant a class tries again before its study's next trial,
        or once its search is over (caller holds the lock): the best rated one in the class,
        other than the held one, whose interval there reaches above the held one's speedup
        and that has served fewer than ``trial_requests`` of the class's requests, so that
        its drafted-token cost there rests on all traffic's; None when there is none."""
        guard, budget = self.config.guard, self.config.budget
        policy = state.policy
        if not guard.revisit or guard.speedup_from != "counts" or policy is None:
            return None
        base = self._base(state)
        if not policy.speculation or base is None:
            return None
        speedups = self._speedups(state, base, budget.min_trial_requests)
        held = speedups.get(policy.variant)
        if held is None:
            return None
        rivals = [
            (found.value, name)
            for name, found in speedups.items()
            if name != policy.variant
            and found.high > held.value
            and state.arms[name].requests < budget.trial_requests
            and not self._forbidden(state.key, name)
            and self._exploitable(name)
        ]
        return self.variants[max(rivals)[1]] if rivals else None

    def _needs_controls(self, state: ClassState) -> bool:
        """Whether a trial interleaves controls: always when speedups come from timing (the
        trial is compared with baseline requests of the same minutes) or when
        ``trial_controls_until`` is 0 (the default); with counts and a positive value, only
        until the class has that many baseline requests of its own, or, with
        ``controls_pooled``, until all traffic has (caller holds the lock)."""
        guard = self.config.guard
        if self._fitted():
            return False
        if guard.speedup_from != "counts" or guard.trial_controls_until == 0:
            return True
        counted = self._state(ROOT) if guard.controls_pooled else state
        return counted.baseline_requests < guard.trial_controls_until

    def _fitted(self) -> bool:
        """Whether a class's baseline speed is the step time fitted on all traffic
        (``guard.baseline = "fitted"``, counts mode): no class sends controls of its own."""
        guard = self.config.guard
        return guard.speedup_from == "counts" and guard.baseline == "fitted"

    def _replays_arrive(self) -> bool:
        """Whether replays are configured and arriving: once replays are on, the first
        ``trial_requests`` requests the engine observes give them time to start; after
        that, at least one must have come (a daemon whose replays fail, or tests that send
        none, keep trialing every variant)."""
        guard = self.config.guard
        if not guard.replay or guard.speedup_from != "counts" or guard.trial_replayed:
            return False
        return self._replays > 0 or self._observed < self.config.budget.trial_requests

    def _calibrated(self) -> bool:
        """Whether a drafted token's cost has been measured on served drafts: a trial's worth
        of speculative requests observed. Before, every ``c`` is the cost model's guess, so
        wide that replayed counts alone clear no guard: the first trials serve and
        calibrate it, replayed variants included."""
        return self._served >= self.config.budget.trial_requests

    def _replay_measured(self, state: ClassState, name: str) -> bool:
        """Whether replays measure this variant in this class exactly, so that it needs no
        trial: an ``ngram-simple`` variant (an ``ngram-mod`` replay is an estimate, which
        served trials confirm: it understated long drafts on returning prompts, BENCHMARKS),
        while replays arrive and once the cost of a drafted token is calibrated, unless the
        class has seen ``2 x trial_requests`` requests and its arm still has fewer than
        ``min_trial_requests`` (replays of it are not arriving)."""
        variant = self.variants.get(name)
        if variant is None or variant.spec_type not in EXACT or not self._replays_arrive():
            return False
        if not self._calibrated():
            return False
        budget = self.config.budget
        arm = state.arms.get(name)
        known = self._known(arm) if arm is not None else 0
        return state.seen < 2 * budget.trial_requests or known >= budget.min_trial_requests

    def _cost(self, key: str, tok_s: float) -> float | None:
        """What one exploring request of this class that decoded at ``tok_s`` cost, in
        requests at the speed of the policy serving the class (caller holds the lock):
        ``reference / tok_s - 1``, at least 0 and at most ``MAX_COST`` (one stalled
        request does not spend a class's budget for hours). The reference is the class's
        baseline speed times the serving policy's measured speedup; None before any level
        of the class has measured its baseline."""
        base = self._baseline_arm(key)
        if base is None or tok_s <= 0:
            return None
        plain = self._fitted_speed() if self._fitted() else None
        speed = plain if plain is not None else statistics.fmean(base.samples)
        reference = speed * self._effective_policy(key)[1].gain
        return min(MAX_COST, max(0.0, reference / tok_s - 1.0))

    def _baseline_arm(self, key: str) -> Arm | None:
        """The nearest level's baseline arm with at least two requests (caller holds the lock)."""
        for level in levels(key):
            state = self.classes.get(level)
            arm = state.arms.get(BASELINE.name) if state is not None else None
            if arm is not None and len(arm.samples) >= 2:
                return arm
        return None

    def _base(self, state: ClassState) -> Arm | None:
        """The baseline a class's speedups are measured against (caller holds the lock): its
        own with at least two requests; with counts, else its nearest level's for a class of
        one request form (``[split] form``: the same prompts' class decodes as fast, and a
        form's share of a class seldom buys two controls at the budget) or, with
        ``controls_pooled``, for any class (counts need a baseline only to price a drafted
        token)."""
        own = state.arms.get(BASELINE.name)
        if own is not None and len(own.samples) >= 2:
            return own
        guard = self.config.guard
        pooled = guard.controls_pooled or self._fitted() or is_form(state.key)
        if guard.speedup_from == "counts" and pooled:
            return self._baseline_arm(state.key)
        return None

    def _baseline_speed(self, key: str) -> float | None:
        """A class's decode speed without speculation, its nearest level's, as tokens over
        time (the harmonic mean: the calibration multiplies decode times by it, and the
        arithmetic mean of noisy speeds would overstate it); with ``guard.baseline =
        "fitted"``, the fitted step time's, the same for every class. Caller holds the lock."""
        if self._fitted() and (fitted := self._fitted_speed()) is not None:
            return fitted
        base = self._baseline_arm(key)
        if base is None or min(base.samples) <= 0:
            return None
        return len(base.samples) / math.fsum(1.0 / x for x in base.samples)

    def _fitted_speed(self) -> float | None:
        """Plain decode steps per second, fitted on all traffic (``Calibration.step_time``)."""
        tau = self.calibration.step_time()
        return 1.0 / tau if tau is not None else None

    def _costs(
        self, variants: Iterable[str], key: str | None = None
    ) -> dict[str, tuple[float, float]]:
        """What a drafted token of each variant costs, in plain decode steps, and its
        standard error: over all traffic, or with ``guard.class_cost`` in class ``key``
        (its requests and those of the classes under it, shrunk toward all traffic's; with
        ``guard.class_factor`` toward all traffic's at the level its spec type's variants
        cost there)."""
        guard = self.config.guard
        groups = {"spec_type": self._spec_type, "draft_length": self._draft_length}
        group = groups.get(guard.cost_pool)
        within = None
        if guard.class_cost and key is not None and key != ROOT:
            within = functools.partial(_under, key)
        kind = self._spec_type if guard.class_factor else None
        return self.calibration.costs(variants, self._baseline_speed, group, within, kind)

    def _spec_type(self, name: str) -> str:
        variant = self.variants.get(name)
        return variant.spec_type if variant is not None else name

    def _draft_length(self, name: str) -> str:
        """A variant's cost group by the most tokens one round drafts (``cost_pool =
        "draft_length"``)."""
        variant = self.variants.get(name)
        return f"draft {variant.draft_length}" if variant is not None else name

    def _prior_cost(self) -> tuple[float, float]:
        """``c`` before any calibration and its standard error, plus a draft model's step:
        with ``guard.cost_prior = "checks"`` the cost the profile's variant checks measured
        (``checked_cost``), else, or without one, the cost model's extra verify time per
        drafted token (at 16 drafts)."""
        if self.config.guard.cost_prior == "checks" and self.checked_cost is not None:
            return self.checked_cost + self.draft_step, CHECKED_COST_SE
        verify = self.cost.verify
        return max(0.0, (verify(17) - verify(1)) / 16) + self.draft_step, GUESS_SE

    def _speedups(self, state: ClassState, base: Arm, need: int) -> dict[str, Interval]:
        """Each speculative variant's speedup in a class, for arms of ``need`` requests:
        from the requests' counts priced by the calibrated cost (``guard.speedup_from =
        "counts"``), else the ratio of mean decode speeds to the class's baseline."""
        arms = {
            name: arm
            for name, arm in state.arms.items()
            if name != BASELINE.name and name in self.variants and self._known(arm) >= need
        }
        costs = self._costs(arms, state.key)
        return {n: self._arm_speedup(state.key, n, arm, base, costs[n]) for n, arm in arms.items()}

    def _known(self, arm: Arm) -> int:
        """Requests that measured a variant: with counts, replayed ones count too."""
        return arm.known if self.config.guard.speedup_from == "counts" else arm.requests

    def _arm_speedup(
        self, key: str, name: str, arm: Arm, base: Arm, cost: tuple[float, float] | None = None
    ) -> Interval:
        """One variant's speedup in a class (its key, its arm and its baseline arm)."""
        if self.config.guard.speedup_from == "counts":
            c, c_se = cost or self._costs([name], key)[name]
            found = count_speedup(arm.evidence_for(self._confirm(name)), c, c_se, self.z)
            if found is not None:
                return found
        # timing, or no token counts kept (a state file from before they were)
        return ratio_interval(arm.samples, base.samples, self.z)

    def _confirm(self, name: str) -> int:
        """Served requests after which a variant's replays stop counting: ``confirm_served``
        for a variant whose replay is an estimate (``ngram-mod``), 0 (never) for an exact one."""
        variant = self.variants.get(name)
        if variant is None or variant.spec_type in EXACT:
            return 0
        return self.config.guard.confirm_served

    def _recalibrate(self) -> None:
        """Rebuild the calibration from the kept requests (after ``restore``): each leaf
        class's requests (speculative ones price a drafted token, all fit a step's time),
        less those that waited for their instance to load with ``guard.skip_loading``, as
        ``observe`` left them out."""
        rows: list[Row] = []
        shared = {level for key in self.classes for level in levels(key)[1:]}
        skip = self.config.guard.skip_loading
        for key, state in self.classes.items():
            if key in shared or key in (SAMPLED, ROOT):
                continue  # a leaf's requests count at every level: once is enough
            for name, arm in state.arms.items():
                # newest first: a file from before ``recent`` was kept has fewer of them
                kept = zip(reversed(arm.samples), reversed(arm.recent), strict=False)
                rows += [(key, name, (n, d, a), n / tok_s) for tok_s, (d, a, n, loaded) in kept
                         if n > 0 and tok_s > 0 and not (skip and loaded)]  # fmt: skip
        self.calibration = Calibration.rebuilt(rows, *self._prior_cost())

    def offline_trial(self, class_key: str) -> Decision | None:
        """A trial request for a replayed prompt of this class (idle-time tuning, outside the
        live budget: ``seen`` and ``explored`` do not move); starts the class's next trial
        when none runs. Blocking (Optuna): call it off the event loop. None when the class
        has nothing to explore (converged, overridden, no study)."""
        key = class_key or ROOT
        with self._lock:
            state = self._state(key)
            override = self._override(key)
            if override.off or override.pin is not None or state.converged:
                return None
            if state.trial is None:
                if state.preparing or self.studies is None:
                    return None
                state.preparing = True
                start = True
            else:
                start = False
        if start:
            self._next_trial(key)
        with self._lock:
            trial = state.trial
            if trial is None:
                return None
            trial.sent += 1
            return Decision(trial.variant.name, "trial", trial.number, key)

    # -- learning ---------------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        """Add one finished request to the evidence; finish its trial when due."""
        t = record.timings
        if record.variant is None or record.status != 200 or record.error or t is None:
            return
        if not t.predicted_per_second or not t.predicted_n:
            return
        key = record.class_key or ROOT
        tok_s = float(t.predicted_per_second)
        drafted, accepted = t.draft_n or 0, t.draft_n_accepted or 0
        finish: Trial | None = None
        with self._lock:
            self._observed += 1
            self._served += record.variant != BASELINE.name
            if record.role in ("trial", "control") and not record.replay:
                cost = self._cost(key, tok_s)
                if cost is not None:
                    self._state(key).spent -= 1.0 - cost
            counts = (t.predicted_n, drafted, accepted)
            loaded = waited_for_load(record)
            # a request that drafted nothing (a baseline one included) only fits a step's time
            if not (self.config.guard.skip_loading and loaded):
                self.calibration.add(key, record.variant, counts, t.predicted_n / tok_s)
            for level in levels(key):
                state = self._state(level)
                state.arm(record.variant).add(tok_s, t.predicted_n, drafted, accepted, loaded)
            state = self._state(key)
            trial = state.trial
            if trial is not None and record.trial == trial.number:
                trial.samples.append(tok_s)
                trial.counts.append(counts)
                if self._trial_done(state, trial):
                    state.trial, finish = None, trial
            changed = self._decide_all(key)
            self._open()
        if finish is not None:
            self.io(lambda: self._finish_trial(key, finish))
        elif changed:
            self._changed()

    def warm_targets(self, served: str) -> list[str]:
        """The stateful variants (``STATEFUL``) some routed class exploits now, other than
        ``served``: the instances whose tables did not see the answer ``served`` produced
        (``guard.warm_tables``; the caller feeds them the answer)."""
        with self._lock:
            # the keys requests were routed to, not parent levels only (looking a parent up
            # may add its state)
            routed = [key for key, state in self.classes.items() if state.seen]
            serving = {self._effective_policy(key)[1].variant for key in routed}
        return sorted(v for v in serving if v != served and self._spec_type(v) in STATEFUL)

    def observe_replayed(
        self,
        class_key: str | None,
        served: str,
        counts: dict[str, Counts],
        served_counts: Counts | None = None,
        served_replayed: Counts | None = None,
    ) -> None:
        """Add what other variants would have drafted and accepted on a request that
        ``served`` answered (replayed from its tokens, ``tuner.tuning.shadow``): counts
        evidence for each of them in the class and its parents. Ignored when speedups
        come from timing (a replay has no time). With ``guard.paired``, the request's
        counts under every variant (``served_counts``: the server's own) are also kept
        together as one row, for comparing two variants on the same requests. With
        ``guard.consolidate = "one"`` the stateful variants' replayed counts
        (``served_replayed``: the served one's replay) choose the one classes may exploit
        (``_choose_stateful``)."""
        guard = self.config.guard
        if guard.speedup_from != "counts" or not guard.replay:
            return
        key = class_key or ROOT
        row = {
            name: found
            for name, found in counts.items()
            if name != served and name in self.variants and name != BASELINE.name
        }
        with self._lock:
            self._replays += 1
            for level in levels(key):
                state = self._state(level)
                for name, found in row.items():
                    state.arm(name).add_replayed(found)
                if guard.paired and served_counts is not None and served in self.variants:
                    state.rows.append({**row, served: served_counts})
            changed = self._decide_all(key)
            self._open()
            if guard.consolidate == "one":
                stateful = {n: c for n, c in row.items() if self._spec_type(n) in STATEFUL}
                if served_replayed is not None and self._spec_type(served) in STATEFUL:
                    stateful[served] = served_replayed
                if stateful:
                    self._stateful_rows.append(stateful)
                if self._choose_stateful():
                    for state in list(self.classes.values()):
                        changed |= self._decide(state)
        if changed:
            self._changed()

    def _open(self) -> None:
        """Choose the opening variant (``guard.opening``; caller holds the lock): until a
        trial's worth of speculative requests has been served, the variant with the highest
        lower bound on all traffic's counts, replayed ones included (the rule a class's
        policy chooses by, without the guard's bar), if its speedup is above 1 on at least
        two requests; else, and from then on, none. Before any served draft prices it, a
        drafted token costs the cost model's guess, its standard error wide, so the lower
        bound prefers variants that draft little for what they accept."""
        self._opening = None
        guard = self.config.guard
        if not guard.opening or not guard.replay or guard.speedup_from != "counts":
            return
        if self._calibrated():
            return
        root = self._state(ROOT)
        base = self._base(root)
        if base is None:
            return
        need = min(2, self.config.budget.min_trial_requests)
        ranked = sorted(
            (s.low, name)
            for name, s in self._speedups(root, base, need).items()
            if s.value > 1.0 and self._exploitable(name)
        )
        if ranked:
            self._opening = ranked[-1][1]

    def _baseline_since(self, state: ClassState, mark: int) -> list[float]:
        """Baseline speeds observed after the ``mark``-th baseline request (else the last 8).

        ``mark`` counts requests, not kept samples: the sample window is bounded, the count
        is not, so the trial's own controls are still found once the window is full.
        """
        base = state.arm(BASELINE.name)
        samples = list(base.samples)
        since = base.requests - mark
        fresh = samples[-since:] if 0 < since <= len(samples) else []
        return fresh if len(fresh) >= 2 else samples[-8:]

    def _trial_speedup(self, state: ClassState, trial: Trial) -> Interval | None:
        if self.config.guard.speedup_from == "counts":
            c, c_se = self._costs([trial.variant.name], state.key)[trial.variant.name]
            return count_speedup(trial.counts, c, c_se, self.z)
        base = self._baseline_since(state, trial.baseline_mark)
        if not base or not trial.samples:
            return None
        return ratio_interval(trial.samples, base, self.z)

    def _trial_done(self, state: ClassState, trial: Trial) -> bool:
        budget = self.config.budget
        n = len(trial.samples)
        if n >= budget.trial_requests:
            return True
        if n >= budget.min_trial_requests:
            found = self._trial_speedup(state, trial)
            return found is not None and found.high < self._bar(state.key, trial.variant.name)
        return False

    def _bar(self, key: str, name: str) -> float:
        """What a variant's speedup interval must not lie wholly below to be worth more
        requests of this class (caller holds the lock): 1 (baseline), or with ``guard.trial_bar
        = "policy"`` the measured speedup of the policy serving the class now, if higher and
        not this variant's own."""
        if self.config.guard.trial_bar == "baseline":
            return 1.0
        _, policy = self._effective_policy(key)
        return 1.0 if policy.variant == name else max(1.0, policy.gain)

    def _replay_loss(self, state: ClassState, name: str) -> Interval | None:
        """With ``guard.trial_bar = "policy"``: this variant's replayed speedup in this class
        when replays, which measure it exactly (``ngram-simple``), already show it wholly
        below the bar, on ``min_trial_requests`` replayed requests and a calibrated drafted
        token's cost, so that a trial of it would only spend requests; else None (caller
        holds the lock)."""
        guard = self.config.guard
        variant = self.variants.get(name)
        if (
            guard.trial_bar != "policy"
            or not guard.replay
            or guard.speedup_from != "counts"
            or variant is None
            or variant.spec_type not in EXACT
            or not self._calibrated()
        ):
            return None
        arm = state.arms.get(name)
        if arm is None or arm.replayed < self.config.budget.min_trial_requests:
            return None
        c, c_se = self._costs([name], state.key)[name]
        found = count_speedup(arm.evidence, c, c_se, self.z)
        return found if found is not None and found.high < self._bar(state.key, name) else None

    def _next_trial(self, key: str) -> None:
        """Ask the class's study for its next trial (IO thread)."""
        assert self.studies is not None
        space = self._space(key)
        try:
            with self._lock:
                state = self._state(key)
                first = key not in self._opened
                self._opened.add(key)
                prior = state.prior
            if not space:
                with self._lock:
                    state.converged = True
                return
            if first:
                self.studies.fail_running(key, space)
            with self._lock:
                if (rival := self._rival(state)) is not None:
                    state.trial = self._revisit(state, rival)
                    return
                pick = self._suggest(key, space, prior)
            if pick is not None:
                self.studies.enqueue(key, space, [pick])
            asked = self._ask_new(key, space)
            if asked == "over":
                with self._lock:
                    state.converged = True
                    self._decide_all(key)
                log.info("search_over", class_key=key, reason="nothing unmeasured looks better")
                self._changed()
                return
            if asked == "later":
                return
            number, variant = asked
            with self._lock:
                mark = state.arm(BASELINE.name).requests
                if variant.name in self.variants:
                    state.trial = Trial(number, variant, mark, state.none_routed)
        except Exception:
            log.exception("tuning_ask_failed", class_key=key)
        finally:
            with self._lock:
                self._state(key).preparing = False

    def _suggest(self, key: str, space: Space, prior: PriorView | None) -> Variant | None:
        """The next trial to put ahead of the search, if any (caller holds the lock).

        First, the variant a parent measured best (clearing the guard: its interval above 1,
        its speedup at least ``min_gain``) that this class has not measured: what siblings
        found is confirmed here before anything new.
        Then, for the first ``prior.enqueue`` trials, the prior's best that this class has
        not measured, no parent has measured slower than baseline and, if one is left, no
        other class is trying now and no parent has measured: siblings starting together
        split the prior's list instead of all trying its first pick.
        """
        budget, guard = self.config.budget, self.config.guard
        state = self._state(key)

        def candidate(name: str) -> bool:
            variant = self.variants.get(name)
            if variant is None or not variant.speculative or variant.spec_type not in space:
                return False
            if self._replay_measured(state, name) or self._replay_loss(state, name):
                return False  # every request measures it already (or it loses there)
            arm = state.arms.get(name)
            return arm is None or self._known(arm) < budget.min_trial_requests

        above = [self.classes[lv] for lv in levels(key) if lv != key
                 and lv in self.classes]  # fmt: skip
        losing: set[str] = set()
        for parent in above:
            base = self._base(parent)
            if base is None:
                continue
            scored = []
            for name, found in self._speedups(parent, base, budget.min_trial_requests).items():
                if found.value < 1.0:
                    losing.add(name)
                elif found.low > 1.0 and found.value >= guard.min_gain and candidate(name):
                    scored.append((found.value, name))
            if scored:
                return self.variants[max(scored)[1]]
        if prior is None or state.trials_done >= self.config.prior.enqueue:
            return None
        # Siblings split the prior's list: what another class is trying now, or a parent
        # has measured (and found no gain in), is left to them.
        elsewhere = {s.trial.variant.name for s in self.classes.values() if s.trial is not None}
        elsewhere |= {
            name
            for parent in above
            for name, arm in parent.arms.items()
            if self._known(arm) >= budget.min_trial_requests
        }
        ranked = [v for v, _ in prior.ranked]
        # a prior pick only where the prior ranks it above every replayed variant: those
        # are measured on the class's own requests, a better guide than the prior
        cut = next(
            (i for i, v in enumerate(ranked) if self._replay_measured(state, v.name)), len(ranked)
        )
        picks = [v for v in ranked[:cut] if candidate(v.name) and v.name not in losing]
        return next((v for v in picks if v.name not in elsewhere), picks[0] if picks else None)

    def _ask_new(self, key: str, space: Space) -> tuple[int, Variant] | Literal["over", "later"]:
        """Ask the study for the next variant to try. One this class has measured enough
        (a trial's worth of requests, or ``min_trial_requests`` replayed ones for a variant
        replays measure) is told its value at once and the study asked again, up to eight
        times; a variant that has not, and that replays do not measure, is the answer (after
        eight asks, the last one that replays do not measure runs again rather than stay
        told); one whose replays show it below the trial bar (``_replay_loss``) counts as
        measured by replays. ``"over"`` when the study asked only for what replays measured
        here: what it has not measured does not look better, the search is over.
        ``"later"`` when it asked for replayed variants whose replays have not come yet."""
        assert self.studies is not None
        budget = self.config.budget
        pending = False
        for attempt in range(8):
            number, variant = self.studies.ask(key, space)
            with self._lock:
                state = self._state(key)
                arm = state.arms.get(variant.name)
                base = self._base(state)
                loss = self._replay_loss(state, variant.name)
                replayed = loss is not None or self._replay_measured(state, variant.name)
                need = budget.min_trial_requests if replayed else budget.trial_requests
                known = arm is not None and base is not None and self._known(arm) >= need
                if loss is not None:
                    value: float | None = loss.value
                elif known:
                    value = self._arm_speedup(key, variant.name, arm, base).value  # type: ignore[arg-type]
                else:
                    value = None
            if not replayed and (value is None or attempt == 7):
                return number, variant
            if value is None:
                pending = True
                self.studies.tell(key, space, number, None, attrs={"skipped": "replay pending"})
            else:
                self.studies.tell(key, space, number, value, attrs={"reused": True})
        return "later" if pending else "over"

    def _finish_trial(self, key: str, trial: Trial) -> None:
        """Tell the study and re-decide (IO thread)."""
        if trial.number == REVISIT:
            with self._lock:
                state = self._state(key)
                found = self._trial_speedup(state, trial)
                changed = self._decide_all(key)
            _log_finished("revisit_finished", key, trial, found)
            if changed:
                self._changed()
            return
        with self._lock:
            state = self._state(key)
            found = self._trial_speedup(state, trial)
            pruned = (
                found is not None
                and found.high < 1.0
                and len(trial.samples) < self.config.budget.trial_requests
            )
            state.trials_done += 1
            bar = state.policy.gain if state.policy else 1.0
            state.stale = 0 if found is not None and found.value > bar else state.stale + 1
            patience = self.config.budget.patience
            if state.trials_done >= self._max_trials(state) or 0 < patience <= state.stale:
                state.converged = True
            self._decide_all(key)
        attrs = {"requests": len(trial.samples), "variant": trial.variant.name}
        if found is not None:
            attrs |= {"speedup": found.value, "speedup_low": found.low, "speedup_high": found.high}
        if self.studies is not None:
            try:
                self.studies.tell(
                    key,
                    self._space(key),
                    trial.number,
                    found.value if found else None,
                    pruned=pruned,
                    attrs=attrs,
                )
            except Exception:
                log.exception("tuning_tell_failed", class_key=key)
        _log_finished("trial_finished", key, trial, found, pruned=pruned)
        self._changed()
        if not state.converged:
            with self._lock:
                if state.preparing:
                    return
                state.preparing = True
            self._next_trial(key)

    def _max_trials(self, state: ClassState) -> int:
        """Trials before a class is converged: the budget's, or, while the prior's verdict
        (structural cost, nothing can pay) still holds, only enough to check its best few."""
        limit = self.config.budget.max_trials
        policy = state.policy
        verdict = policy is not None and policy.kill_switch and not policy.override
        if verdict and not self._best_measured(state)[0]:
            limit = min(limit, max(1, self.config.prior.enqueue))
        return limit

    # -- policies ---------------------------------------------------------------------

    def _decide_all(self, key: str) -> bool:
        changed = False
        for level in levels(key):
            changed |= self._decide(self._state(level))
        return changed

    def _decide(self, state: ClassState) -> bool:
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

    def _policy(self, state: ClassState) -> Policy:
        now = self.clock()
        override = self._override(state.key)
        prior = state.prior
        if override.pin is not None and override.pin in self.variants:
            return Policy(
                class_key=state.key,
                variant=override.pin,
                speculation=override.pin != "none",
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
        best, best_any = self._best_measured(state)
        if best is not None:
            _, name, s, arm = best
            confirm = self._confirm(name)
            a = arm.alpha_for(confirm)
            predicted = prior.predicted(name) if prior else None
            reason = f"measured {s.value:.2f}x [{s.low:.2f}, {s.high:.2f}] over baseline"
            if confirm and not arm.confirmed(confirm) and arm.shadow:
                reason += f" (estimate: {len(arm.counts)} served, {len(arm.shadow)} simulated)"
            return Policy(
                class_key=state.key,
                variant=name,
                speculation=True,
                reason=reason,
                requests=arm.requests,
                alpha=a.value if a else None,
                alpha_low=a.low if a else None,
                alpha_high=a.high if a else None,
                tokens_per_step=arm.tokens_per_step,
                speedup=s.value,
                speedup_low=s.low,
                speedup_high=s.high,
                predicted_speedup=predicted,
                settled=True,
                since=now,
            )
        predicted = prior.ranked[0][1] if prior and prior.ranked else None
        if state.converged and best_any is not None:
            reason = (
                f"measured: no variant beats baseline; best {best_any[1]} at "
                f"{best_any[0]:.2f}x after {state.trials_done} trials"
            )
            return self._off(
                state, reason, kill_switch=True, settled=True, predicted_speedup=predicted
            )
        if prior is not None and not prior.pays and self.cost.structural:
            return self._off(
                state, prior.reason, kill_switch=True, settled=True, predicted_speedup=predicted
            )
        if best_any is not None and best_any[0] < 1.0:
            reason = (
                f"measured: every variant tried is slower than baseline (best {best_any[1]} "
                f"at {best_any[0]:.2f}x); off until one measures faster"
            )
            return self._off(state, reason, settled=True, predicted_speedup=predicted)
        reason = (
            f"no variant measured faster yet ({state.trials_done} trials)"
            if state.trials_done or best_any
            else "no evidence yet"
        )
        return self._off(state, reason, settled=state.converged)

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

    def _best_measured(
        self, state: ClassState
    ) -> tuple[tuple[float, str, Interval, Arm] | None, tuple[float, str] | None]:
        """The variant to choose (if any clears the guard) and the best measured at all."""
        guard, need = self.config.guard, self.config.budget.min_trial_requests
        base = self._base(state)
        best: tuple[float, str, Interval, Arm] | None = None
        best_any: tuple[float, str] | None = None
        if base is None:
            return None, None
        clearing: dict[str, tuple[float, str, Interval, Arm]] = {}
        speedups = self._speedups(state, base, need)
        for name, arm in state.arms.items():
            if name not in speedups or self._forbidden(state.key, name):
                continue
            s = speedups[name]
            if best_any is None or s.value > best_any[0]:
                best_any = (s.value, name)
            if s.low > 1.0 and s.value >= guard.min_gain and self._exploitable(name):
                clearing[name] = (s.low, name, s, arm)
                if best is None or s.low > best[0]:
                    best = clearing[name]
        for name in self._incumbents(state):
            held = clearing.get(name)
            if (
                best is not None
                and held is not None
                and not self._clearly_better(state, best, held)
            ):
                best = held
        return best, best_any

    def _incumbents(self, state: ClassState) -> list[str]:
        """The variants a class keeps or joins unless another is clearly better, in order
        (the last word last): its current one; with ``consolidate``, then the stateful
        variant that serves most traffic ("served"), the variant all traffic's policy runs
        ("root") or the one stateful variant classes may exploit ("one")."""
        incumbents = [state.policy.variant] if state.policy is not None else []
        consolidate = self.config.guard.consolidate
        if consolidate == "served":
            incumbents.append(self._stateful_leader())
        elif consolidate == "root" and state.key != ROOT:
            root = self.classes.get(ROOT)
            if root is not None and root.policy is not None and root.policy.speculation:
                incumbents.append(root.policy.variant)
        elif consolidate == "one" and self._stateful_one is not None:
            incumbents.append(self._stateful_one)
        return incumbents

    def _exploitable(self, name: str) -> bool:
        """Whether a class may choose this variant: with ``consolidate = "one"``, a stateful
        variant only if it is the one (``_choose_stateful``; any before replays chose one)."""
        one = self._stateful_one
        if self.config.guard.consolidate != "one" or one is None:
            return True
        return name == one or self._spec_type(name) not in STATEFUL

    def _clearly_better(
        self,
        state: ClassState,
        best: tuple[float, str, Interval, Arm],
        held: tuple[float, str, Interval, Arm],
    ) -> bool:
        """Whether to leave the held variant for the best one: the best one's lower bound
        lies above the held one's speedup, or, with ``guard.paired`` and enough of the
        class's last ``drift_window`` requests replayed under both, the best one ran
        ``min_gain`` faster than the held one on them (the paired interval's lower end).
        Caller holds the lock."""
        if best[1] == held[1]:
            return True
        if self.config.guard.paired:
            a, b = best[1], held[1]
            recent = itertools.islice(reversed(state.rows), self.config.guard.drift_window)
            pairs = [(row[a], row[b]) for row in recent if a in row and b in row]
            if len(pairs) >= self.config.budget.min_trial_requests:
                costs = self._costs([a, b], state.key)
                found = paired_speedup(pairs, costs[a][0], costs[b][0], self.z)
                if found is not None:
                    return found.low > self.config.guard.min_gain
        return best[2].low > held[2].value

    def _choose_stateful(self) -> bool:
        """``consolidate = "one"``: the stateful variant classes may exploit, from the last
        ``SAMPLES`` requests' replayed counts (each variant's table fed by all traffic, as the
        one instance's is once it serves the traffic): the one with the fewest priced steps
        per generated token. It changes only while its instance has served fewer than
        ``drift_window`` requests, and then only to one that ran ``min_gain`` faster on the
        same requests (the paired interval's lower end): a new instance starts with an empty
        table, which costs more than a few percent on repeated prompts (measured, BENCHMARKS.md).
        True if it changed. Caller holds the lock."""
        rows = self._stateful_rows
        names = sorted({n for row in rows for n in row if not self._forbidden(ROOT, n)})
        held = self._stateful_one
        if not names or (held in names and self._settled_stateful(held)):
            return False
        costs = self._costs(names)

        def per_token(name: str) -> float:
            kept = [row[name] for row in rows if name in row]
            tokens = sum(n for n, _, _ in kept)
            steps = math.fsum(n - a + costs[name][0] * d for n, d, a in kept)
            return steps / tokens if tokens else math.inf

        best = min(names, key=per_token)
        if held in names and best != held:
            pairs = [(row[best], row[held]) for row in rows if best in row and held in row]
            found = paired_speedup(pairs, costs[best][0], costs[held][0], self.z)
            if found is None or found.low <= self.config.guard.min_gain:
                return False
        if best == held:
            return False
        log.info("stateful_choice", variant=best, previous=held)
        self._stateful_one = best
        return True

    def _settled_stateful(self, name: str) -> bool:
        """Whether the one's instance has served ``drift_window`` requests of all traffic,
        after which ``_choose_stateful`` keeps it without repricing anything."""
        root = self.classes.get(ROOT)
        arm = root.arms.get(name) if root is not None else None
        return arm is not None and arm.requests >= self.config.guard.drift_window

    def _stateful_leader(self) -> str:
        """The variant of a stateful spec type (``STATEFUL``) that has served the most
        requests of all traffic ("" when none has served): its instance's table has
        learned from the most answers, so another class's traffic is worth more there."""
        root = self.classes.get(ROOT)
        served = [
            (arm.requests, name)
            for name, arm in (root.arms.items() if root is not None else ())
            if arm.requests and self._spec_type(name) in STATEFUL
        ]
        return max(served)[1] if served else ""

    def _effective_policy(self, key: str) -> tuple[str, Policy]:
        """The policy that serves a class, and whose it is.

        The class's own once it is settled (a measured choice, a kill-switch verdict, or
        a finished search) on enough requests; until then, while the class has finished
        no trial of its own, the nearest parent's that is settled on enough requests,
        unless the class's own requests already measured that variant slower than
        baseline here; failing both, the class's own (or, with too few requests, the
        nearest parent's with enough, else the root's). A parent's speculative choice is
        never served once the class has finished a trial of its own (``_may_borrow``).
        """
        need = self.config.budget.min_class_requests
        own = self._state(key)

        def lendable(level: str, policy: Policy) -> bool:
            return level == key or not policy.speculation or self._may_borrow(own, policy.variant)

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
            if enough and self._settled(state):
                return level, policy
        if own.measured >= need:
            return key, own.policy
        if fallback is not None:
            return fallback
        root = self._state(ROOT).policy
        if root is not None and lendable(ROOT, root):
            return ROOT, root
        return key, own.policy

    @staticmethod
    def _settled(state: ClassState) -> bool:
        """The class's policy rests on its evidence or a verdict, not on a lack of data."""
        policy = state.policy
        return policy is not None and (policy.settled or state.converged)

    def _may_borrow(self, state: ClassState, variant: str) -> bool:
        """Whether a class may be served a parent's speculative ``variant``: only before it
        has finished a trial of its own (after that, its own evidence decides, and the
        parent's choice comes back as its next trial), and unless it already measured
        that variant slower than its own baseline."""
        if state.trials_done > 0:
            return False
        arm, base = state.arms.get(variant), self._base(state)
        if arm is None or base is None:
            return True
        if self._known(arm) < self.config.budget.min_trial_requests:
            return True
        return self._arm_speedup(state.key, variant, arm, base).value >= 1.0

    # -- for the one-variant-at-a-time mode (tuner.tuning.single) ------------------------

    def override(self, key: str) -> Override:
        with self._lock:
            return self._override(key)

    def forbidden(self, key: str, variant: str) -> bool:
        with self._lock:
            return variant in self.variants and self._forbidden(key, variant)

    def search_space(self, key: str) -> dict[str, dict[str, list[Any]]]:
        with self._lock:
            return self._space(key)

    def prior_for(self, key: str) -> PriorView:
        with self._lock:
            prior = self._state(key).prior
            return prior if prior is not None else self._rank(key)

    def class_speedups(self, classes: Iterable[str]) -> dict[str, dict[str, float]]:
        """Per class, each speculative variant's measured speedup over its baseline: the
        class's own evidence, else its nearest parent's (enough requests of both)."""
        need = self.config.budget.min_trial_requests
        out: dict[str, dict[str, float]] = {}
        with self._lock:
            for key in classes:
                found: dict[str, float] = {}
                for level in levels(key):
                    state = self.classes.get(level)
                    base = self._base(state) if state else None
                    if state is None or base is None:
                        continue
                    for name, s in self._speedups(state, base, need).items():
                        found.setdefault(name, s.value)
                out[key] = found
        return out

    def _override(self, key: str) -> Override:
        found = self._overrides.get(key)
        if found is None:
            found = self._overrides[key] = self.config.override_for(key)
        return found

    def _forbidden(self, key: str, variant: str) -> bool:
        return self.variants[variant].spec_type in self._override(key).forbid

    def _space(self, key: str) -> dict[str, dict[str, list[Any]]]:
        """The configured search space minus forbidden or unbuildable spec types."""
        types = {v.spec_type for v in self.variants.values() if v.speculative}
        forbid = set(self._override(key).forbid)
        return {
            t: {p: list(vals) for p, vals in space.items()}
            for t, space in sorted(self.config.search.items())
            if t in types and t not in forbid
        }

    def _rank(self, key: str) -> PriorView:
        prior = self.config.prior
        return rank(
            key,
            list(self.variants.values()),
            prior,
            self.cost,
            self.draft_step,
            checked=self.checked if prior.check_order else None,
        )

    def _state(self, key: str) -> ClassState:
        state = self.classes.get(key)
        if state is None:
            state = self.classes[key] = ClassState(key)
            state.prior = self._rank(key)
            state.policy = self._policy(state)
        return state

    # -- drift, persistence -----------------------------------------------------------

    def check_drift(self) -> list[str]:
        """Re-open exploration where the chosen variant left its interval; the classes re-opened."""
        window = self.config.guard.drift_window
        reopened = []
        with self._lock:
            for state in self.classes.values():
                policy = state.policy
                if not state.converged or policy is None or not policy.speculation:
                    continue
                arm = state.arms.get(policy.variant)
                if arm is None or len(arm.samples) < window + window // 2:
                    continue
                pairs, z = list(arm.recent), DRIFT_Z
                found = self._drift_speedups(state, policy.variant, arm)
                if found is None:
                    continue
                before, recent = found
                now = recent.value
                # per request, not per token: a prompt's drafts are accepted together
                old_alpha = alpha_interval(pairs[:-window], z)
                recent_alpha = alpha_interval(pairs[-window:], z)
                alpha_now = recent_alpha.value if recent_alpha else None
                # Both are measured: drift when the intervals part, not when the recent
                # point estimate leaves the older interval (a few controls make it noisy).
                left_speedup = recent.high < before.low or recent.low > before.high
                left_alpha = (
                    recent_alpha is not None
                    and old_alpha is not None
                    and (recent_alpha.high < old_alpha.low or recent_alpha.low > old_alpha.high)
                )
                if left_speedup or left_alpha:
                    state.converged = False
                    state.trials_done = max(
                        0, state.trials_done - self.config.budget.max_trials // 2
                    )
                    reopened.append(state.key)
                    log.info(
                        "drift",
                        class_key=state.key,
                        variant=policy.variant,
                        speedup_now=round(now, 3),
                        alpha_now=alpha_now,
                    )
        if reopened:
            self._changed()
        return reopened

    def _drift_speedups(
        self, state: ClassState, variant: str, arm: Arm
    ) -> tuple[Interval, Interval] | None:
        """The held variant's speedup before its last ``drift_window`` requests and over
        them (caller holds the lock): by decode speed against the class's own baseline
        requests of the same halves of its window, or, with ``guard.baseline = "fitted"``
        (no class has controls of its own), by the requests' counts at one drafted-token
        cost (what moves is what they accept and draft). None without enough of either."""
        window = self.config.guard.drift_window
        if self._fitted():
            counts = arm.counts
            c, _ = self._costs([variant], state.key)[variant]
            before = count_speedup(counts[:-window], c, 0.0, DRIFT_Z)
            recent = count_speedup(counts[-window:], c, 0.0, DRIFT_Z)
            return (before, recent) if before is not None and recent is not None else None
        base = state.arms.get(BASELINE.name)
        if base is None or len(base.samples) < 4:
            return None
        samples, base_samples = list(arm.samples), list(base.samples)
        half = len(base_samples) // 2
        return (
            ratio_interval(samples[:-window], base_samples[:half], DRIFT_Z),
            ratio_interval(samples[-window:], base_samples[half:], DRIFT_Z),
        )

    def reconfigure(self, config: TuningConfig) -> list[str]:
        """Apply an edited tuning file (SIGHUP): budget, guard, prior and overrides at once.

        The search space stays: its variants are llama-server presets fixed at start, so a
        changed space is kept for the next start (and said so). Returns what changed.
        """
        with self._lock:
            old = self.config
            if config.search != old.search:
                log.warning("tuning_search_needs_restart",
                            detail="search-space changes apply at the next start")  # fmt: skip
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
                name for name in ("budget", "guard", "prior", "overrides")
                if getattr(config, name) != getattr(old, name)
            ]  # fmt: skip
            self.config = config
            self.z = _z(config.guard.confidence)
            self._overrides.clear()
            for state in self.classes.values():
                if "prior" in changed:
                    state.prior = self._rank(state.key)
                self._decide(state)
        if changed:
            self._changed()
        return changed

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def summary(self) -> list[tuple[ClassState, Policy]]:
        """Each class's counters and policy (copies of the counters, shared frozen policies)."""
        with self._lock:
            return [
                (
                    ClassState(
                        k,
                        s.seen,
                        s.explored,
                        s.none_routed,
                        s.trials_done,
                        s.converged,
                        s.switches,
                        s.spent,
                    ),
                    p,
                )
                for k, s in sorted(self.classes.items())
                if (p := s.policy) is not None
            ]

    def snapshot(self) -> dict[str, Any]:
        """The whole learned state, JSON-ready (``tuner.tuning.state`` writes it)."""
        with self._lock:
            return {
                key: {
                    "seen": s.seen,
                    "explored": s.explored,
                    "spent": round(s.spent, 4),
                    "trials_done": s.trials_done,
                    "converged": s.converged,
                    "policy": s.policy.model_dump() if s.policy else None,
                    "served_by": self._effective_policy(key)[0] if s.seen else None,
                    "prior": {
                        "pays": s.prior.pays,
                        "reason": s.prior.reason,
                        "ranked": [[v.name, round(p, 4)] for v, p in s.prior.ranked],
                    }
                    if s.prior
                    else None,
                    "arms": {name: arm.dump() for name, arm in s.arms.items()},
                    # what the engine measured each variant at, as it decides (the report
                    # shows these rather than re-deriving them)
                    "speedups": {
                        name: [round(x, 4) for x in (i.value, i.low, i.high)]
                        for name, i in self._measured(s).items()
                    },
                }
                for key, s in sorted(self.classes.items())
            }

    def _measured(self, state: ClassState) -> dict[str, Interval]:
        base = self._base(state)
        if base is None:
            return {}
        return self._speedups(state, base, self.config.budget.min_trial_requests)

    def restore(self, classes: dict[str, Any]) -> None:
        """Load a snapshot (trials that were running are not resumed: their study fails them).

        All or nothing: every class is parsed before any is changed, so a file with a
        malformed entry raises (KeyError, TypeError or ValueError) and leaves the engine as
        it was."""
        parsed = {key: _parse_class(key, data) for key, data in classes.items()}
        with self._lock:
            for key, found in parsed.items():
                state = self._state(key)
                state.seen, state.explored, state.spent = found.seen, found.explored, found.spent
                state.trials_done, state.converged = found.trials_done, found.converged
                state.arms = found.arms
                if found.policy is not None:
                    state.policy = found.policy
            self._recalibrate()
            for state in self.classes.values():
                self._decide(state)
