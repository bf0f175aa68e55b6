"""Comparing a bench run's daemons: the challenger against the tuner pair by pair, each
against the best static arm by counts, and the serving path on identical work. Pure.

- ``tuner_vs_best_static_by_counts``: the whole-run ratio with every request (the daemon's
  and the static arm's) priced by its counts at its prompt's plain decode speed: on the
  variant both served, what each drafted and accepted without how fast the daemon's
  instances ran.
- ``peers``: each peer arm over the peer's own run without speculation, on the same
  prompt occurrences as the static arms.
- ``same_work``: a daemon's requests that did exactly what a static arm's request of the
  same prompt did (same variant, tokens, drafted and accepted tokens), and their decode
  time over that request's: the serving path alone.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tuner.bench.rows import (
    AUTOTUNE_PREFIX,
    BASELINE_ARM,
    PEER_BASELINE,
    Measured,
    arm_entry,
    arm_ratio,
    bootstrap_interval,
    charged_seconds,
    succeeded,
    tok_s_of,
)
from tuner.bench.schedule import CHALLENGER, TUNER
from tuner.stats import Z90, mean_interval


def side_by_side(
    tuner: Sequence[Mapping[str, Any]],
    challenger: Sequence[Mapping[str, Any]],
    base: Mapping[int, Measured],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The challenger over the tuner on the requests both answered (the same item at the same
    place in the stream, sent back to back), with a 90 % interval resampling those pairs; and
    the same priced by the requests' counts (``priced_by_counts``), without the timing noise."""
    theirs = {int(r["repeat"]): r for r in challenger}
    pairs = [(r, theirs[int(r["repeat"])]) for r in tuner if int(r["repeat"]) in theirs]
    pairs = [(a, b) for a, b in pairs if a["item"] == b["item"]]
    ours = [Measured.of(a) for a, _ in pairs]
    other = [Measured.of(b) for _, b in pairs]
    interval = bootstrap_interval(other, ours, rng)
    # both daemons' requests priced together: one drafted-token cost per variant
    items = [base[int(a["item"])] for a, _ in pairs]
    variants = [str(r.get("variant")) for side in (0, 1) for r in (p[side] for p in pairs)]
    priced = priced_by_counts([*ours, *other], items * 2, variants)
    ours_c, other_c = priced[: len(pairs)], priced[len(pairs) :]
    counts_interval = bootstrap_interval(other_c, ours_c, rng)
    return {
        "side_by_side_pairs": len(pairs),
        "challenger_vs_tuner": round(arm_ratio(other, ours), 4) if pairs else None,
        "challenger_vs_tuner_interval": list(interval) if interval else None,
        "challenger_vs_tuner_by_counts": round(arm_ratio(other_c, ours_c), 4) if pairs else None,
        "challenger_vs_tuner_by_counts_interval": list(counts_interval)
        if counts_interval
        else None,
    }


def vs_static_by_counts(
    daemon: Sequence[Mapping[str, Any]], means: Mapping[str, Mapping[int, Measured]], arm: str
) -> float | None:
    """A daemon's requests against a static arm's on the same prompts, both priced by their
    counts (``priced_by_counts``, one drafted-token cost per variant fitted on both): the whole-run
    ratio with each request's decode time replaced by what it drafted and accepted at its
    prompt's plain decode speed (the no-speculation arm's). On the variant both served the
    two are priced alike, so how fast the daemon's own llama-server instances ran against
    the matrix's (``same_work``, ``plain_quarters`` in ``benchmarks.exploration_cost``)
    drops out and what each drafted and accepted stays; a variant only the daemon served
    is priced at a cost fitted on its own requests, which still carries its instances'
    speed, averaged over the run. None without requests."""
    if not daemon:
        return None
    items = [int(r["item"]) for r in daemon]
    ours = [Measured.of(r) for r in daemon]
    static = [means[arm][i] for i in items]
    base = [means[BASELINE_ARM][i] for i in items]
    variants = [str(r.get("variant")) for r in daemon] + [arm] * len(items)
    priced = priced_by_counts([*ours, *static], base * 2, variants)
    return round(arm_ratio(priced[: len(ours)], priced[len(ours) :]), 4)


SHRINK_DRAFTED = 256.0  # drafted tokens of the pooled cost a variant's own cost is shrunk by


def priced_by_counts(
    measured: Sequence[Measured], base: Sequence[Measured], variants: Sequence[str]
) -> list[Measured]:
    """The requests with their decode time replaced by what their counts cost at their
    prompt's plain decode speed (``base``, the same prompt without speculation):
    ``(n - a + c d)`` steps of ``base.seconds / base.tokens``, ``c`` a variant's drafted-token
    cost fitted on these requests (its decode time in plain steps, less ``n - a``, over its
    drafted tokens; shrunk toward all variants' pooled cost by ``SHRINK_DRAFTED`` tokens).
    Given both daemons' requests, one ``c`` per variant prices both, so what differs between
    two requests of a pair is what was drafted and accepted, not the minutes they ran in."""
    extra: dict[str, float] = defaultdict(float)
    drafted: dict[str, float] = defaultdict(float)
    step = [b.seconds / b.tokens if b.tokens > 0 else 0.0 for b in base]
    for m, s, v in zip(measured, step, variants, strict=True):
        if m.drafted > 0 and s > 0:
            extra[v] += m.seconds / s - (m.tokens - m.accepted)
            drafted[v] += m.drafted
    total = sum(drafted.values())
    pooled = max(0.0, sum(extra.values()) / total) if total else 0.0
    cost = {
        v: max(0.0, (extra[v] + SHRINK_DRAFTED * pooled) / (drafted[v] + SHRINK_DRAFTED))
        for v in drafted
    }
    out = []
    for m, s, v in zip(measured, step, variants, strict=True):
        steps = m.tokens - m.accepted + cost.get(v, pooled) * m.drafted
        out.append(Measured(m.tokens, s * steps, m.drafted, m.accepted))
    return out


