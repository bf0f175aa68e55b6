"""What one drafted token costs, per variant, and one plain decode step's time. Pure.

A speculative request that generated ``n`` tokens, drafted ``d`` and had ``a`` accepted
ran ``n - a`` target steps and verified ``d`` extra tokens; its time beyond those steps,
in plain steps of its class, is charged to its drafts (``tuner.tuning.evidence.counts``
prices requests with the cost fitted here).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tuner.tuning.evidence.counts import Counts, ratio_se
from tuner.tuning.pricing.lengths import by_length

__all__ = ["GUESS_SE", "CostFit", "Row"]

Row = tuple[str, str, Counts, float]  # a kept request: class, variant, counts, decode seconds
PRIOR_REQUESTS = 4.0  # weight of the pooled (or prior) cost against a variant's own
STALL = 1.5  # the step-time fit counts a request at most this many times its expected time
STALL_WINDOW = 64  # recent requests whose median time over expected time sets that
STALL_OWN = 4  # ... once the request's variant has this many requests in the fit
GUESS_SE = 0.25  # standard error of a drafted token's cost before any request measured it


@dataclass(slots=True)
class _Sums:
    """Sums of (extra steps, drafted tokens) over requests, with their squares and product."""

    n: int = 0
    x: float = 0.0
    d: float = 0.0
    xx: float = 0.0
    xd: float = 0.0
    dd: float = 0.0

    def __iadd__(self, other: _Sums) -> _Sums:
        for name in self.__slots__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        return self

    def ratio(self, prior: float, prior_se: float, pseudo: float) -> tuple[float, float]:
        """``x / d`` with ``pseudo`` requests at ``prior`` and its standard error: the
        prior alone with no data, the data's own ratio with much of it."""
        if self.n == 0 or self.d <= 0:
            return prior, prior_se
        weight = pseudo * self.d / self.n
        value = (self.x + weight * prior) / (self.d + weight)
        share = self.n / (self.n + pseudo)  # the data's share of the estimate
        if self.n >= 2:
            r = self.x / self.d
            se = ratio_se(max(0.0, self.xx - 2 * r * self.xd + r * r * self.dd), self.n, self.d)
        else:
            se = prior_se
        return max(0.0, value), math.hypot(share * se, (1 - share) * prior_se)


@dataclass(slots=True)
class _Raw:
    """Running sums over one class's requests of one variant: decode time ``t`` (seconds),
    target steps ``m = n - a`` and drafted tokens ``d``, with the products that give the
    sums of ``extra = speed * t - m`` (steps beyond ``m``, at the class's baseline
    ``speed``) for whatever that speed is when asked: an early, noisy estimate of it is
    not baked in."""

    n: int = 0
    t: float = 0.0
    m: float = 0.0
    d: float = 0.0
    tt: float = 0.0
    tm: float = 0.0
    mm: float = 0.0
    td: float = 0.0
    md: float = 0.0
    dd: float = 0.0

    def add(self, t: float, m: float, d: float) -> None:
        self.n += 1
        self.t += t
        self.m += m
        self.d += d
        self.tt += t * t
        self.tm += t * m
        self.mm += m * m
        self.td += t * d
        self.md += m * d
        self.dd += d * d

    def at(self, speed: float) -> _Sums:
        return _Sums(
            n=self.n,
            x=speed * self.t - self.m,
            d=self.d,
            xx=speed * speed * self.tt - 2 * speed * self.tm + self.mm,
            xd=speed * self.td - self.md,
            dd=self.dd,
        )


