"""Where two daemons of one bench run settled on different variants, and how each rated both.

A bench run with a challenger holds two daemons' final policies (``tuner-state`` and
``challenger-state``, each a ``policies.json``). For every class that both daemons served
and whose chosen variants differ, this reports:

- ``rates``: per daemon, its speedup and interval for its own choice and for the other's;
- ``prefers_own``: per daemon, whether it rates its own choice above the other's;
- ``lock_in``: both prefer their own. Replays measure an ``ngram-simple`` variant's counts
  alike in both daemons, so two daemons that each rate their own choice higher differ in
  what a drafted token costs: the variant a daemon serves has its cost measured on its own
  requests, the other is priced from the few it served, shrunk toward the pool;
- ``over_static``: per daemon, from the run's ``requests.jsonl``, its requests of that class
  that ran its final choice, their time at the best static arm's time per token on the same
  prompt over their own (above 1: faster than the static arm); with ``requests``, how many.
  The two daemons served the same prompts, so this says which choice ran faster, to within
  the run's noise.

Usage: python -m benchmarks.lock_in DIR [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import emit, read_requests, usable
from benchmarks.exploration_cost import DAEMONS, static_ratios
from tuner.bench.analyse import charged_seconds


def _leaves(policies: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The classes a daemon served itself (not the levels above them, which serve nothing)."""
    return {k: v for k, v in policies["classes"].items() if v.get("seen", 0) > 0}


def _rating(found: dict[str, Any], variant: str) -> list[float] | None:
    if variant == "none":
        return [1.0, 1.0, 1.0]
    rated = found.get("speedups", {}).get(variant)
    return [round(float(x), 3) for x in rated] if rated is not None else None


def _over_static(rows: list[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[float, int]]:
    """Per (daemon, class, variant): the best static arm's time on the same prompts over the
    daemon's own (answered rows; with ``--repeats``, the prompt's mean time per token on
    that arm), and the number of requests."""
    _, best = static_ratios(rows)
    per_token: dict[Any, list[float]] = defaultdict(list)
    for row in rows:
        if row["arm"] == best:
            per_token[row["item"]].append(charged_seconds(row) / float(row["tokens"]))
    sums: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        if row["arm"] not in DAEMONS or not per_token.get(row["item"]):
            continue
        found = sums[(row["arm"], row.get("daemon_class", row["class"]), row["variant"])]
        found[0] += statistics.fmean(per_token[row["item"]]) * float(row["tokens"])
        found[1] += charged_seconds(row)
        found[2] += 1
    return {k: (round(t / o, 3), int(n)) for k, (t, o, n) in sums.items() if o > 0}


def compare(
    policies: dict[str, dict[str, Any]], rows: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The classes the two daemons (``policies``: each one's ``policies.json``) served and
    chose differently in, and how each rated both choices. Pure."""
    tuner, challenger = (_leaves(policies[d]) for d in DAEMONS)
    served = _over_static([r for r in rows if usable(r)]) if rows else {}
    classes: list[dict[str, Any]] = []
    for key in sorted(set(tuner) & set(challenger)):
        found = {"tuner": tuner[key], "challenger": challenger[key]}
        chosen = {d: str(found[d]["policy"]["variant"]) for d in DAEMONS}
        if chosen["tuner"] == chosen["challenger"]:
            continue
        entry: dict[str, Any] = {"class": key, "chosen": chosen, "rates": {}, "prefers_own": {}}
        for daemon, other in zip(DAEMONS, reversed(DAEMONS), strict=True):
            own = _rating(found[daemon], chosen[daemon])
            theirs = _rating(found[daemon], chosen[other])
            entry["rates"][daemon] = {chosen[daemon]: own, chosen[other]: theirs}
            entry["prefers_own"][daemon] = (
                own[0] > theirs[0] if own is not None and theirs is not None else None
            )
            if (ratio := served.get((daemon, key, chosen[daemon]))) is not None:
                entry.setdefault("over_static", {})[daemon] = {
                    "ratio": ratio[0],
                    "requests": ratio[1],
                }
        entry["lock_in"] = all(entry["prefers_own"].values())
        classes.append(entry)
    return {
        "classes_both_served": len(set(tuner) & set(challenger)),
        "chose_differently": len(classes),
        "lock_in": sum(1 for c in classes if c["lock_in"]),
        "classes": classes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench run's directory (with both state dirs)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    policies: dict[str, dict[str, Any]] = {}
    for daemon in DAEMONS:
        path = args.run / f"{daemon}-state" / "policies.json"
        try:
            policies[daemon] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: {exc}")
        if not isinstance(policies[daemon], dict) or not isinstance(
            policies[daemon].get("classes"), dict
        ):
            parser.error(f"{path}: not a policies file (no 'classes' object)")
    rows = read_requests(parser, args.run) if (args.run / "requests.jsonl").exists() else None
    emit({"run": str(args.run), **compare(policies, rows)}, args.out)


if __name__ == "__main__":
    main()
