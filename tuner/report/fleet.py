"""The fleet's view for ``tuner report --storage-url``: read from its database.

Every daemon of a fleet pools the same evidence, so each class's policy is shown as the
daemon that saved last decided it (its policy file, kept in the database), and each class
says how many daemons (nodes: a host and state dir) served requests of it or of the
classes under it. With daemons of several models, machines or builds on one database, the
scope of the newest document is shown and the others are listed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

from tuner.errors import TunerError
from tuner.fleet.ledger import Ledger, redact
from tuner.report.data import Report, build_report
from tuner.tuning.evidence.classes import under

__all__ = ["load_fleet_report"]


def load_fleet_report(url: str, scope: str | None = None) -> Report:
    ledger = Ledger(url)
    try:
        documents = ledger.documents()  # every scope's: the others are listed
        shown_scope = scope or (documents[0][0] if documents else None)
        contributors = ledger.contributors(shown_scope) if shown_scope else {}
    except (psycopg.Error, OSError) as exc:
        raise TunerError(f"cannot read the fleet's database at {redact(url)}: {exc}") from exc
    finally:
        ledger.close()
    mine = [d for d in documents if d[0] == shown_scope]
    if not mine:
        return Report(state_dir=redact(url), found=False)
    _, node, _, document = mine[0]
    report = build_report(document if isinstance(document, dict) else None, redact(url))

    def daemons(key: str) -> int:
        return len({n for leaf, nodes in contributors.items() if under(key, leaf) for n in nodes})

    rows = [dataclasses.replace(row, daemons=daemons(row.class_key)) for row in report.classes]
    fleet: dict[str, Any] = {
        "url": redact(url),
        "scope": shown_scope,
        "shown": node,
        "daemons": [{"node": n, "saved": saved} for _, n, saved, _ in mine],
        "other_scopes": sorted({d[0] for d in documents} - {shown_scope}),
    }
    return dataclasses.replace(report, classes=rows, fleet=fleet)
