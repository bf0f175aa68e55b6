"""How the machine's own speed moved through a bench run, and what it did to the daemons' ratios.

The no-speculation arm decodes the same way all run long, so its time per token, over its
class's level, traces the machine's speed (``drift``: the geometric mean per eighth of
the run, 1.00 = the run's typical speed). The model: log time per token = the class's level
+ the machine's speed at that moment. Both are fitted in turn: each class's level as a
trimmed mean net of the machine, the machine at each moment as a line (least squares,
refitted without the farthest tenth) through the 40 requests nearest it, net of the
levels. A line rather than a rolling median reads a machine that speeds up all run right
at the run's ends too, and fitting the levels net of the machine keeps two classes whose
requests happened to fall early and late from reading as a step of the machine. Each
daemon request is compared with the request of the same prompt on a static arm (the one
nearest in time), raw and with both moved to one machine speed (``adjusted``: the static
request's time scaled by the drift at the daemon's moment over the drift at its own):

- ``minutes_apart``: the median time between a daemon request and the static one it is
  compared with (a schedule that runs a prompt's static arms beside the tuner's request
  puts this near 0, and then ``adjusted`` equals ``raw``);
- ``vs_static``: per static arm, the daemon's whole-run speed over the arm's (decode time
  for the daemon's tokens at the arm's time per token, over the daemon's), raw and adjusted;
- ``plain_quarters``: per quarter of the daemon's stream, its requests that drafted nothing
  against the no-speculation arm's, raw and adjusted (no choice changes those requests, so
  an adjusted reading near 1 says the raw reading's swing was the machine's).

An estimate, not a measurement: it assumes the machine's speed moved every process alike
(``benchmarks/process_spread.py`` measured that for identical processes).

Usage: python -m benchmarks.drift DIR [--out FILE.json]
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import run_main, usable
from benchmarks.exploration_cost import DAEMONS
from tuner.bench.analyse import charged_seconds

WINDOW = 20  # requests of the no-speculation arm each side of a moment
FITS = 5  # rounds of fitting the classes' levels and the machine's speed in turn
TRIM = 0.1  # the share of outlying requests a fit leaves out


@dataclass(frozen=True)
class Drift:
    """The machine's log speed factor through a run, from the no-speculation arm's requests
    (their times ``t`` and log time per token over their class's level)."""

    times: Sequence[float]
    logs: Sequence[float]
    _lines: dict[int, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)

    def at(self, t: float) -> float:
        """The log factor at moment ``t``: a robust line through the ``2 * WINDOW``
        requests nearest ``t`` (a full window at the run's ends too), read at ``t`` (at
        the window's first or last request where ``t`` lies outside it: no extrapolation)."""
        n = len(self.logs)
        lo = max(0, min(bisect.bisect_left(self.times, t) - WINDOW, n - 2 * WINDOW))
        hi = min(n, lo + 2 * WINDOW)
        if lo not in self._lines:
            self._lines[lo] = robust_line(self.times[lo:hi], self.logs[lo:hi])
        slope, intercept = self._lines[lo]
        return intercept + slope * min(max(t, self.times[lo]), self.times[hi - 1])

    def by_part(self, parts: int = 8) -> list[float]:
        n = len(self.logs)
        return [
            round(math.exp(statistics.fmean(self.logs[n * k // parts : n * (k + 1) // parts])), 3)
            for k in range(parts)
            if n * (k + 1) // parts > n * k // parts
        ]


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    x0, y0 = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - x0) ** 2 for x in xs)
    if not spread:
        return 0.0, y0
    slope = sum((x - x0) * (y - y0) for x, y in zip(xs, ys, strict=True)) / spread
    return slope, y0 - slope * x0


def robust_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """A line through the points (slope, intercept): least squares, then least squares again
    without the ``TRIM`` share of points farthest from the first line (a hiccup of the
    machine moves it little). Pure."""
    slope, intercept = _least_squares(xs, ys)
    keep = sorted(range(len(xs)), key=lambda k: abs(ys[k] - intercept - slope * xs[k]))
    keep = keep[: len(keep) - int(TRIM * len(keep))]
    return _least_squares([xs[k] for k in keep], [ys[k] for k in keep])


def trimmed_mean(values: Sequence[float]) -> float:
    """The mean without the ``TRIM`` share of lowest and of highest values. Pure."""
    cut = int(TRIM * len(values))
    return statistics.fmean(sorted(values)[cut : len(values) - cut])


def _per_token(row: dict[str, Any]) -> float:
    """Milliseconds a token, a daemon's warm seconds charged as every bench ratio does."""
    return charged_seconds(row) * 1000.0 / float(row["tokens"])


def drift(rows: Iterable[dict[str, Any]]) -> Drift:
    """The machine's speed through the run, from the ``none`` arm's answered, timestamped
    requests. Pure."""
    plain = sorted((r for r in rows if r["arm"] == "none"), key=lambda r: r["t"])
    times = [float(r["t"]) for r in plain]
    raw = [math.log(_per_token(r)) for r in plain]
    machine = Drift(times, [0.0] * len(plain))
    for _ in range(FITS):  # each class's level net of the machine, then the machine net of those
        by_class: dict[str, list[float]] = defaultdict(list)
        for row, t, value in zip(plain, times, raw, strict=True):
            by_class[row["class"]].append(value - machine.at(t))
        level = {c: trimmed_mean(v) for c, v in by_class.items()}
        machine = Drift(times, [v - level[r["class"]] for r, v in zip(plain, raw, strict=True)])
    typical = statistics.median(machine.logs) if plain else 0.0  # 1.00: the run's typical speed
    return Drift(times, [v - typical for v in machine.logs])


def _by_prompt(rows: Iterable[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        out[row["item"]].append(row)
    return out


def _partner(found: dict[int, list[dict[str, Any]]], row: dict[str, Any]) -> dict[str, Any] | None:
    same = found.get(row["item"])
    return min(same, key=lambda r: abs(r["t"] - row["t"])) if same else None


def compare(rows: list[dict[str, Any]], machine: Drift) -> dict[str, Any]:
    """Per daemon: how far apart its requests and their static partners ran, its whole-run
    speed over each static arm, and its plain requests by quarter, raw and adjusted (answered,
    timestamped ``rows``). Pure."""
    static = sorted({r["arm"] for r in rows} - {"none", *DAEMONS})
    arms = {arm: _by_prompt(r for r in rows if r["arm"] == arm) for arm in ["none", *static]}
    out: dict[str, Any] = {}
    for daemon in DAEMONS:
        mine = [r for r in rows if r["arm"] == daemon]
        if not mine:
            continue
        apart: list[float] = []
        vs: dict[str, Any] = {}
        for arm in static:
            ours = raw = adjusted = 0.0
            for row in mine:
                other = _partner(arms[arm], row)
                if other is None:
                    continue
                theirs = _per_token(other) * float(row["tokens"])
                ours += _per_token(row) * float(row["tokens"])
                raw += theirs
                adjusted += theirs * math.exp(machine.at(row["t"]) - machine.at(other["t"]))
                apart.append(abs(row["t"] - other["t"]) / 60)
            if ours:
                vs[arm] = {"raw": round(raw / ours, 4), "adjusted": round(adjusted / ours, 4)}
        out[daemon] = {
            "minutes_apart": round(statistics.median(apart), 2) if apart else None,
            "vs_static": vs,
            "plain_quarters": _plain_quarters(mine, arms["none"], machine),
        }
    return out


def _plain_quarters(
    mine: list[dict[str, Any]], none: dict[int, list[dict[str, Any]]], machine: Drift
) -> list[dict[str, Any] | None]:
    out: list[dict[str, Any] | None] = []
    n = len(mine)
    for q in range(4):
        raw: list[float] = []
        adjusted: list[float] = []
        for row in mine[n * q // 4 : n * (q + 1) // 4]:
            other = _partner(none, row)
            if row.get("drafted") or other is None:
                continue
            log = math.log(_per_token(row) / _per_token(other))
            raw.append(log)
            adjusted.append(log - machine.at(row["t"]) + machine.at(other["t"]))
        out.append(
            {
                "requests": len(raw),
                "raw": round(math.exp(statistics.fmean(raw)), 3),
                "adjusted": round(math.exp(statistics.fmean(adjusted)), 3),
            }
            if raw
            else None
        )
    return out


def analyse(rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if usable(r) and "t" in r]
    machine = drift(rows)
    if not machine.logs:
        return {"drift_by_eighth": [], "daemons": {}}
    return {"drift_by_eighth": machine.by_part(), "daemons": compare(rows, machine)}


def main() -> None:
    run_main(__doc__ or "", analyse)


if __name__ == "__main__":
    main()
