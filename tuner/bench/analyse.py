"""From a bench run's requests to its summary: ratios to baseline, oracles, convergence. Pure.

Throughput is decode tokens per second (llama-server's ``predicted_n / predicted_ms``;
prompt processing is the same for every arm). A ratio compares an arm with no
speculation *over the same prompts*: for a multiset of prompt occurrences ``S``,
``tok/s(arm, S) = sum(tokens) / sum(seconds)`` over ``S``, and the ratio is that over
the baseline's. Static arms measured an item ``repeats`` times count with their mean
per item; the tuner counts each of its own requests. Classes are the daemon's class
keys.

- after convergence, the oracle is priced on the same occurrences: the tuner's k-th
  request of an item against the oracle arm's k-th measurement of it (its mean past
  those). With repeated prompts an n-gram table that has seen an item's answer drafts it
  the next time, so every arm's later requests of an item run faster than its first;
  the tuner's late requests against the oracle's mean over all of them would flatter it.

- ``oracle``: per class, the static arm with the best ratio on that class; the
  overall oracle serves every class with its own best arm.
- ``per_prompt_oracle``: every prompt served by its best static arm (an upper bound
  no class-level policy can reach).
- ``best_static``: the one static arm with the best overall ratio.
- convergence: a class has converged once the tuner serves it (``exploit`` and
  ``pinned`` requests) with its final variant, and that final policy is settled (it
  rests on measured evidence, a kill-switch verdict, or a finished search; "off, no
  evidence yet" is not settled); ``converged_after`` counts the class's requests up to
  the last exploit request with another variant (0: never another).
- intervals: 90 % percentile bootstrap over prompt occurrences (tuner: its requests).
- ``tuner_vs_best_static_by_counts``: the whole-run ratio with every request (the
  daemon's and the static arm's) priced by its counts at its prompt's plain decode speed:
  on the variant both served, what each drafted and accepted without how fast the
  daemon's instances ran (see ``vs_static_by_counts``).
- ``same_work``: a daemon's requests that did exactly what a static arm's request of the
  same prompt did (same variant, tokens, drafted and accepted tokens), and their decode
  time over that request's. The work is identical, so this is the serving path alone:
  the daemon's own llama-server instances and whatever ran beside them, against the
  matrix's. The whole-run ratios carry that factor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.bench.compare import (
    engine_figures,
    peer_summary,
    same_work,
    side_by_side,
    vs_static_by_counts,
)
from tuner.bench.rows import (
    BASELINE_ARM,
    Measured,
    arm_entry,
    arm_ratio,
    bootstrap_interval,
    is_peer,
    item_runs,
    means_of,
    occurrence_of,
    static_class,
    succeeded,
    tok_s_of,
)
from tuner.bench.schedule import CHALLENGER, TUNER
from tuner.bench.targets import exposure_caution, judge_challenger, judge_targets

__all__ = ["SCHEMA", "FinalPolicy", "summarize"]

SCHEMA = "spec-tuner/bench/1"
SERVING_ROLES = ("exploit", "pinned")


@dataclass(frozen=True, slots=True)
class FinalPolicy:
    """The policy serving a class when the run ended."""

    variant: str
    settled: bool = True  # rests on evidence or a verdict, not on "no evidence yet"
    reason: str = ""


def _convergence(served: Sequence[tuple[str, str]], finals: Sequence[str | None]) -> int:
    """Class requests up to the last serving request with a variant other than the final
    one of the daemon class it was served in."""
    last = 0
    for index, ((role, variant), final) in enumerate(zip(served, finals, strict=True), 1):
        if role in SERVING_ROLES and final is not None and variant != final:
            last = index
    return last


def _leaf_policies(
    rows: Sequence[Mapping[str, Any]],
    final_policies: Mapping[str, FinalPolicy] | None,
    key: str,
) -> tuple[list[str], dict[str, FinalPolicy | None]]:
    """Each row's daemon class (``daemon_class``, else the bench's ``key``) and each daemon
    class's policy when the run ended: a daemon whose classes are finer than the bench's
    (``[split] form``) serves one bench class from several classes, each converging to its
    own. Without a final policy, a class's is the variant of its last serving request."""
    leaves = [str(r.get("daemon_class") or key) for r in rows]
    out: dict[str, FinalPolicy | None] = {}
    for leaf in dict.fromkeys(leaves):
        policy = (final_policies or {}).get(leaf)
        if policy is None:
            mine = [r for r, at in zip(rows, leaves, strict=True) if at == leaf]
            last = next(
                (str(r.get("variant")) for r in reversed(mine) if r.get("role") in SERVING_ROLES),
                None,
            )
            policy = FinalPolicy(last) if last is not None else None
        out[leaf] = policy
    return leaves, out


