"""How much a bench run's tuner gained from seeing the same prompts again.

``ngram-mod`` keeps one hash table per server instance across requests: once an instance has
answered a prompt, the next request of the same prompt finds the old answer's n-grams and
drafts it. In ``tuner bench`` the tuner replays a small workload many times (520 requests over
41 prompts: each prompt ~13 times) while each static arm measures each prompt ``repeats``
times (default once), so the tuner's ngram-mod variants meet warm tables the static arms
never get, and tuner / static ratios favour the tuner.

Reads ``DIR/requests.jsonl`` and prints accepted tokens per generated token on each item's
first request and, paired by item, on its 4th and later, for the tuner's requests served by
each variant family (``tuner ngram-mod`` ...) and for each static arm (with ``--repeats`` a
static arm meets its prompts again too). ``ngram-simple`` drafts from the request's own
text only: it is the control, and should not rise.

    python -m benchmarks.repeat_memory DIR [--out FILE.json]
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from benchmarks.common import run_main

LATER = 3  # an item's requests from the 4th on count as "later"


def _accepted_per_token(row: dict[str, Any]) -> float:
    return float(row.get("accepted") or 0) / max(float(row["tokens"]), 1.0)


def _first_and_later(items: dict[int, list[float]]) -> dict[str, Any]:
    """Mean accepted/token on each item's first request; and, on the items with more than
    ``LATER`` requests, their first against the mean of their later ones (paired)."""
    entry: dict[str, Any] = {
        "items": len(items),
        "requests_per_item": round(statistics.mean(len(a) for a in items.values()), 1),
        "first": round(statistics.mean(a[0] for a in items.values()), 3),
    }
    paired = [a for a in items.values() if len(a) > LATER]
    if paired:
        first = [a[0] for a in paired]
        later = [statistics.mean(a[LATER:]) for a in paired]
        entry["paired_items"] = len(paired)
        entry["paired_first"] = round(statistics.mean(first), 3)
        entry["paired_later"] = round(statistics.mean(later), 3)
        entry["paired_later_higher"] = sum(b > a for a, b in zip(first, later, strict=True))
    return entry


def repeat_effect(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``tuner <family>`` (its requests served by any variant of the family; the same for a
    ``challenger``) and each static arm: accepted tokens per generated token on items' first
    and later requests."""
    groups: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row.get("error") or float(row.get("ms") or 0) <= 0:
            continue
        variant = str(row.get("variant") or "none")
        if variant == "none":
            continue
        daemon = row["arm"] in ("tuner", "challenger")
        name = f"{row['arm']} {variant.split('.')[0]}" if daemon else row["arm"]
        groups[name][int(row["item"])].append(_accepted_per_token(row))
    return {name: _first_and_later(items) for name, items in sorted(groups.items())}


def main() -> None:
    run_main(__doc__, lambda rows: {"accepted_per_token": repeat_effect(rows)})


if __name__ == "__main__":
    main()
