"""The policy file: everything the engine learned, written atomically, read on start.

``<state>/policies.json`` holds, per class, the chosen variant with its evidence
(requests, alpha and speedup with intervals, predicted speedup, since when), the
exploration counters and the per-variant evidence; plus the model, build and
hardware it was learned on. A crash leaves the previous file or the new one.
A file learned on another model, build or machine is set aside (renamed), not
reused; so is one that is not a policy file (a hand edit that broke its JSON, or an entry
the engine cannot restore: ``set_aside``), and the daemon starts fresh rather than
failing to start or overwriting it. A file of an earlier version is migrated as it is
read (``migrate``: one function per version), so an upgrade keeps what was learned.

Versions: 2 stored a request's counts as ``[tokens, drafted, accepted]``; 3 stores the
fleet's unsent events with their own schema version (``tuner.tuning.runtime.events``),
and its classes are checked against ``ClassRecord``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tuner.atomic import write_atomic
from tuner.logs import get_logger
from tuner.tuning.runtime.events import dump, parse, upgrade

__all__ = [
    "POLICY_FILE",
    "VERSION",
    "PolicyMeta",
    "load_policies",
    "migrate",
    "parked",
    "read_document",
    "save_policies",
    "set_aside",
    "study_scope",
]

log = get_logger(__name__)

POLICY_FILE = "policies.json"
VERSION = 3

PolicyMeta = dict[str, Any]  # model, model_key, engine, build, hardware, hardware_key


def save_policies(
    path: Path, meta: PolicyMeta, classes: dict[str, Any], *, extra: dict[str, Any] | None = None
) -> None:
    """``extra``: more top-level keys (the one-variant-at-a-time state)."""
    document = {"version": VERSION, "saved": time.time(), **meta, **(extra or {})}
    document["classes"] = classes
    write_atomic(path, json.dumps(document, indent=1, sort_keys=True) + "\n")


def read_document(path: Path) -> dict[str, Any] | None:
    """The policy file as written, or None when absent or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("policies_unreadable", path=str(path), error=str(exc))
        return None
    return migrate(data)


def _from_v2(document: dict[str, Any]) -> dict[str, Any]:
    """Version 2 to 3: the fleet's unsent events in their versioned form."""
    fleet = document.get("fleet")
    if isinstance(fleet, dict) and isinstance(fleet.get("outbox"), list):
        outbox = []
        for item in fleet["outbox"]:
            event = parse(item[2]) if isinstance(item, list) and len(item) == 3 else None
            if event is not None:
                outbox.append([item[0], item[1], dump(event)])
        document = {**document, "fleet": {**fleet, "outbox": outbox}}
    return {**document, "version": 3}


# version -> the function that takes a document of that version to the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {2: _from_v2}


def migrate(data: object) -> dict[str, Any] | None:
    """A policy document of this version: as it is, or migrated from an earlier one; None
    for anything else.

    >>> migrate({"version": 2, "classes": {}})["version"]
    3
    >>> migrate({"version": 1, "classes": {}}) is None  # older than any migration
    True
    """
    if not isinstance(data, dict):
        return None
    data = upgrade(data, MIGRATIONS)
    return data if data.get("version") == VERSION else None


def set_aside(path: Path, why: str, **context: Any) -> Path | None:
    """Rename the policy file out of the way (``<stem>.<time>.<why>.json``), kept for the
    user to look at; None when it cannot be renamed (then it stays, and is overwritten)."""
    aside = path.with_name(f"{path.stem}.{int(time.time())}.{why}.json")
    try:
        path.replace(aside)
    except OSError as exc:
        log.error("policies_set_aside_failed", path=str(path), error=str(exc))
        return None
    log.warning("policies_set_aside", path=str(aside), **context)
    return aside


def study_scope(meta: Mapping[str, Any]) -> str:
    """The local Optuna studies' scope: model and machine, and the engine where it is not
    mainline (whose studies were scoped before a second engine was)."""
    scope = f"{meta.get('model_key')}@{meta.get('hardware_key')}"
    engine = meta.get("engine")
    return scope if engine in (None, "llama.cpp") else f"{scope}@{engine}"


def parked(path: Path, engine: str) -> Path:
    """Where the policy file of an engine that is not serving waits for it."""
    return path.parent / "engines" / engine / path.name


def _swap_engines(path: Path, engine: str | None) -> None:
    """Each engine learns apart: a policy file of another engine is parked for it, and
    this engine's parked one (if any) takes its place."""
    if engine is None:
        return
    data = read_document(path)
    other = data.get("engine") if data is not None else None
    if isinstance(other, str) and other != engine:
        target = parked(path, other)
        target.parent.mkdir(parents=True, exist_ok=True)
        path.replace(target)
        log.info("policies_parked", engine=other, path=str(target))
    mine = parked(path, engine)
    if not path.exists() and mine.is_file():
        mine.replace(path)
        log.info("policies_unparked", engine=engine, path=str(path))


def load_policies(path: Path, meta: PolicyMeta) -> dict[str, Any]:
    """The learned classes, if the file was learned on this model, build and machine
    (another engine's file is parked for it, and this engine's own comes back).

    Also removes temporary files a crash left mid-write (the policy file itself is whole).
    """
    for stale in path.parent.glob(f".{path.stem}-*.tmp"):
        stale.unlink(missing_ok=True)
    _swap_engines(path, meta.get("engine"))
    data = read_document(path)
    if data is None:
        if path.is_file():  # there, readable or not, but no policy file of this version
            set_aside(path, "bad", reason="unreadable, or not a policy file of this version")
        return {}
    mismatch = [k for k in ("model_key", "build", "hardware_key") if data.get(k) != meta.get(k)]
    if mismatch:
        set_aside(path, "old", changed=mismatch)
        return {}
    classes = data.get("classes")
    return classes if isinstance(classes, dict) else {}
