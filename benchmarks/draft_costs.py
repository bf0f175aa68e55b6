"""Where an arm's speed comes from: what each arm of a `tuner bench` run drafted, accepted and
paid per drafted token, in plain decode steps of its own binary's run without speculation.

Per arm over the prompts it shares with its baseline (``none``; ``peer:none`` for a peer
arm): ``accepted`` and ``drafted`` per generated token, ``cost`` (what one drafted token
cost, ``(steps - tokens + accepted) / drafted``) and ``steps`` per token (``1 /`` the
arm's speedup). ``steps = 1 - accepted + cost * drafted``, so two arms' gap splits into
what they drafted and accepted (the drafter and its settings) and what a drafted token cost
(the binary and the round's shape)::

    python -m benchmarks.draft_costs RUN_DIR [--out FILE.json]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.common import run_main, usable
from tuner.bench.rows import BASELINE_ARM, PEER_BASELINE, is_peer


def baseline_of(arm: str) -> str:
    return PEER_BASELINE if is_peer(arm) else BASELINE_ARM


def draft_costs(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each speculative arm's counts per token and cost per drafted token (see the module)."""
    base: dict[str, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for row in rows:
        if row["arm"] in (BASELINE_ARM, PEER_BASELINE) and usable(dict(row)):
            base[row["arm"]].setdefault(int(row["item"]), row)
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for row in rows:
        plain = base[baseline_of(str(row["arm"]))].get(int(row["item"]))
        if row["arm"] in (BASELINE_ARM, PEER_BASELINE) or plain is None or not usable(dict(row)):
            continue
        step_ms = float(plain["ms"]) / float(plain["tokens"])
        total = sums[str(row["arm"])]
        for i, value in enumerate(
            (row["tokens"], row["drafted"], row["accepted"], float(row["ms"]) / step_ms)
        ):
            total[i] += float(value)
    out: dict[str, Any] = {}
    for arm, (tokens, drafted, accepted, steps) in sorted(sums.items()):
        out[arm] = {
            "tokens": int(tokens),
            "drafted_per_token": round(drafted / tokens, 4),
            "accepted_per_token": round(accepted / tokens, 4),
            "cost": round((steps - tokens + accepted) / drafted, 4) if drafted else None,
            "steps_per_token": round(steps / tokens, 4),
        }
    return {"arms": out}


if __name__ == "__main__":
    run_main(__doc__, draft_costs)
