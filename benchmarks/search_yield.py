"""Which variants of the search space earn their trials, over many bench runs.

A trial serves a variant to a few requests of a class to measure it; it pays for itself only
if the class then keeps a variant the trial found, or if the trial ran about as fast as the
best static arm anyway. For every variant (and every spec type) the daemons of the given
runs served, summed over the runs: its trial requests and their mean speed over the best
static arm on the same prompts (as ``benchmarks.exploration_cost`` prices them; runs
without a static arm count but are not priced), its exploit requests, and in how many of
the runs' classes it was the variant served last (``final``: what a class ended on). A
spec type whose trials run well below the static arm and that no class keeps is a cost
with nothing bought: a candidate to leave out of the default search space.

    python -m benchmarks.search_yield benchmarks/results/bench/gemma-* [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.common import emit, read_requests, usable
from benchmarks.exploration_cost import DAEMONS, price


def _blank() -> dict[str, Any]:
    return {"trial_requests": 0, "trial_speeds": [], "exploit_requests": 0, "final": 0}


def tally(runs: Iterable[list[dict[str, Any]]]) -> dict[str, Any]:
    """Per variant and per spec type, over the runs' daemon requests: trial and exploit
    requests, the trials' mean speed over the best static arm (``None``: no priced trial)
    and ``final``, the (run, daemon, class) triples whose last exploit request it served."""
    variants: dict[str, dict[str, Any]] = defaultdict(_blank)
    count = 0
    for rows in runs:
        count += 1
        _, priced = price(rows)
        for arm in priced.values():
            for row, speed, static in arm:
                if row.get("role") == "trial":
                    variants[str(row["variant"])]["trial_speeds"].append(speed / static)
        last: dict[tuple[str, str], str] = {}
        for row in rows:
            if row["arm"] not in DAEMONS or not usable(row):
                continue
            name = str(row["variant"])
            if row.get("role") == "trial":
                variants[name]["trial_requests"] += 1
            elif row.get("role", "exploit") == "exploit":
                variants[name]["exploit_requests"] += 1
                last[(row["arm"], str(row["class"]))] = name
        for name in last.values():
            variants[name]["final"] += 1
    types: dict[str, dict[str, Any]] = defaultdict(_blank)
    for name, found in variants.items():
        into = types[name.split(".")[0]]
        for key in ("trial_requests", "exploit_requests", "final"):
            into[key] += found[key]
        into["trial_speeds"] += found["trial_speeds"]
    return {
        "runs": count,
        "spec_types": {t: _finish(found) for t, found in sorted(types.items())},
        "variants": {v: _finish(found) for v, found in sorted(variants.items())},
    }


def _finish(found: dict[str, Any]) -> dict[str, Any]:
    speeds = found.pop("trial_speeds")
    found["trials_priced"] = len(speeds)
    found["trial_speed_over_static"] = round(statistics.fmean(speeds), 3) if speeds else None
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="bench run directories")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    dirs = [d for d in args.runs if (d / "requests.jsonl").is_file()]
    if not dirs:
        parser.error("none of these directories has a requests.jsonl")
    found = tally(read_requests(parser, d) for d in dirs)
    emit({"run_dirs": [str(d) for d in dirs], **found}, args.out)


if __name__ == "__main__":
    main()