def _joined(key: str, values: Mapping[str, str | None]) -> str | None:
    """One value, or each daemon class's (by the part of its key past the bench's)."""
    distinct = set(values.values())
    if len(distinct) <= 1:
        return next(iter(distinct), None)
    return "; ".join(
        f"{leaf.removeprefix(key + '/') or leaf}: {value}" for leaf, value in sorted(values.items())
    )


def summarize(
    rows: Sequence[Mapping[str, Any]],
    item_classes: Sequence[str],
    *,
    final_policies: Mapping[str, FinalPolicy] | None = None,
    challenger_policies: Mapping[str, FinalPolicy] | None = None,
    meta: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The summary document (schema ``spec-tuner/bench/1``) of a run's request rows.

    ``rows``: one mapping per request (``arm``, ``item``, ``tokens``, ``ms``, ``drafted``,
    ``accepted``; tuner rows also ``variant``, ``role`` and ``class``; failed requests an
    ``error``). ``item_classes``: the class key of each workload item.
    ``final_policies``: class key -> the policy serving it when the run ended (without
    it, the variant of the class's last exploit request, taken as settled);
    ``challenger_policies`` the same for the challenger (a second tuner, rows with arm
    ``challenger``), whose figures carry the ``challenger_`` prefix.
    """
    rng = np.random.default_rng(seed)
    ok = succeeded(rows)
    tuner = [r for r in ok if r["arm"] == TUNER]
    challenger = [r for r in ok if r["arm"] == CHALLENGER]
    runs = item_runs([r for r in ok if r["arm"] not in (TUNER, CHALLENGER)])
    means = means_of(runs)
    statics = sorted(a for a in means if a != BASELINE_ARM and not is_peer(a))
    peers = sorted(a for a in means if is_peer(a))
    # the prompts every static and peer arm measured: ratios are only taken over those
    common = set(means[BASELINE_ARM]).intersection(*(means[a] for a in [*statics, *peers]))
    tuner = [r for r in tuner if int(r["item"]) in common]
    challenger = [r for r in challenger if int(r["item"]) in common]
    # the occurrences the ratios are taken over: the tuner's stream, else each item once
    occurrences = [int(r["item"]) for r in tuner] if tuner else sorted(common)
    by_class: dict[str, list[int]] = defaultdict(list)
    for item in occurrences:
        by_class[item_classes[item]].append(item)
    tuner_by_class: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in tuner:
        tuner_by_class[item_classes[int(row["item"])]].append(row)
    occurrence = occurrence_of([*tuner, *challenger])

    def static(arm: str, items: Sequence[int]) -> list[Measured]:
        return [means[arm][i] for i in items]

    classes: dict[str, Any] = {}
    oracle_parts: list[Measured] = []
    for key in sorted(by_class):
        items = by_class[key]
        entry = static_class(items, means, statics, rng)
        oracle_parts += static(entry["oracle"], items)
        if tuner:
            found = _tuner_class(tuner_by_class[key], means, final_policies, key, rng)
            entry.update(found)
            late_rows = tuner_by_class[key][found["converged_after"] :]
            if late_rows:
                oracle_late = _oracle_late(late_rows, entry["oracle"], runs, means, occurrence)
                base_late = [means[BASELINE_ARM][int(r["item"])] for r in late_rows]
                entry["oracle_ratio_after_convergence"] = round(
                    arm_ratio(oracle_late, base_late), 4
                )
                entry["tuner_vs_oracle_after_convergence"] = round(
                    found["tuner_ratio_after_convergence"]
                    / entry["oracle_ratio_after_convergence"],
                    4,
                )
        classes[key] = entry

    base_all = static(BASELINE_ARM, occurrences)
    overall_arms = {arm: arm_entry(static(arm, occurrences), base_all, rng) for arm in statics}
    best_static = max(statics, key=lambda a: overall_arms[a]["ratio"]) if statics else None
    per_prompt = [
        max((means[a][i] for a in [BASELINE_ARM, *statics]), key=lambda m: m.tokens / m.seconds)
        for i in occurrences
    ]
    overall: dict[str, Any] = {
        "engine": (meta or {}).get("engine", "llama.cpp"),
        "prompts": len(set(occurrences)),
        "occurrences": len(occurrences),
        "baseline_tok_s": round(tok_s_of(base_all), 2),
        "arms": overall_arms,
        "oracle_ratio": round(arm_ratio(oracle_parts, base_all), 4),
        "per_prompt_oracle_ratio": round(arm_ratio(per_prompt, base_all), 4),
        "best_static": best_static,
        "best_static_ratio": overall_arms[best_static]["ratio"] if best_static else None,
    }
    if peers:
        overall["peers"], per_class = peer_summary(means, peers, occurrences, by_class, rng)
        classes = {key: {**entry, "peers": per_class[key]} for key, entry in classes.items()}
    if tuner:
        overall.update(_tuner_overall(tuner, means, runs, occurrence, classes, item_classes, rng))
        if best_static:
            overall["tuner_vs_best_static"] = round(
                overall["tuner_ratio"] / overall_arms[best_static]["ratio"], 4
            )
            overall["tuner_vs_best_static_by_counts"] = vs_static_by_counts(
                tuner, means, best_static
            )
        overall["tuner_vs_oracle"] = round(overall["tuner_ratio"] / overall["oracle_ratio"], 4)
        overall["requests_per_prompt"] = exposure_caution(ok, tuner, statics, common)
        overall["tuner_same_work"] = same_work(ok, TUNER)
    if challenger:
        overall.update(
            challenger_summary(
                challenger,
                tuner,
                means,
                runs,
                occurrence,
                classes,
                item_classes,
                challenger_policies,
                rng,
            )
        )
        overall["challenger_same_work"] = same_work(ok, CHALLENGER)
        if best_static:
            overall["challenger_vs_best_static"] = round(
                overall["challenger_ratio"] / overall_arms[best_static]["ratio"], 4
            )
            overall["challenger_vs_best_static_by_counts"] = vs_static_by_counts(
                challenger, means, best_static
            )
    overall.update(engine_figures(overall))
    return {
        "schema": SCHEMA,
        **dict(meta or {}),
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "static_arms": [BASELINE_ARM, *statics],
        "overall": overall,
        "classes": classes,
        "targets": judge_targets(overall, classes) if tuner else None,
        "challenger_targets": judge_challenger(overall, classes) if challenger else None,
    }


CHALLENGER_KEYS = ("final_variant", "final_reason", "converged_after", "converged")


def as_challenger(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A tuner's figures under the challenger's names (``tuner_x`` -> ``challenger_x``)."""
    out = {}
    for name, value in entry.items():
        if name.startswith("tuner_"):
            out["challenger_" + name.removeprefix("tuner_")] = value
        elif name in CHALLENGER_KEYS:
            out["challenger_" + name] = value
    return out


def challenger_summary(
    rows: Sequence[Mapping[str, Any]],
    tuner: Sequence[Mapping[str, Any]],
    means: Mapping[str, Mapping[int, Measured]],
    runs: Mapping[str, Mapping[int, Sequence[Measured]]],
    occurrence: Mapping[int, int],
    classes: dict[str, Any],
    item_classes: Sequence[str],
    policies: Mapping[str, FinalPolicy] | None,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The challenger's figures: per class (added to ``classes``) and overall (returned),
    computed as the tuner's are, plus its ratio to the tuner side by side."""
    by_class: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_class[item_classes[int(row["item"])]].append(row)
    points = {}
    for key, entry in classes.items():
        found = _tuner_class(by_class[key], means, policies, key, rng)
        entry.update(as_challenger(found))
        points[key] = {"converged_after": found["converged_after"], "oracle": entry["oracle"]}
    found = _tuner_overall(rows, means, runs, occurrence, points, item_classes, rng)
    out = as_challenger(found)
    out["challenger_oracle_ratio_after_convergence"] = found["oracle_ratio_after_convergence"]
    if tuner:
        out.update(side_by_side(tuner, rows, means[BASELINE_ARM], rng))
    return out


def _oracle_late(
    rows: Iterable[Mapping[str, Any]],
    oracle: str,
    runs: Mapping[str, Mapping[int, Sequence[Measured]]],
    means: Mapping[str, Mapping[int, Measured]],
    occurrence: Mapping[int, int],
) -> list[Measured]:
    """The oracle arm on the same occurrences as these daemon rows: its k-th measurement
    of the item for the daemon's k-th request of it, its mean past its own count."""
    out = []
    for row in rows:
        item, k = int(row["item"]), occurrence[id(row)]
        same = runs.get(oracle, {}).get(item, ())
        out.append(same[k] if k < len(same) else means[oracle][item])
    return out


def _tuner_class(
    rows: Sequence[Mapping[str, Any]],
    means: Mapping[str, Mapping[int, Measured]],
    final_policies: Mapping[str, FinalPolicy] | None,
    key: str,
    rng: np.random.Generator,
) -> dict[str, Any]:
    served = [(str(r.get("role")), str(r.get("variant"))) for r in rows]
    leaves, policies = _leaf_policies(rows, final_policies, key)
    finals = {leaf: p.variant if p else None for leaf, p in policies.items()}
    after = _convergence(served, [finals[leaf] for leaf in leaves])
    settled = bool(policies) and all(p is not None and p.settled for p in policies.values())
    measured = [Measured.of(r) for r in rows]
    base = [means[BASELINE_ARM][int(r["item"])] for r in rows]
    late, late_base = measured[after:], base[after:]
    exploit = [i for i in range(after, len(rows)) if served[i][0] in SERVING_ROLES]
    roles: dict[str, int] = defaultdict(int)
    for role, _ in served:
        roles[role] += 1
    late_ratio = round(arm_ratio(late, late_base), 4) if late else None
    late_interval = bootstrap_interval(late, late_base, rng)
    entry = arm_entry(measured, base, rng)
    return {
        "tuner_requests": len(rows),
        "tuner_roles": dict(sorted(roles.items())),
        "tuner_ratio": entry["ratio"] if rows else None,
        "tuner_interval": entry["interval"] if rows else None,
        "final_variant": _joined(key, finals),
        "final_reason": _joined(key, {k: p.reason if p else None for k, p in policies.items()}),
        "converged_after": after,
        "converged": bool(rows) and after < len(rows) and settled,
        "tuner_ratio_after_convergence": late_ratio,
        "tuner_interval_after_convergence": list(late_interval) if late_interval else None,
        "tuner_requests_after_convergence": len(late),
        "tuner_exploit_ratio_after_convergence": round(
            arm_ratio([measured[i] for i in exploit], [base[i] for i in exploit]), 4
        )
        if exploit
        else None,
    }


def _tuner_overall(
    rows: Sequence[Mapping[str, Any]],
    means: Mapping[str, Mapping[int, Measured]],
    runs: Mapping[str, Mapping[int, Sequence[Measured]]],
    occurrence: Mapping[int, int],
    classes: Mapping[str, Any],
    item_classes: Sequence[str],
    rng: np.random.Generator,
) -> dict[str, Any]:
    measured = [Measured.of(r) for r in rows]
    base = [means[BASELINE_ARM][int(r["item"])] for r in rows]
    entry = arm_entry(measured, base, rng)
    # after convergence: each class's requests after its own convergence point
    late: list[Measured] = []
    late_base: list[Measured] = []
    oracle_late: list[Measured] = []
    seen: dict[str, int] = defaultdict(int)
    for row, m, b in zip(rows, measured, base, strict=True):
        key = item_classes[int(row["item"])]
        seen[key] += 1
        cls = classes.get(key)
        if cls is not None and seen[key] > cls["converged_after"]:
            late.append(m)
            late_base.append(b)
            oracle_late += _oracle_late([row], cls["oracle"], runs, means, occurrence)
    return {
        "tuner_requests": len(rows),
        "tuner_ratio": entry["ratio"],
        "tuner_interval": entry["interval"],
        "tuner_alpha": entry["alpha"],
        "tuner_ratio_after_convergence": round(arm_ratio(late, late_base), 4) if late else None,
        "oracle_ratio_after_convergence": round(arm_ratio(oracle_late, late_base), 4)
        if late
        else None,
    }