def work_key(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a request did: the prompt, the variant, and its token counts."""
    return (
        row["item"],
        row.get("variant") or row["arm"],
        int(row["tokens"]),
        int(row.get("drafted") or 0),
        int(row.get("accepted") or 0),
    )


def log_ratio_summary(logs: Sequence[float]) -> dict[str, Any]:
    """Log ratios as their geometric mean, its 90 % interval and their standard deviation
    (``sd``, the spread of one pair's log ratio; both None for one ratio)."""
    found = mean_interval(logs, Z90)
    return {
        "pairs": len(logs),
        "time_ratio": round(math.exp(found.value), 4),
        "interval": [round(math.exp(found.low), 4), round(math.exp(found.high), 4)]
        if len(logs) > 1
        else None,
        "sd": round(statistics.stdev(logs), 4) if len(logs) > 1 else None,
    }


def same_work(rows: Iterable[Mapping[str, Any]], arm: str) -> dict[str, Any] | None:
    """A daemon arm's requests that did what a static arm's request of the same prompt did
    (``work_key``), each against the first such request: how many, the geometric mean of
    their decode-time ratios (daemon over static; above 1 the daemon's took longer) with a
    90 % interval, ``extra_seconds`` (the daemon's decode seconds beyond the static ones'),
    and the same per variant. None without such pairs."""
    ok = [r for r in succeeded(rows) if int(r.get("tokens") or 0) > 0]
    static: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for row in ok:
        if row["arm"] not in (TUNER, CHALLENGER):
            static.setdefault(work_key(row), row)
    pairs = [
        (row, found) for row in ok if row["arm"] == arm and (found := static.get(work_key(row)))
    ]
    if not pairs:
        return None
    by_variant: dict[str, list[float]] = defaultdict(list)
    for row, found in pairs:
        by_variant[str(row.get("variant"))].append(
            math.log(charged_seconds(row) / charged_seconds(found))
        )
    return log_ratio_summary([x for logs in by_variant.values() for x in logs]) | {
        "extra_seconds": round(sum(charged_seconds(r) - charged_seconds(f) for r, f in pairs), 1),
        "by_variant": {v: log_ratio_summary(logs) for v, logs in sorted(by_variant.items())},
    }


def peer_ratios(
    means: Mapping[str, Mapping[int, Measured]],
    peers: Sequence[str],
    occurrences: Sequence[int],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The peer's decode speed without speculation, and each peer arm over it on these prompt
    occurrences (two binaries decode at different speeds, so each is read against itself);
    empty without ``peer:none``."""
    if PEER_BASELINE not in peers or not occurrences:
        return {}
    base = [means[PEER_BASELINE][i] for i in occurrences]
    arms = {
        arm: arm_entry([means[arm][i] for i in occurrences], base, rng)
        for arm in peers
        if arm != PEER_BASELINE
    }
    return {"baseline_tok_s": round(tok_s_of(base), 2), "arms": arms}


def peer_summary(
    means: Mapping[str, Mapping[int, Measured]],
    peers: Sequence[str],
    occurrences: Sequence[int],
    by_class: Mapping[str, Sequence[int]],
    rng: np.random.Generator,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``peer_ratios`` over the whole run's occurrences, and over each class's."""
    overall = peer_ratios(means, peers, occurrences, rng)
    return overall, {key: peer_ratios(means, peers, items, rng) for key, items in by_class.items()}


def engine_figures(overall: Mapping[str, Any]) -> dict[str, Any]:
    """Figures for comparing engines: the tuners' tokens per second (their ratio over this
    run's no-speculation speed), and the engine's own autotune arms (each over the same
    binary without speculation) with the tuner against the best of them."""
    base = overall["baseline_tok_s"]
    found: dict[str, Any] = {}
    for who in ("tuner", "challenger"):
        if overall.get(f"{who}_ratio") is not None:
            found[f"{who}_tok_s"] = round(overall[f"{who}_ratio"] * base, 2)
    arms = (overall.get("peers") or {}).get("arms", {})
    autotune = {
        arm.removeprefix(AUTOTUNE_PREFIX): entry["ratio"]
        for arm, entry in arms.items()
        if arm.startswith(AUTOTUNE_PREFIX)
    }
    if autotune:
        found["autotune"] = autotune
        if overall.get("tuner_ratio") is not None:
            found["tuner_vs_best_autotune"] = round(
                overall["tuner_ratio"] / max(autotune.values()), 4
            )
    return found
