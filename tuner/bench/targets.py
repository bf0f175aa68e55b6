"""The targets a bench run is judged by, and the exposure caution. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

TARGETS = {
    "tuner_vs_oracle_after_convergence": 0.97,
    "tuner_vs_best_static_whole_run": 1.0,
    "worst_class_after_convergence": 0.98,
    "requests_to_converge": 100,
}


def judge_targets(overall: Mapping[str, Any], classes: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the measured value and whether it is met."""
    out: dict[str, Any] = {}
    after, oracle_after = (
        overall.get("tuner_ratio_after_convergence"),
        overall.get("oracle_ratio_after_convergence"),
    )
    # the per-class oracle is the best static arm per class: with no static arms (``--matrix
    # none``) it is baseline, and a tuner "at 1.3x its oracle" is no finding
    if after is not None and oracle_after and overall.get("best_static"):
        value = round(after / oracle_after, 4)
        out["tuner_vs_oracle_after_convergence"] = target_entry(
            value, ">=", TARGETS["tuner_vs_oracle_after_convergence"]
        )
    if overall.get("tuner_vs_best_static") is not None:
        out["tuner_vs_best_static_whole_run"] = target_entry(
            overall["tuner_vs_best_static"], ">=", TARGETS["tuner_vs_best_static_whole_run"]
        )
    late = {k: c for k, c in classes.items() if c.get("tuner_ratio_after_convergence") is not None}
    if late:
        # the class, how many requests its figure rests on and their interval: a class of a
        # few requests reads +-10 % per request on a noisy machine (judged on the value alone)
        worst = min(late, key=lambda k: late[k]["tuner_ratio_after_convergence"])
        target = target_entry(
            late[worst]["tuner_ratio_after_convergence"],
            ">=",
            TARGETS["worst_class_after_convergence"],
        )
        target["class"] = worst
        target["requests"] = late[worst].get("tuner_requests_after_convergence")
        target["interval"] = late[worst].get("tuner_interval_after_convergence")
        out["worst_class_after_convergence"] = target
    counts = [c["converged_after"] for c in classes.values() if "converged_after" in c]
    if counts:
        unconverged = [k for k, c in classes.items() if c.get("converged") is False]
        target = target_entry(max(counts), "<=", TARGETS["requests_to_converge"])
        target["unconverged_classes"] = unconverged
        target["met"] = target["met"] and not unconverged
        out["requests_to_converge"] = target
    return out


def judge_challenger(overall: Mapping[str, Any], classes: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets judged on the challenger's figures (a second tuner is an engine
    the targets apply to as much as the first)."""
    view = {
        "tuner_ratio_after_convergence": overall.get("challenger_ratio_after_convergence"),
        "oracle_ratio_after_convergence": overall.get("challenger_oracle_ratio_after_convergence"),
        "tuner_vs_best_static": overall.get("challenger_vs_best_static"),
        "best_static": overall.get("best_static"),
    }
    names = {
        "tuner_ratio_after_convergence": "challenger_ratio_after_convergence",
        "tuner_requests_after_convergence": "challenger_requests_after_convergence",
        "tuner_interval_after_convergence": "challenger_interval_after_convergence",
        "converged_after": "challenger_converged_after",
        "converged": "challenger_converged",
    }
    per_class = {
        key: {ours: entry[theirs] for ours, theirs in names.items() if theirs in entry}
        for key, entry in classes.items()
    }
    return judge_targets(view, per_class)


def exposure_caution(
    ok: Sequence[Mapping[str, Any]],
    tuner: Sequence[Mapping[str, Any]],
    statics: Sequence[str],
    common: set[int],
) -> dict[str, float]:
    """How often the tuner, and each static arm, met each prompt. A variant whose table
    outlives a request (``ngram-mod``) drafts a prompt's earlier answers when it meets the
    prompt again, so where the tuner meets prompts more often, tuner / static ratios favour it
    (``--repeats`` gives the static arms the same exposure)."""
    arms = set(statics)
    static = sum(1 for r in ok if r["arm"] in arms and int(r["item"]) in common)
    return {
        "tuner": round(len(tuner) / max(len(common), 1), 1),
        "static_arm": round(static / max(len(statics) * len(common), 1), 1),
    }


def target_entry(value: float, op: str, threshold: float) -> dict[str, Any]:
    met = value >= threshold if op == ">=" else value <= threshold
    return {"value": value, "target": f"{op} {threshold}", "met": bool(met)}
