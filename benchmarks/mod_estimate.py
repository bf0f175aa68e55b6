"""How far the daemon's simulated ``ngram-mod`` counts were from what the variant served.

Reads a daemon's saved engine state (``policies.json`` in its state dir, e.g. a bench run's
``DIR/tuner-state``) and prints, per leaf class and ``ngram-mod`` variant, accepted and
drafted tokens per generated token: on the requests the variant served (the server's
counts) and on the requests it did not serve (its simulation's counts, ``Arm.shadow``).
The two are different requests of the same class (its prompts), so they compare the
estimate with the truth on the same traffic, not request by request.

    python -m benchmarks.mod_estimate /path/to/tuner-state [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import emit


def _rates(counts: list[tuple[int, int, int]]) -> dict[str, Any]:
    """(tokens, drafted, accepted) rows -> requests and per-token rates."""
    tokens = sum(c[0] for c in counts)
    return {
        "requests": len(counts),
        "accepted_per_token": round(sum(c[2] for c in counts) / tokens, 3) if tokens else None,
        "drafted_per_token": round(sum(c[1] for c in counts) / tokens, 3) if tokens else None,
    }


def estimates(state: dict[str, Any], min_served: int = 2) -> dict[str, dict[str, Any]]:
    """``class/variant`` -> served and simulated rates, for arms with both."""
    out: dict[str, dict[str, Any]] = {}
    for key, cls in sorted(state["classes"].items()):
        if key.count("/") != 2:
            continue
        for name, arm in sorted(cls.get("arms", {}).items()):
            if not name.startswith("ngram-mod"):
                continue
            # served: ``recent`` rows are (drafted, accepted, tokens, loaded); tokens 0: unknown
            served = [(r[2], r[0], r[1]) for r in arm.get("recent", []) if r[2] > 0]
            simulated = [(c[0], c[1], c[2]) for c in arm.get("shadow", [])]
            if len(served) >= min_served and simulated:
                out[f"{key} {name}"] = {"served": _rates(served), "simulated": _rates(simulated)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("state", type=Path, help="a daemon state dir (with policies.json)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    found = estimates(json.loads((args.state / "policies.json").read_text()))
    for key, row in found.items():
        s, m = row["served"], row["simulated"]
        print(
            f"{key:50s} served {s['requests']:3d} acc/tok {s['accepted_per_token']}"
            f" | simulated {m['requests']:3d} acc/tok {m['accepted_per_token']}"
        )
    emit(found, args.out, quiet=True)


if __name__ == "__main__":
    main()
