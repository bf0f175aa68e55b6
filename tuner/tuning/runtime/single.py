"""One variant loaded at a time: serve the traffic-weighted best, explore in windows.

When only one llama-server instance fits (a large model on one GPU: the router's
capacity is 1), changing variant means reloading the model, seconds to minutes.
Requests can then no longer go to whichever variant their class prefers. All
traffic is served by one **active** variant, the one with the highest
traffic-weighted speedup over the recent traffic mix::

    gain(v) = sum over classes c of share(c) * speedup_c(v)

(``speedup_c(v)``: class ``c``'s measured speed under ``v`` over its own baseline;
1 where ``c`` has not measured ``v``), and it changes only when the decoding time
the switch saves over the next ``horizon_s`` seconds exceeds the reload it costs::

    busy_s * (1 - gain(active) / gain(best)) > reload_s

where ``busy_s`` is the decoding expected in the horizon at the recent load and
``reload_s`` the measured reload (first request after a switch, minus a normal
first byte). Exploration stays inside its own share of requests
(``single.explore_share``) and runs in windows: one candidate variant for ``window``
requests of any class, then, when the active variant is speculative, a baseline window,
so each reload is paid once per window rather than per request; and a window opens only
while its two reloads cost less than that share of the decoding expected in the horizon (a
model that takes minutes to load under light traffic is not explored at all). Candidates
come from the root class's Optuna study, the speedup model's best first. Per-class
evidence still accumulates in the engine (every request counts for its class under
whatever variant served it), and the gains are computed from it every few dozen requests,
so a change in the traffic mix moves the choice. A class's own kill switch cannot apply
(one variant serves everyone); its override can: pinned or off classes get their
variant regardless, reload or not.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.classify.classes import ROOT
from tuner.logs import get_logger
from tuner.records import RequestRecord
from tuner.sessions.moves import Turn
from tuner.tuning.policy.guard import Role
from tuner.tuning.pricing.waiting import Busy
from tuner.tuning.runtime.engine import Decision, Engine
from tuner.tuning.variants import BASELINE, Variant

__all__ = ["SingleVariant", "one_at_a_time", "switch_pays", "traffic_gain"]

log = get_logger(__name__)

RECENT = 512  # requests whose classes define the traffic mix
RECHOOSE = 64  # requests observed between re-computations of the gains
TTFB_WINDOW = 64  # first-byte times of requests that needed no reload


def traffic_gain(
    shares: Mapping[str, float], speedups: Mapping[str, Mapping[str, float]], variant: str
) -> float:
    """The speedup of ``variant`` over the whole traffic mix.

    ``shares``: each class's share of recent requests; ``speedups``: per class, the
    measured speedup of each variant it measured. Unmeasured counts as 1.

    >>> traffic_gain({"code": 0.5, "prose": 0.5}, {"code": {"a": 1.4}, "prose": {"a": 0.9}}, "a")
    1.15
    >>> traffic_gain({"code": 0.5, "prose": 0.5}, {"code": {"a": 1.4}}, "a")
    1.2
    """
    total = sum(shares.values())
    if total <= 0 or variant == BASELINE.name:
        return 1.0
    gain = sum(share * speedups.get(c, {}).get(variant, 1.0) for c, share in shares.items())
    return round(gain / total, 12)


def switch_pays(current: float, best: float, busy_s: float, reload_s: float) -> bool:
    """Whether moving from a variant of traffic-weighted speedup ``current`` to ``best``
    saves more decoding time over ``busy_s`` seconds of decoding than the reload costs.

    >>> switch_pays(1.0, 1.2, busy_s=60.0, reload_s=5.0)
    True
    >>> switch_pays(1.0, 1.05, busy_s=60.0, reload_s=5.0)
    False
    """
    if best <= current or best <= 0:
        return False
    return busy_s * (1.0 - current / best) > reload_s


@dataclass(slots=True)
class Window:
    """Consecutive requests (any class) served by one variant, to pay its reload once."""

    variant: str
    role: Role
    size: int
    number: int | None = None  # the root study's trial, for a candidate window
    sent: int = 0
    seen: int = 0


class SingleVariant:
    """Routing and learning when one variant is loaded at a time (see the module doc)."""

    def __init__(
        self,
        engine: Engine,
        *,
        reload_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.engine = engine
        self.reload_s = reload_s  # measured once a switch was seen; the guess until then
        self.reload_measured = False
        self.clock = clock
        self.active = BASELINE.name
        self.gains: dict[str, float] = {}
        self.reason = "no evidence yet"
        self.switches = 0
        self.seen = 0
        self.observed = 0
        self.explored = 0
        self.candidates = 0  # candidate windows started
        self.converged = False
        self.window: Window | None = None  # the window being routed
        self.pending: deque[Window] = deque()  # planned after it
        self.open: dict[tuple[str, int | None], Window] = {}  # routed, results still coming
        self.prepared: tuple[int, Variant] | None = None
        self.preparing = False
        self.recent: deque[str] = deque(maxlen=RECENT)
        self.decoding: deque[tuple[float, float]] = deque()  # (finished at, decode seconds)
        self._decoding_s = 0.0  # their sum
        self.ttfb: deque[float] = deque(maxlen=TTFB_WINDOW)
        self.last_variant: str | None = None
        self._lock = threading.RLock()

    @property
    def per_class(self) -> bool:
        """One variant serves everyone: no per-class instance to keep a turn on."""
        return False

    # -- request path ---------------------------------------------------------------

    def route(
        self,
        class_key: str | None,
        turn: Turn | None = None,
        busy: Busy | None = None,
        *,
        opens: bool = False,
    ) -> Decision:
        """The window's or the active variant for one request (``turn``, ``busy`` and
        ``opens`` are not used: there is one instance, which holds every conversation there
        is and decodes every request)."""
        key = class_key or ROOT
        config = self.engine.config
        with self._lock:
            self.seen += 1
            self.recent.append(key)
            override = self.engine.router.override(key)  # the published table: no lock
            if override.pin is not None and override.pin in self.engine.variants:
                return Decision(override.pin, "pinned", policy_class=key)
            if override.off:
                return Decision(BASELINE.name, "exploit", policy_class=key)
            window = self.window
            if window is None and self.explored < config.single.explore_share * self.seen:
                window = self._open_window()
            forbidden = self.engine.router.forbidden
            if window is None or forbidden(key, window.variant):
                active = BASELINE.name if forbidden(key, self.active) else self.active
                return Decision(active, "exploit", policy_class=ROOT)
            window.sent += 1
            self.explored += 1
            if window.sent >= window.size:
                self.window = None
            return Decision(window.variant, window.role, window.number, ROOT)

    def _open_window(self) -> Window | None:
        """The next planned window, or a candidate's (asking the study off the request path)."""
        budget = self.engine.config.single.explore_share * self.busy_s()
        if self.pending:
            self.window = self.pending.popleft()
        elif 2 * self.reload_s > budget:
            return None  # a window's reloads (there and back) would cost more than the budget
        elif self.prepared is not None:
            (number, variant), self.prepared = self.prepared, None
            size = self.engine.config.single.window
            self.window = Window(variant.name, "trial", size, number)
            if self.active != BASELINE.name:  # a baseline to compare with, from the same minutes
                self.pending.append(Window(BASELINE.name, "control", size))
            self.candidates += 1
        elif not self.converged and not self.preparing and self.engine.studies is not None:
            self.preparing = True
            self.engine.io(self._prepare)
        if self.window is not None:
            self.open[(self.window.variant, self.window.number)] = self.window
        return self.window

    # -- learning -------------------------------------------------------------------

    def observe(self, record: RequestRecord) -> None:
        self.engine.observe(record)
        timings = record.timings
        with self._lock:
            self.observed += 1
            periodic = self.observed % RECHOOSE == 0  # the traffic mix moves between windows
            if record.variant is not None and record.status == 200 and timings is not None:
                self._note_cost(record)
            window = self.open.get((record.variant or "", record.trial))
            if window is not None and record.role in ("trial", "control"):
                window.seen += 1
            if window is None or window.seen < window.size:
                window = None
            else:
                del self.open[(window.variant, window.number)]
        if window is None:
            if periodic:
                self.choose()
            return
        if window.number is not None:
            self.engine.io(lambda: self._tell(window))
        else:
            self.choose()

    def _note_cost(self, record: RequestRecord) -> None:
        """Decoding time (the load) and, on a change of variant, the reload it took."""
        timings = record.timings
        assert timings is not None
        if timings.predicted_ms:
            now = self.clock()
            self.decoding.append((now, timings.predicted_ms / 1000))
            self._decoding_s += timings.predicted_ms / 1000
            horizon = self.engine.config.single.horizon_s
            while self.decoding and self.decoding[0][0] < now - horizon:
                self._decoding_s -= self.decoding.popleft()[1]
        if record.ttfb_ms is None:
            return
        first_byte = record.ttfb_ms / 1000
        if self.last_variant is not None and record.variant != self.last_variant and self.ttfb:
            typical = sorted(self.ttfb)[len(self.ttfb) // 2]
            sample = max(first_byte - typical, 0.0)
            measured = 0.7 * self.reload_s + 0.3 * sample if self.reload_measured else sample
            self.reload_s = measured
            self.reload_measured = True
        elif record.variant == self.last_variant:
            self.ttfb.append(first_byte)
        self.last_variant = record.variant

    def busy_s(self) -> float:
        """Decoding seconds expected over the next horizon, at the recent load."""
        horizon = self.engine.config.single.horizon_s
        with self._lock:
            if not self.decoding:
                return 0.0
            span = max(self.clock() - self.decoding[0][0], 1.0)
            return max(self._decoding_s, 0.0) * horizon / min(span, horizon)

    def choose(self) -> str:
        """Re-compute the traffic-weighted gains and switch when it pays; the active variant."""
        with self._lock:
            shares = {k: n / len(self.recent) for k, n in Counter(self.recent).items()}
        speedups = self.engine.class_speedups(shares)
        names = {v for per in speedups.values() for v in per}
        gains = {v: traffic_gain(shares, speedups, v) for v in names}
        gains[BASELINE.name] = 1.0
        busy = self.busy_s()
        min_gain = self.engine.config.guard.min_gain
        with self._lock:
            self.gains = gains
            best = max(gains, key=lambda v: (gains[v], v == BASELINE.name))
            if best != BASELINE.name and gains[best] < min_gain:
                best = BASELINE.name
            current = gains.get(self.active, 1.0)
            if best != self.active and (
                current < 1.0 or switch_pays(current, gains[best], busy, self.reload_s)
            ):
                old, self.active = self.active, best
                self.switches += 1
                self.reason = (
                    f"{best} at {gains[best]:.2f}x over the traffic mix (was {old} at "
                    f"{current:.2f}x); saves more than a {self.reload_s:.1f} s reload "
                    f"within {self.engine.config.single.horizon_s:.0f} s"
                )
                log.info(
                    "single_variant_switch",
                    variant=best,
                    old=old,
                    gain=gains[best],
                    reload_s=round(self.reload_s, 2),
                    busy_s=round(busy, 1),
                )
            elif best == self.active:
                self.reason = f"{best} is the best over the traffic mix ({gains[best]:.2f}x)"
            return self.active

    # -- the root study (IO thread) --------------------------------------------------

    def _prepare(self) -> None:
        """Ask the root study for the next candidate (the prior's best first)."""
        studies = self.engine.studies
        assert studies is not None
        try:
            space = self.engine.space(ROOT)
            if not space or self.candidates >= self.engine.config.budget.max_trials:
                with self._lock:
                    self.converged = True
                return
            with self._lock:
                tried = {w for w, _ in self.open} | set(self.gains)
            ranked = self.engine.prior_for(ROOT).ranked
            first = [v for v, _ in ranked if v.name not in tried and v.spec_type in space]
            suggest = (
                first[0] if first and self.candidates < self.engine.config.prior.enqueue else None
            )
            number, variant = studies.open(ROOT, space).next(suggest)
            with self._lock:
                self.prepared = (number, variant)
        except Exception:
            log.exception("single_variant_ask_failed")
        finally:
            with self._lock:
                self.preparing = False

    def _tell(self, window: Window) -> None:
        active = self.choose()
        value = self.gains.get(window.variant)
        assert self.engine.studies is not None and window.number is not None
        try:
            self.engine.studies.open(ROOT, self.engine.space(ROOT)).tell(
                window.number,
                value,
                attrs={"variant": window.variant, "requests": window.size, "active": active},
            )
        except Exception:
            log.exception("single_variant_tell_failed")

    def reevaluate(self) -> None:
        """The engine's drift check, then the traffic-weighted choice."""
        self.engine.check_drift()
        self.choose()

    def describe(self) -> dict[str, Any]:
        """For the policy file and the report."""
        return {"single": self.state()}

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "active": self.active,
                "reason": self.reason,
                "gains": {k: round(v, 4) for k, v in sorted(self.gains.items())},
                "reload_s": round(self.reload_s, 3),
                "reload_measured": self.reload_measured,
                "busy_s": round(self.busy_s(), 1),
                "switches": self.switches,
                "windows": self.candidates,
            }


def one_at_a_time(reload_s: float) -> Callable[[Engine], SingleVariant]:
    """The strategy where one instance fits: one variant over the engine's evidence, given
    a guess of what a reload takes (measured once a switch is seen)."""

    def build(engine: Engine) -> SingleVariant:
        log.info(
            "single_variant",
            detail="one variant loaded at a time",
            reload_guess_s=round(reload_s, 1),
        )
        return SingleVariant(engine, reload_s=reload_s)

    return build
