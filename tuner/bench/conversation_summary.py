"""A sessions bench's sums: per number of clients and arm, the history processed again, prefill
and decode apart, whole time, throughput and time to first token; the tuner against the
best static arm. Pure functions of the turns' rows (``tuner.bench.conversations`` makes
them)."""

from __future__ import annotations

import itertools
from typing import Any

from tuner.bench.schedule import TUNER

__all__ = ["looping", "messages_for", "summarise", "totals"]

LOOP_WINDOW = 24  # an answer whose last characters occur this many times over loops


def looping(text: str, window: int = LOOP_WINDOW, times: int = 3) -> bool:
    """Whether an answer repeats itself verbatim: its last ``window`` characters occur
    ``times`` times or more (a greedy loop)."""
    tail = text[-window:]
    return len(text) >= window * times and len(tail.strip()) > 4 and text.count(tail) >= times


def messages_for(session: dict[str, Any], turn: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": session["system"]}]
    for earlier in session["turns"][:turn]:
        out += [
            {"role": "user", "content": earlier["user"]},
            {"role": "assistant", "content": earlier["assistant"]},
        ]
    return [*out, {"role": "user", "content": session["turns"][turn]["user"]}]


def _p95(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None


def totals(mine: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One arm at one number of clients: prompt tokens processed again, prefill and decode
    seconds (the servers' own), the whole time, throughput and time to first token."""
    errors = sum("error" in r for r in mine)
    mine = [r for r in mine if "error" not in r]
    later = [r for r in mine if r["turn"] > 0]
    held = sum(r["cache_n"] + r["prompt_n"] for r in later)
    prefill = sum(r["prompt_ms"] for r in mine) / 1000
    decode = sum(r["predicted_ms"] for r in mine) / 1000
    tokens = sum(r["predicted_n"] for r in mine)
    ordered = sorted(mine, key=lambda r: (r["session"], r["turn"]))
    moves = sum(
        b["session"] == a["session"] and b["variant"] != a["variant"]
        for a, b in itertools.pairwise(ordered)
    )
    return {
        "turns": len(mine),
        "errors": errors,
        "reprocessed_share": round(sum(r["prompt_n"] for r in later) / held, 4) if held else None,
        "prefill_s": round(prefill, 2),
        "later_prefill_s": round(sum(r["prompt_ms"] for r in later) / 1000, 2),
        "decode_s": round(decode, 2),
        "total_s": round(prefill + decode, 2),
        "decode_tok_s": round(tokens / decode, 1) if decode else None,
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 2) if wall else None,
        "ttft_p95_s": _p95([r["ttft_s"] for r in mine]),
        "moves": moves,
    }


def summarise(
    rows: list[dict[str, Any]], walls: dict[tuple[str, int], float], arms: list[str]
) -> dict[str, Any]:
    """Per number of clients and arm (``totals``); the tuner against the best static arm:
    whole time at one client, throughput and p95 time to first token at more; over every
    turn, and at one client also over the turns no arm looped on."""
    out: dict[str, Any] = {}
    for clients in sorted({r["clients"] for r in rows}):
        level = [r for r in rows if r["clients"] == clients]
        loops = {(r["session"], r["turn"]) for r in level if r.get("looping")}
        sections: dict[str, set[tuple[str, int]]] = {"all": set()}
        if clients == 1 and loops:
            sections["no_loops"] = loops
        found: dict[str, Any] = {"looping_turns": sorted(f"{s}#{t}" for s, t in loops)}
        for label, skip in sections.items():
            per = {
                arm: totals(
                    [r for r in level if r["arm"] == arm and (r["session"], r["turn"]) not in skip],
                    walls[(arm, clients)],
                )
                for arm in arms
            }
            static = [a for a in arms if a != TUNER]
            best = min(static, key=lambda a: per[a]["total_s"])
            section: dict[str, Any] = {"arms": per, "best_static": best}
            if TUNER in per:
                mine = per[TUNER]
                section["tuner_vs_best_static_time"] = round(
                    per[best]["total_s"] / mine["total_s"], 3
                )
                top = max(static, key=lambda a: per[a]["throughput_tok_s"] or 0.0)
                section["best_static_throughput"] = top
                section["tuner_vs_best_static_throughput"] = round(
                    mine["throughput_tok_s"] / per[top]["throughput_tok_s"], 3
                )
                section["tuner_ttft_p95_vs_best_static"] = round(
                    mine["ttft_p95_s"] / per[top]["ttft_p95_s"], 3
                )
                plain = per.get("none", {}).get("reprocessed_share")
                if plain is not None and mine["reprocessed_share"] is not None:
                    extra = mine["reprocessed_share"] - plain
                    section["tuner_reprocessed_above_plain_pp"] = round(100 * extra, 2)
            found[label] = section
        sessions: dict[str, dict[str, Any]] = {}
        for r in level:
            if "error" in r:
                continue
            mine = sessions.setdefault(r["session"], {})
            mine[r["arm"]] = round(
                mine.get(r["arm"], 0.0) + (r["prompt_ms"] + r["predicted_ms"]) / 1000, 2
            )
            if r["arm"] == TUNER and r["turn"] == 0:
                mine["tuner_first_variant"] = r["variant"]
        found["sessions_total_s"] = sessions
        out[f"clients_{clients}"] = found
    return out