@dataclass(slots=True)
class CostFit:
    """What one drafted token costs, per variant, from requests of every class.

    ``add`` takes one speculative request: its class, counts and decode time; its time in
    plain decode steps of its class (time x the class's baseline speed, as known when
    asked) beyond its ``n - a`` steps is charged to its ``d`` drafted tokens. A variant's
    cost is its own, shrunk toward the cost pooled over every variant by
    ``PRIOR_REQUESTS`` requests' worth of drafts; the pooled cost is shrunk toward
    ``prior`` (the cost model's guess) by one request's.
    """

    prior: float = 0.0
    prior_se: float = GUESS_SE
    # variant -> the most tokens it drafts per round, for the n-gram types: a variant not
    # served yet is priced by the served ones' costs at its length (``by_length``)
    lengths: Mapping[str, int] = field(default_factory=dict)
    raw: dict[tuple[str, str], _Raw] = field(default_factory=dict)  # (class, variant)
    # for ``step_time``: per variant (None: drafted nothing), times capped at STALL
    steps: dict[str | None, _Raw] = field(default_factory=dict)
    per_step: deque[float] = field(default_factory=lambda: deque(maxlen=STALL_WINDOW))

    @classmethod
    def rebuilt(
        cls,
        rows: Iterable[Row],
        prior: float = 0.0,
        prior_se: float = GUESS_SE,
        lengths: Mapping[str, int] | None = None,
    ) -> CostFit:
        """A calibration from kept requests whose order is lost (a restart): the stall cap
        judges each against the fit of all of them, uncapped, not against a fit of whichever
        came first (the requests of one class and variant, often with the same counts, fit
        nothing alone, and a fit from a few of them capped the rest far too fast)."""
        rows, lengths = list(rows), dict(lengths or {})
        reference = cls(prior, prior_se, lengths)
        for row in rows:
            reference._add(*row, fit=None)
        out = cls(prior, prior_se, lengths)
        for row in rows:
            out._add(*row, fit=reference)
        return out

    def add(self, class_key: str, variant: str, counts: Counts, seconds: float) -> None:
        """One request; ``variant`` is any name for one that drafted nothing (a baseline
        request, or a speculative one that found nothing to draft): it ran ``n`` plain
        steps, which only ``step_time`` uses."""
        self._add(class_key, variant, counts, seconds, fit=self)

    def _add(
        self,
        class_key: str,
        variant: str,
        counts: Counts,
        seconds: float,
        fit: CostFit | None,
    ) -> None:
        """``add``, its stalls judged against ``fit`` (the running fit; None: not capped)."""
        n, d, a = counts
        if n <= 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        step_variant = None if d <= 0 else variant
        seconds = self._add_step(step_variant, float(n - a), float(max(d, 0)), seconds, fit)
        if d > 0:
            self.raw.setdefault((class_key, variant), _Raw()).add(seconds, float(n - a), float(d))

    def _add_step(
        self, variant: str | None, m: float, d: float, seconds: float, fit: CostFit | None
    ) -> float:
        """One request for the step-time fit; the time it counts. A request far slower than
        ``fit`` expects (the machine stalled it: a router loading another instance on a
        small machine) would pull an unweighted fit by itself, and would set its
        variant's drafted-token cost for good if that variant is not served again; so once
        that fit stands its time counts at most ``STALL`` times the expected one (at the
        recent median of time over expected time), in both."""
        expected = fit._expected(variant, m, d) if fit is not None else None
        if expected is not None:
            if len(self.per_step) >= 8:
                seconds = min(seconds, STALL * statistics.median(self.per_step) * expected)
            self.per_step.append(seconds / expected)
        self.steps.setdefault(variant, _Raw()).add(seconds, m, d)
        return seconds

    def _expected(self, variant: str | None, m: float, d: float) -> float | None:
        """The fit's decode time for ``m`` steps and ``d`` drafts of a variant; None before
        the fit stands. Its cost per draft is its own once it has ``STALL_OWN`` requests;
        before, an n-gram type's is what it is priced at now (its length's cost, by the
        others): one stalled early request of a variant not served again would otherwise
        price it out for good. Other types wait for their own requests, as plain requests
        do for plain ones: a draft model's cost is not an n-gram's, and a cap from a cheaper
        cost would clip a dearer variant's every request, so its cost never caught up."""
        tau, own = self.step_time(), self.steps.get(variant)
        if tau is None:
            return None
        if own is not None and own.n >= STALL_OWN:
            kappa = max(0.0, (own.td - tau * own.md) / own.dd) if own.dd > 0 else 0.0
        elif variant is None or variant not in self.lengths:
            return None
        else:
            kappa = tau * self.costs([variant], lambda _: 1.0 / tau)[variant][0]
        expected = tau * m + kappa * d
        return expected if expected > 0 else None

    def step_time(self) -> float | None:
        """One plain decode step's time (seconds), fitted on every request of all traffic.

        The same structure that prices a drafted token, ``t = tau * (n - a) + kappa_v * d``
        with one ``tau`` and one ``kappa`` per variant, fitted by least squares over the
        speculative requests and the ones that drafted nothing (``t = tau * n``); in closed
        form, each ``kappa_v`` profiled out::

            tau = (sum tm - sum_v td_v md_v / dd_v) / (sum mm - sum_v md_v^2 / dd_v)

        Speculative requests inform ``tau`` through how their steps and drafts vary apart
        (a prompt that accepts more runs fewer steps for its drafts), so it needs no baseline
        request of every class; a stalled request counts at most ``STALL`` times its
        expected time (``_add_step``); None until the sums determine it.

        >>> cal = CostFit()
        >>> for n, d, a in [(100, 40, 30), (100, 60, 20), (80, 20, 18), (90, 0, 0)]:
        ...     cal.add("c", "v" if d else "none", (n, d, a), 0.01 * (n - a) + 0.004 * d)
        >>> round(cal.step_time(), 6)
        0.01
        """
        top = bottom = 0.0
        for raw in self.steps.values():
            top += raw.tm - (raw.td * raw.md / raw.dd if raw.dd > 0 else 0.0)
            bottom += raw.mm - (raw.md * raw.md / raw.dd if raw.dd > 0 else 0.0)
        # a variant whose steps are proportional to its drafts adds nothing but rounding
        if bottom <= 1e-9 * max(1.0, sum(r.mm for r in self.steps.values())):
            return None
        tau = top / bottom
        return tau if tau > 0 and math.isfinite(tau) else None

    def variants(self) -> set[str]:
        return {variant for _, variant in self.raw}

    def costs(
        self,
        variants: Iterable[str],
        speed: Callable[[str], float | None],
        within: Callable[[str], bool] | None = None,
    ) -> dict[str, tuple[float, float]]:
        """``c`` and its standard error for each variant; ``speed(class_key)``: the class's
        baseline decode speed now (None: not known yet; its requests wait).

        With ``within`` (a class key -> whether its requests count), the cost in those
        classes: a variant's requests there, shrunk toward its cost over all traffic by
        ``PRIOR_REQUESTS`` requests' worth (what a drafted token costs can depend on the
        prompts: an ``ngram-simple`` lookup scans the whole context each round).

        >>> cal = CostFit()
        >>> for key, c in [("a", 0.3), ("b", 0.6)]:
        ...     for n, d, a in [(100, 40, 30), (100, 60, 20), (80, 20, 18), (90, 0, 0)] * 20:
        ...         cal.add(key, "v" if d else "none", (n, d, a), 0.01 * (n - a + c * d))
        >>> speed = lambda key: 100.0
        >>> [round(cal.costs(["v"], speed, within=w)["v"][0], 2) for w in (None, "a".__eq__)]
        [0.45, 0.31]
        """
        speeds: dict[str, float | None] = {}
        by_variant: dict[str, _Sums] = {}
        inside: dict[str, _Sums] = {}
        for (key, variant), raw in self.raw.items():
            if key not in speeds:
                speeds[key] = speed(key)
            found = speeds[key]
            if found is not None:
                sums = by_variant.setdefault(variant, _Sums())
                at = raw.at(found)
                sums += at
                if within is not None and within(key):
                    here = inside.setdefault(variant, _Sums())
                    here += at
        total = _Sums()
        for each in by_variant.values():
            total += each
        pooled = total.ratio(self.prior, self.prior_se, 1.0)
        fit = by_length(
            [
                (self.lengths[name], sums.x / sums.d, sums.d)
                for name, sums in by_variant.items()
                if name in self.lengths and sums.n >= 2 and sums.d > 0
            ]
        )

        def start(name: str) -> tuple[float, float]:
            """Where a variant's cost starts: at its length, else the pooled cost."""
            length = self.lengths.get(name)
            return (fit(length), pooled[1]) if fit is not None and length else pooled

        overall = {
            name: own.ratio(*start(name), PRIOR_REQUESTS)
            if (own := by_variant.get(name))
            else start(name)
            for name in variants
        }
        if within is None:
            return overall
        return {
            name: local.ratio(*cost, PRIOR_REQUESTS) if (local := inside.get(name)) else cost
            for name, cost in overall.items()
        }
