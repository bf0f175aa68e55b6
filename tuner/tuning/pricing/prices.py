"""What a variant's requests are worth: speedups from token counts, priced per drafted token.

A request that generated ``n`` tokens, drafted ``d`` and had ``a`` accepted is priced at
``n / (n - a + c d)`` (``tuner.tuning.evidence.counts``). ``c``, what a drafted token costs in plain
decode steps, is calibrated per variant on every class's requests against one plain
step's time fitted on all traffic (``CostFit.step_time``), and in a class priced by
that class's own requests of the variant, shrunk toward all traffic's cost. Before any
served draft prices it, ``c`` is the cost model's extra verify time per drafted token.
What a conversation's move costs and saves is priced here too: the prefill speed and a
class's answer length.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

from tuner.classify.classes import ROOT
from tuner.model.speedup import CostModel
from tuner.stats import Interval, ratio_interval, z_for
from tuner.tuning.evidence.classes import SAMPLED, Arm, ClassState, Trial, levels, under
from tuner.tuning.evidence.counts import Counts, count_speedup, log_interval, ratio_of_sums
from tuner.tuning.pricing.costfit import GUESS_SE, CostFit, Row
from tuner.tuning.variants import BASELINE, Variant

__all__ = ["MAX_COST", "Pricing", "answer_tokens", "paired_speedup", "prior_cost"]

MAX_COST = 3.0  # most one exploring request is charged, in requests at the policy's speed
# Before prompts are timed, prefill is taken as this many plain decode steps' tokens a
# second (a CPU processes a prompt about 9x faster than it decodes; a GPU far more)
PREFILL_STEPS = 8.0
PREFILL_MIN = 512  # prompt tokens processed before their speed is trusted
DEFAULT_ANSWER = 256  # tokens, before a class has answered anything


def answer_tokens(mean: float | None, limit: int | None) -> float:
    """The answer a request is expected to decode: its class's ``mean``, at most the
    request's ``limit``; the limit, or ``DEFAULT_ANSWER``, before the class answered any.

    >>> answer_tokens(80.0, 64), answer_tokens(80.0, None), answer_tokens(None, None)
    (64, 80.0, 256.0)
    """
    if mean is None:
        return float(limit or DEFAULT_ANSWER)
    return min(mean, limit) if limit else mean


def prior_cost(cost: CostModel, draft_step: float) -> tuple[float, float]:
    """``c`` before any calibration and its standard error: the cost model's extra verify
    time per drafted token (at 16 drafts), plus a draft model's step.

    >>> prior_cost(CostModel(), 0.0)[1]
    0.25
    """
    return max(0.0, (cost.verify(17) - cost.verify(1)) / 16) + draft_step, GUESS_SE


def paired_speedup(
    pairs: Sequence[tuple[Counts, Counts]],
    cost: tuple[float, float],
    other: tuple[float, float],
    z: float,
) -> Interval | None:
    """The speedup of variant B over variant A on the same requests: each pair is one
    request's (tokens, drafted, accepted) under A and under B, ``cost`` and ``other``
    A's and B's drafted-token cost with its standard error. A prompt that drafts well
    under one drafts well under the other, so the spread between requests mostly cancels,
    and so does an error in the cost level both share: the interval is far narrower than
    either variant's own over the class.

    >>> a, b = (100, 40, 20), (100, 40, 30)
    >>> rows = [(a, b), (a, b), ((50, 10, 5), (50, 10, 6))]
    >>> s = paired_speedup(rows, (0.4, 0.0), (0.4, 0.0), 1.64)
    >>> round(s.value, 3), s.low > 1.0
    (1.095, True)
    """
    rows = [(x, y) for x, y in pairs if x[0] > 0 and x[0] == y[0]]
    if not rows:
        return None
    (c_a, se_a), (c_b, se_b) = cost, other
    work_a = [n - a + c_a * d for n, d, a in (x for x, _ in rows)]
    work_b = [n - a + c_b * d for n, d, a in (y for _, y in rows)]
    if min(work_a) <= 0 or min(work_b) <= 0:
        return None
    r, se = ratio_of_sums(work_a, work_b)
    # d log r / d c: each cost's share of its variant's work per unit of cost
    share_a = math.fsum(float(x[1]) for x, _ in rows) / math.fsum(work_a)
    share_b = math.fsum(float(y[1]) for _, y in rows) / math.fsum(work_b)
    # the smaller error is a level both costs share (the fitted step time, the pooled cost
    # both are shrunk toward): it moves both, and the ratio only by their shares' difference
    common = min(se_a, se_b)
    rel_c = math.hypot(
        common * (share_a - share_b),
        math.sqrt(se_a**2 - common**2) * share_a,
        math.sqrt(se_b**2 - common**2) * share_b,
    )
    return log_interval(r, se, rel_c, z)


class Pricing:
    """Speedups of the variants in each class, from the engine's evidence (``classes``,
    shared with the engine and read under its lock)."""

    def __init__(
        self,
        classes: Mapping[str, ClassState],
        variants: Mapping[str, Variant],
        cost: CostModel,
        draft_step: float,
        *,
        confidence: float,
    ) -> None:
        self.classes = classes
        self.variants = variants
        self.cost = cost
        self.draft_step = draft_step
        self.configure(confidence)
        # the n-gram types' most tokens per round: an unserved one is priced by its length;
        # not the engine's autotune, whose rounds the engine sets (most far below its cap)
        lengths = {n: v.draft_length for n, v in variants.items() if v.copies and not v.autotuned}
        self.costfit = CostFit(*prior_cost(cost, draft_step), lengths)

    def configure(self, confidence: float) -> None:
        """The confidence of every interval (a reloaded tuning file may change it)."""
        self.z = z_for(confidence)

    # -- the plain decode speed ---------------------------------------------------------

    def fitted_speed(self) -> float | None:
        """Plain decode steps per second, fitted on all traffic (``CostFit.step_time``)."""
        tau = self.costfit.step_time()
        return 1.0 / tau if tau is not None else None

    def baseline_arm(self, key: str) -> Arm | None:
        """The nearest level's baseline arm with at least two requests."""
        for level in levels(key):
            state = self.classes.get(level)
            arm = state.arms.get(BASELINE.name) if state is not None else None
            if arm is not None and len(arm.samples) >= 2:
                return arm
        return None

    def base(self, state: ClassState) -> Arm | None:
        """The baseline a class's speedups are measured against: its own with at least two
        requests, else its nearest level's (counts need a baseline only to price a drafted
        token, and its fitted step time is the same for every class)."""
        own = state.arms.get(BASELINE.name)
        if own is not None and len(own.samples) >= 2:
            return own
        return self.baseline_arm(state.key)

    def baseline_speed(self, key: str) -> float | None:
        """A class's decode speed without speculation: the fitted step time's, the same for
        every class; before it stands, its nearest level's baseline requests' (the harmonic
        mean: the calibration multiplies decode times by it)."""
        if (fitted := self.fitted_speed()) is not None:
            return fitted
        base = self.baseline_arm(key)
        if base is None or min(base.samples) <= 0:
            return None
        return len(base.samples) / math.fsum(1.0 / x for x in base.samples)

    def prefill_speed(self, plain: float) -> float:
        """Prompt tokens processed per second over all traffic; before ``PREFILL_MIN`` of
        them, ``PREFILL_STEPS`` times the plain decode speed ``plain``."""
        tokens = sum(s.prompt_processed for s in self.classes.values())
        seconds = sum(s.prompt_s for s in self.classes.values())
        if tokens >= PREFILL_MIN and seconds > 0:
            return tokens / seconds
        return PREFILL_STEPS * plain

    def answer_tokens(self, key: str, limit: int | None) -> float:
        """The answer a request of this class is expected to decode: its nearest level's
        mean, at most the request's limit."""
        return answer_tokens(self.mean_answer(key), limit)

    def mean_answer(self, key: str) -> float | None:
        """The mean answer of the class's nearest level that answered any, in tokens."""
        for level in levels(key):
            state = self.classes.get(level)
            arms = state.arms.values() if state is not None else ()
            requests = sum(arm.requests for arm in arms)
            if requests:
                return sum(arm.tokens for arm in arms) / requests
        return None

    def explore_cost(self, key: str, tok_s: float, gain: float) -> float | None:
        """What one exploring request of this class that decoded at ``tok_s`` cost, in
        requests at the speed of the policy serving the class (whose measured speedup is
        ``gain``): ``reference / tok_s - 1``, at least 0 and at most ``MAX_COST`` (one
        stalled request does not spend a class's budget for hours); None before any level
        of the class has measured its baseline."""
        base = self.baseline_arm(key)
        if base is None or tok_s <= 0:
            return None
        plain = self.fitted_speed()
        speed = plain if plain is not None else statistics.fmean(base.samples)
        return min(MAX_COST, max(0.0, speed * gain / tok_s - 1.0))

    # -- speedups -----------------------------------------------------------------------

    def costs(
        self, variants: Iterable[str], key: str | None = None
    ) -> dict[str, tuple[float, float]]:
        """What a drafted token of each variant costs, in plain decode steps, and its
        standard error: over all traffic, or in class ``key`` (its requests and those of the
        classes under it, shrunk toward all traffic's)."""
        within = functools.partial(under, key) if key is not None and key != ROOT else None
        return self.costfit.costs(variants, self.baseline_speed, within)

    def priced(self, state: ClassState, need: int) -> dict[str, Arm]:
        """A class's speculative arms of ``need`` requests (served or replayed)."""
        return {
            name: arm
            for name, arm in state.arms.items()
            if name != BASELINE.name and name in self.variants and arm.known >= need
        }

    def speedups(
        self,
        state: ClassState,
        base: Arm,
        need: int,
        costs: Mapping[str, tuple[float, float]] | None = None,
    ) -> dict[str, Interval]:
        """Each speculative variant's speedup in a class, for arms of ``need`` requests
        (``costs``: their drafted tokens' in the class, when the caller has them)."""
        arms = self.priced(state, need)
        costs = costs if costs is not None else self.costs(arms, state.key)
        return {n: self.arm_speedup(state.key, n, arm, base, costs[n]) for n, arm in arms.items()}

    def arm_speedup(
        self, key: str, name: str, arm: Arm, base: Arm, cost: tuple[float, float] | None = None
    ) -> Interval:
        """One variant's speedup in a class (its key, its arm and its baseline arm)."""
        c, c_se = cost or self.costs([name], key)[name]
        found = count_speedup(arm.evidence, c, c_se, self.z)
        if found is not None:
            return found
        return ratio_interval(arm.samples, base.samples, self.z)  # counts price nothing

    def paired(
        self,
        state: ClassState,
        held: str,
        names: Iterable[str],
        need: int,
        costs: Mapping[str, tuple[float, float]],
    ) -> dict[str, Interval]:
        """Each of ``names`` over the ``held`` variant on the class's requests that measured
        both (``ClassState.pairs``), for those with ``need`` such requests (``costs``: the
        class's drafted-token costs of all of them, as ``costs`` gives)."""
        names = [n for n in names if n != held]
        out: dict[str, Interval] = {}
        for name in names:
            rows = [(row[held], row[name]) for row in state.pairs if held in row and name in row]
            if len(rows) >= need:
                found = paired_speedup(rows, costs[held], costs[name], self.z)
                if found is not None:
                    out[name] = found
        return out

    def trial_speedup(self, state: ClassState, trial: Trial) -> Interval | None:
        c, c_se = self.costs([trial.variant.name], state.key)[trial.variant.name]
        return count_speedup(trial.counts, c, c_se, self.z)

    def expected_cost(self, key: str, name: str, gain: float, need: int) -> float:
        """What one request of variant ``name`` is expected to cost a class served at
        ``gain``, in requests (``explore_cost``'s unit), by the nearest level that measured
        it on ``need`` requests; 0 where none has (an unknown variant may pay)."""
        for level in levels(key):
            state = self.classes.get(level)
            arm = state.arms.get(name) if state is not None else None
            if state is None or arm is None or arm.known < need:
                continue
            base = self.base(state)
            if base is None:
                continue
            found = self.arm_speedup(level, name, arm, base)
            return min(MAX_COST, max(0.0, gain / found.value - 1.0)) if found.value > 0 else 0.0
        return 0.0

    def measured(self, state: ClassState, need: int) -> dict[str, Interval]:
        """What the class's variants measure now (empty before any baseline)."""
        base = self.base(state)
        return self.speedups(state, base, need) if base is not None else {}

    def recalibrate(self) -> None:
        """Rebuild the calibration from the kept requests (after a restore): each leaf
        class's requests once (speculative ones price a drafted token, all fit a step)."""
        rows: list[Row] = []
        shared = {level for key in self.classes for level in levels(key)[1:]}
        for key, state in self.classes.items():
            if key in shared or key in (SAMPLED, ROOT):
                continue  # a leaf's requests count at every level: once is enough
            for name, arm in state.arms.items():
                # newest first: the two windows hold the same requests, newest last
                kept = zip(reversed(arm.samples), reversed(arm.served), strict=False)
                rows += [
                    (key, name, counts, counts.tokens / tok_s)
                    for tok_s, counts in kept
                    if counts.tokens > 0 and tok_s > 0
                ]
        self.costfit = CostFit.rebuilt(
            rows, *prior_cost(self.cost, self.draft_step), self.costfit.lengths
        )
