"""Evidence as events, so that daemons on one storage pool it (``tuner.fleet``).

What the engine adds to its evidence (a served request's counts and speed, what replays
say other variants would have done, a finished trial) is an event: the engine applies its
own events with ``apply`` and publishes them; a daemon serving the same model on the same
kind of machine and build absorbs them with the same ``apply``, so its arms, calibration and
trial counters grow as if it had served them. The budget counters (seen, explored, spent)
stay local: they bound what each daemon spends exploring.

Events are typed (one model per kind, a union told apart by ``kind``) and carry their
schema ``version``. ``parse`` reads one back from storage: an event of an older version is
migrated first (one function per version, ``MIGRATIONS``), and one it cannot use gives None,
so that a bad row is skipped and counted, never fatal.

Version 1 (before versions were written) used one-letter keys: ``{"k": "served", "c":
class, "v": variant, "r": tok/s, "n": counts}``, ``{"k": "replayed", "c", "x": {variant:
counts}, "s": {"v", "n"}}``, ``{"k": "trial", "c", "v", "conv": bool}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tuner.tuning.evidence.classes import ClassState, levels
from tuner.tuning.evidence.counts import Counts, StoredCounts
from tuner.tuning.pricing.costfit import CostFit

__all__ = [
    "VERSION",
    "Event",
    "Replayed",
    "Served",
    "TrialDone",
    "apply",
    "dump",
    "parse",
    "replayed",
    "served",
    "trial_done",
    "upgrade",
]

VERSION = 2


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    version: Literal[2] = 2  # VERSION
    class_key: str


class Served(_Event):
    """One request ``variant`` answered: its speed and counts."""

    kind: Literal["served"] = "served"
    variant: str
    tok_s: float = Field(gt=0, allow_inf_nan=False)
    counts: StoredCounts


class ServedCounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    variant: str
    counts: StoredCounts


class Replayed(_Event):
    """What replaying one request's tokens says other variants would have done; with
    ``served``, the variant that answered it and the server's counts, so that the class
    keeps every variant's counts of the request side by side (``ClassState.pairs``)."""

    kind: Literal["replayed"] = "replayed"
    counts: dict[str, StoredCounts]
    served: ServedCounts | None = None


class TrialDone(_Event):
    """A class finished a trial (its study holds the value); converged: it stops searching."""

    kind: Literal["trial"] = "trial"
    variant: str
    converged: bool


Event = Annotated[Served | Replayed | TrialDone, Field(discriminator="kind")]
_EVENT: TypeAdapter[Served | Replayed | TrialDone] = TypeAdapter(Event)


def served(key: str, variant: str, tok_s: float, counts: Counts) -> Served:
    return Served(class_key=key, variant=variant, tok_s=tok_s, counts=Counts(*counts))


def replayed(
    key: str, counts: Mapping[str, Counts], served: tuple[str, Counts] | None = None
) -> Replayed:
    mine = ServedCounts(variant=served[0], counts=Counts(*served[1])) if served else None
    rows = {name: Counts(*c) for name, c in counts.items()}
    return Replayed(class_key=key, counts=rows, served=mine)


def trial_done(key: str, variant: str, converged: bool) -> TrialDone:
    return TrialDone(class_key=key, variant=variant, converged=converged)


def dump(event: Served | Replayed | TrialDone) -> dict[str, Any]:
    """The event as stored (JSON-ready)."""
    return event.model_dump(mode="json", exclude_none=True)


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """A version-1 event (one-letter keys, no version) in version 2's names."""
    out: dict[str, Any] = {"version": 2, "kind": data.get("k"), "class_key": data.get("c")}
    kind = data.get("k")
    if kind == "served":
        out |= {"variant": data.get("v"), "tok_s": data.get("r"), "counts": data.get("n")}
    elif kind == "replayed":
        out["counts"] = data.get("x")
        if isinstance(mine := data.get("s"), dict):
            out["served"] = {"variant": mine.get("v"), "counts": mine.get("n")}
        elif mine is not None:
            out["served"] = mine
    elif kind == "trial":
        out |= {"variant": data.get("v"), "converged": data.get("conv")}
    return out


# version -> the function that takes an event of that version to the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_v1}


def upgrade(
    data: dict[str, Any],
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]],
    *,
    unversioned: int | None = None,
) -> dict[str, Any]:
    """``data`` taken through each migration from its ``version`` (``unversioned`` where it
    has none) to the newest; the caller checks the version it ends at."""
    version = data.get("version", unversioned)
    while isinstance(version, int) and version in migrations:
        data = migrations[version](data)
        version = data.get("version")
    return data


def parse(data: object) -> Served | Replayed | TrialDone | None:
    """The event read back from storage, migrated to this version; None when it is not a
    well-formed event of a known version.

    >>> parse(dump(served("code", "ngram-mod", 41.5, Counts(64, 30, 12)))) is not None
    True
    >>> parse({"k": "served", "c": "code", "v": "x", "r": 41.5, "n": [1, 0, 0]}).version
    2
    >>> parse({"k": "served", "c": "code", "v": "x", "r": -1.0, "n": [1, 0, 0]}) is None
    True
    >>> parse({"k": "replayed", "c": "code", "x": {"a": [5, 2, 3]}}) is None  # a > d
    True
    """
    if not isinstance(data, dict):
        return None
    data = upgrade(data, MIGRATIONS, unversioned=1)
    try:
        return _EVENT.validate_python(data)
    except (ValidationError, ValueError, TypeError):
        return None


def apply(
    event: Served | Replayed | TrialDone,
    state: Callable[[str], ClassState],
    calibration: CostFit,
    known: Callable[[str], bool],
) -> bool:
    """Add an event to the evidence (the caller holds the engine's lock); False when it
    names no variant this daemon runs. A finished trial is counted in its class only: its
    evidence came with the requests it served."""
    key = event.class_key
    if isinstance(event, Served):
        if not known(event.variant):
            return False
        counts = event.counts
        calibration.add(key, event.variant, counts, counts.tokens / event.tok_s)
        for level in levels(key):
            state(level).arm(event.variant).add(event.tok_s, counts)
        return True
    if isinstance(event, Replayed):
        rows = {name: counts for name, counts in event.counts.items() if known(name)}
        pair = dict(rows)
        if event.served is not None and known(event.served.variant):
            pair[event.served.variant] = event.served.counts
        for level in levels(key):
            found = state(level)
            for name, counts in rows.items():
                found.arm(name).add_replayed(counts)
            if len(pair) >= 2:
                found.pairs.append(pair)
        return bool(rows)
    target = state(key)
    target.trials_done += 1
    target.converged = target.converged or event.converged
    return True
