"""What the tuner believed each variant worth, against what time measured. Pure.

When a run ends, the daemon's policy file holds, per class, the speedup it prices each
variant at (``speedups``: from its served requests' and its replays' token counts, the
numbers every choice is made on). A static arm of the same variant measured the class's
prompts by time. ``beliefs`` sets the two side by side for every class and variant both
have: the pricing is right where ``predicted / measured`` is near 1.

The two are over nearly, not exactly, the same prompts (the tuner's stream meets some
prompts twice and others not at all), and a static arm's ratio over a dozen prompts is
itself uncertain by several percent: ``inside`` says whether the prediction falls in the
static arm's interval, and the aggregate weighs each class by its prompts.

``noise_floor``: how many pairs a predictor with no error at all would put within the
tolerance, given the run's own timing noise (one request's decode time varies by
``request_sd`` in log terms, measured on requests that did identical work): a class's
measured ratio over ``n`` prompts then varies by ``request_sd * sqrt(2 / n)`` (its arm's
and its baseline's requests), whatever the prediction.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TOLERANCE", "beliefs", "lock_in", "markdown_rows", "noise_floor"]

TOLERANCE = 0.03  # the pricing target: predicted within 3 % of time


def beliefs(
    classes: Mapping[str, Mapping[str, Any]],
    speedups: Mapping[str, Mapping[str, Sequence[float]]],
    min_prompts: int = 1,
    request_sd: float | None = None,
) -> dict[str, Any] | None:
    """The pricing check of a run: ``classes`` is the summary's per-class section (each
    with ``prompts`` and ``arms``: static arm -> ``ratio``, ``interval``), ``speedups`` the
    daemon's class -> variant -> ``[value, low, high]``. None when no pair exists.

    >>> found = beliefs({"code": {"prompts": 10, "arms": {"a": {"ratio": 1.5,
    ...     "interval": [1.4, 1.6]}}}}, {"code": {"a": [1.53, 1.45, 1.6]}})
    >>> found["rows"][0]["ratio"], found["rows"][0]["inside"], found["within_tolerance"]
    (1.02, True, 1)
    """
    rows: list[dict[str, Any]] = []
    for key, entry in sorted(classes.items()):
        priced = speedups.get(key) or {}
        if int(entry.get("prompts", 0)) < min_prompts:
            continue
        for variant, arm in sorted((entry.get("arms") or {}).items()):
            belief = priced.get(variant)
            measured = arm.get("ratio")
            if not belief or not measured or measured <= 0:
                continue
            low, high = arm.get("interval") or (measured, measured)
            rows.append(
                {
                    "class": key,
                    "variant": variant,
                    "prompts": int(entry["prompts"]),
                    "predicted": round(float(belief[0]), 4),
                    "measured": round(float(measured), 4),
                    "interval": [low, high],
                    "ratio": round(float(belief[0]) / measured, 4),
                    "inside": bool(low <= belief[0] <= high),
                }
            )
    if not rows:
        return None
    weights = [r["prompts"] for r in rows]
    # the mean |log(predicted / measured)|, each class weighed by its prompts
    error = sum(w * abs(math.log(r["ratio"])) for w, r in zip(weights, rows, strict=True))
    return {
        "pairs": len(rows),
        "within_tolerance": sum(abs(r["ratio"] - 1) <= TOLERANCE for r in rows),
        "inside_interval": sum(r["inside"] for r in rows),
        "mean_error": round(math.expm1(error / sum(weights)), 4),
        "median_ratio": round(statistics.median(r["ratio"] for r in rows), 4),
        "noise_floor": noise_floor(rows, request_sd) if request_sd else None,
        "rows": rows,
    }


def noise_floor(rows: Sequence[Mapping[str, Any]], request_sd: float) -> dict[str, Any]:
    """What timing noise alone allows: the pairs a predictor with no error would put within
    ``TOLERANCE`` (expected), and the chance it puts every pair there.

    >>> floor = noise_floor([{"prompts": 13}, {"prompts": 52}], 0.067)
    >>> floor["expected_within"], floor["all_within"]
    (1.7, 0.72)
    """
    normal = statistics.NormalDist()
    limit = math.log1p(TOLERANCE)
    chances = [
        2 * normal.cdf(limit / (request_sd * math.sqrt(2 / int(r["prompts"])))) - 1 for r in rows
    ]
    return {
        "request_sd": round(request_sd, 4),
        "expected_within": round(math.fsum(chances), 1),
        "all_within": round(math.prod(chances), 2),
    }


def lock_in(
    classes: Mapping[str, Mapping[str, Any]],
    speedups: Mapping[str, Mapping[str, Sequence[float]]],
    min_requests: int = 20,
) -> list[dict[str, Any]]:
    """Each class of more than ``min_requests`` tuner requests: the variant it held at the
    end, what its own evidence priced that at against its best-priced variant (``own_gap``),
    and what the static arms measured for it against the class's best arm (``static_gap``,
    where the held variant was one). A gap above ``1 + TOLERANCE`` is a near-tie the class
    did not resolve, or a loss it did not see.

    >>> k = {"tuner_requests": 30, "final_variant": "a", "oracle_ratio": 1.6,
    ...      "arms": {"a": {"ratio": 1.5}}}
    >>> held = lock_in({"k": k}, {"k": {"a": [1.5, 1, 2], "b": [1.6, 1, 2]}})[0]
    >>> held["best_priced"], held["own_gap"], held["static_gap"]
    ('b', 1.0667, 1.0667)
    """
    out: list[dict[str, Any]] = []
    for key, entry in sorted(classes.items()):
        held = entry.get("final_variant")
        priced = {v: float(s[0]) for v, s in (speedups.get(key) or {}).items()} | {"none": 1.0}
        if int(entry.get("tuner_requests", 0)) <= min_requests or held not in priced:
            continue
        best = max(priced, key=priced.__getitem__)
        arm = (entry.get("arms") or {}).get(held)
        static = float(arm["ratio"]) if arm else (1.0 if held == "none" else None)
        oracle = entry.get("oracle_ratio")
        out.append(
            {
                "class": key,
                "requests": int(entry["tuner_requests"]),
                "held": held,
                "held_priced": round(priced[held], 4),
                "best_priced": best,
                "own_gap": round(priced[best] / priced[held], 4),
                "static_gap": round(float(oracle) / static, 4) if static and oracle else None,
            }
        )
    return out


def _floor_line(floor: Mapping[str, Any] | None) -> str:
    if not floor:
        return ""
    return (
        f" Timing noise alone (one request's decode time varies by {floor['request_sd']:.1%}) "
        f"would leave a predictor with no error within {TOLERANCE:.0%} in about "
        f"{floor['expected_within']:g} pairs, and within it in all of them with chance "
        f"{floor['all_within']:.2f}."
    )


def markdown_rows(found: Mapping[str, Any]) -> list[str]:
    """The check as a markdown section."""
    lines = [
        "## Pricing: what the tuner believed, against time",
        "",
        f"{found['pairs']} class and variant pairs; predicted within {TOLERANCE:.0%} of the "
        f"static arm's time in {found['within_tolerance']}, inside its interval in "
        f"{found['inside_interval']}; mean error {found['mean_error']:.1%} (weighed by "
        f"prompts), median predicted / measured {found['median_ratio']:.3f}."
        + _floor_line(found.get("noise_floor")),
        "",
        "| class | variant | prompts | predicted | measured (90 %) | predicted / measured |",
        "|---|---|---|---|---|---|",
    ]
    for r in found["rows"]:
        low, high = r["interval"]
        lines.append(
            f"| {r['class']} | {r['variant']} | {r['prompts']} | {r['predicted']:.3f}x | "
            f"{r['measured']:.3f}x [{low:.2f}, {high:.2f}] | {r['ratio']:.3f} |"
        )
    held = found.get("lock_in") or []
    if held:
        lines += [
            "",
            f"What each class of more than 20 requests held at the end, against the best its "
            f"own evidence priced and the best static arm (a gap above {1 + TOLERANCE:.2f} "
            f"is lock-in):",
            "",
            "| class | requests | held | priced | best priced | own gap | static gap |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in held:
            gap = f"{r['static_gap']:.3f}" if r["static_gap"] is not None else "-"
            lines.append(
                f"| {r['class']} | {r['requests']} | {r['held']} | {r['held_priced']:.3f}x | "
                f"{r['best_priced']} | {r['own_gap']:.3f} | {gap} |"
            )
    return lines
