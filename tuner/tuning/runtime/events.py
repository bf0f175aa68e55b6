"""Evidence as events, so that daemons on one storage pool it (``tuner.fleet``).

What the engine adds to its evidence (a served request's counts and speed, what replays
say other variants would have done, a finished trial) is an event: the engine applies its
own events with ``apply`` and publishes them; a daemon serving the same model on the same
kind of machine and build absorbs them with the same ``apply``, so its arms, calibration and
trial counters grow as if it had served them. The budget counters (seen, explored, spent)
stay local: they bound what each daemon spends exploring.

Events are small JSON objects (``served``, ``replayed``, ``trial``); ``parse`` checks one
read back from storage and returns None for one it cannot use, so that a bad row is
skipped and counted, never fatal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from tuner.tuning.evidence.classes import ClassState, levels
from tuner.tuning.evidence.counts import Counts
from tuner.tuning.pricing.calibration import Calibration

__all__ = ["Event", "apply", "parse", "replayed", "served", "trial_done"]

Event = dict[str, Any]


def served(key: str, variant: str, tok_s: float, counts: Counts) -> Event:
    """One request ``variant`` answered: its speed and (tokens, drafted, accepted)."""
    return {"k": "served", "c": key, "v": variant, "r": tok_s, "n": list(counts)}


def replayed(
    key: str, counts: Mapping[str, Counts], served: tuple[str, Counts] | None = None
) -> Event:
    """What replaying one request's tokens says other variants would have done; with
    ``served``, the variant that answered it and the server's counts, so that the class
    keeps every variant's counts of the request side by side (``ClassState.pairs``)."""
    event = {"k": "replayed", "c": key, "x": {name: list(c) for name, c in counts.items()}}
    if served is not None:
        event["s"] = {"v": served[0], "n": list(served[1])}
    return event


def trial_done(key: str, variant: str, converged: bool) -> Event:
    """A class finished a trial (its study holds the value); converged: it stops searching."""
    return {"k": "trial", "c": key, "v": variant, "conv": converged}


def _counts(value: object) -> Counts | None:
    if not isinstance(value, list) or len(value) != 3:
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        return None
    counts = Counts(*value)
    return counts if counts.accepted <= counts.drafted else None


def parse(event: object) -> Event | None:
    """The event if it is well formed, else None.

    >>> parse(served("code", "ngram-mod", 41.5, (64, 30, 12))) is not None
    True
    >>> parse({"k": "served", "c": "code", "v": "x", "r": -1.0, "n": [1, 0, 0]}) is None
    True
    >>> parse({"k": "replayed", "c": "code", "x": {"a": [5, 2, 3]}}) is None  # a > d
    True
    """
    if not isinstance(event, dict) or not isinstance(event.get("c"), str):
        return None
    kind = event.get("k")
    if kind == "served":
        rate = event.get("r")
        ok = (
            isinstance(event.get("v"), str)
            and isinstance(rate, int | float)
            and math.isfinite(rate)
            and rate > 0
            and _counts(event.get("n")) is not None
        )
        return event if ok else None
    if kind == "replayed":
        rows, served = event.get("x"), event.get("s")
        if not isinstance(rows, dict) or not all(_counts(c) is not None for c in rows.values()):
            return None
        ok = served is None or (  # events from before pairs were kept have none
            isinstance(served, dict)
            and isinstance(served.get("v"), str)
            and _counts(served.get("n")) is not None
        )
        return event if ok else None
    if kind == "trial":
        ok = isinstance(event.get("v"), str) and isinstance(event.get("conv"), bool)
        return event if ok else None
    return None


def apply(
    event: Event,
    state: Callable[[str], ClassState],
    calibration: Calibration,
    known: Callable[[str], bool],
) -> bool:
    """Add a parsed event to the evidence (the caller holds the engine's lock); False when
    it names no variant this daemon runs. A finished trial is counted in its class only:
    its evidence came with the requests it served."""
    key = event["c"]
    kind = event["k"]
    if kind == "served":
        variant = event["v"]
        if not known(variant):
            return False
        tok_s = float(event["r"])
        counts = Counts(*event["n"])
        calibration.add(key, variant, counts, counts.tokens / tok_s)
        for level in levels(key):
            state(level).arm(variant).add(tok_s, counts)
        return True
    if kind == "replayed":
        rows = {name: Counts(*c) for name, c in event["x"].items() if known(name)}
        pair = dict(rows)
        if (served := event.get("s")) is not None and known(served["v"]):
            pair[served["v"]] = Counts(*served["n"])
        for level in levels(key):
            found = state(level)
            for name, counts in rows.items():
                found.arm(name).add_replayed(counts)
            if len(pair) >= 2:
                found.pairs.append(pair)
        return bool(rows)
    target = state(key)
    target.trials_done += 1
    target.converged = target.converged or bool(event["conv"])
    return True
