"""A bench run's request rows: reading and checking them, and throughput over prompts. Pure.

Throughput is decode tokens per second (llama-server's ``predicted_n / predicted_ms``;
prompt processing is the same for every arm): for a multiset of prompt occurrences ``S``,
``tok/s(arm, S) = sum(tokens) / sum(seconds)`` over ``S``, and a ratio is that over the
baseline's on the same occurrences. Intervals: 90 % percentile bootstrap over prompt
occurrences.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.tuning.variants import BASELINE

BASELINE_ARM = BASELINE.name  # the bench arm without speculation
# a peer build's arms (``tuner bench --peer``), each read against the peer's own baseline
PEER_PREFIX = "peer:"
PEER_BASELINE = PEER_PREFIX + BASELINE_ARM
# the engine's own per-step tuning of one spec type, run as a peer arm of its own binary
AUTOTUNE_PREFIX = PEER_PREFIX + "autotune-"


def is_peer(arm: str) -> bool:
    return arm.startswith(PEER_PREFIX)


def charged_seconds(row: Mapping[str, Any]) -> float:
    """A request row's decode seconds."""
    return float(row["ms"]) / 1000.0


@dataclass(frozen=True, slots=True)
class Measured:
    """Tokens, decode seconds and draft counts of one request (or an item's mean)."""

    tokens: float
    seconds: float
    drafted: float = 0.0
    accepted: float = 0.0

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Measured:
        return cls(
            float(row["tokens"]),
            charged_seconds(row),
            float(row.get("drafted") or 0),
            float(row.get("accepted") or 0),
        )


def mean_of(values: Sequence[Measured]) -> Measured:
    n = len(values)
    return Measured(
        sum(v.tokens for v in values) / n,
        sum(v.seconds for v in values) / n,
        sum(v.drafted for v in values) / n,
        sum(v.accepted for v in values) / n,
    )


def tok_s_of(values: Iterable[Measured]) -> float:
    tokens = seconds = 0.0
    for v in values:
        tokens += v.tokens
        seconds += v.seconds
    return tokens / seconds if seconds > 0 else 0.0


def alpha_of(values: Iterable[Measured]) -> float | None:
    drafted = accepted = 0.0
    for v in values:
        drafted += v.drafted
        accepted += v.accepted
    return round(accepted / drafted, 4) if drafted else None


def arm_ratio(arm: Sequence[Measured], base: Sequence[Measured]) -> float:
    b = tok_s_of(base)
    return tok_s_of(arm) / b if b else 0.0


def bootstrap_interval(
    arm: Sequence[Measured], base: Sequence[Measured], rng: np.random.Generator, n: int = 400
) -> tuple[float, float] | None:
    """90 % interval of the ratio, resampling (arm, baseline) pairs together."""
    if len(arm) < 2:
        return None
    a = np.array([[m.tokens, m.seconds] for m in arm])
    b = np.array([[m.tokens, m.seconds] for m in base])
    idx = rng.integers(0, len(arm), size=(n, len(arm)))
    at, as_ = a[idx, 0].sum(axis=1), a[idx, 1].sum(axis=1)
    bt, bs = b[idx, 0].sum(axis=1), b[idx, 1].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (at / as_) / (bt / bs)
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return None
    low, high = np.percentile(ratios, [5, 95])
    return round(float(low), 4), round(float(high), 4)


_NUMBER = (int, float)


_REQUIRED: dict[str, tuple[type, ...]] = {"arm": (str,), "item": (int,), "class": (str,)}


_OPTIONAL: dict[str, tuple[type, ...]] = {
    "repeat": (int,),
    "variant": (str,),
    "tokens": _NUMBER,
    "ms": _NUMBER,
    "drafted": _NUMBER,
    "accepted": _NUMBER,
    "id": (str,),
    "t": _NUMBER,
}


def check_row(row: object) -> str | None:
    """What is wrong with one ``requests.jsonl`` row, or None: the fields the analysis
    reads must be there (``arm``, ``item``, ``class``; ``tokens`` and ``ms`` on an answered
    row) and of their type where present, the benchmark scripts' ``id`` and ``t`` included
    (``null`` stands for absent in the optional ones)."""
    if not isinstance(row, Mapping):
        return f"not an object: {type(row).__name__}"
    required = dict(_REQUIRED)
    if not row.get("error"):
        required |= {"tokens": _NUMBER, "ms": _NUMBER}
    for key, types in (_OPTIONAL | required).items():
        value = row.get(key)
        if value is None:
            if key in required:
                return f"no {key!r}"
            continue
        if isinstance(value, bool) or not isinstance(value, types):
            return f"{key!r} is {value!r}, not {' or '.join(t.__name__ for t in types)}"
    if row["item"] < 0:
        return f"'item' is {row['item']}, below 0"
    return None


def parse_rows(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of a ``requests.jsonl`` (blank lines skipped); a line that is not JSON or
    fails ``check_row`` raises ``ValueError`` naming it (``line N: ...``)."""
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {n}: not JSON: {exc}") from exc
        if problem := check_row(row):
            raise ValueError(f"line {n}: {problem}")
        rows.append(row)
    return rows


def succeeded(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The requests that were answered with decode timings."""
    return [r for r in rows if not r.get("error") and float(r.get("ms") or 0) > 0]


def item_runs(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, list[Measured]]]:
    """Static arm -> item -> its measurements in the order they ran."""
    per_item: dict[str, dict[int, list[Measured]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        per_item[row["arm"]][int(row["item"])].append(Measured.of(row))
    return per_item


def occurrence_of(rows: Iterable[Mapping[str, Any]]) -> dict[int, int]:
    """For each row (by ``id()``), how many requests of its item its arm sent before it."""
    seen: dict[tuple[str, int], int] = defaultdict(int)
    out = {}
    for row in rows:
        key = (str(row["arm"]), int(row["item"]))
        out[id(row)] = seen[key]
        seen[key] += 1
    return out


def item_means(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, Measured]]:
    """Static arm -> item -> the mean of its measurements."""
    return means_of(item_runs(rows))


def means_of(
    runs: Mapping[str, Mapping[int, Sequence[Measured]]],
) -> dict[str, dict[int, Measured]]:
    """``item_means`` from ``item_runs``' output."""
    if BASELINE_ARM not in runs:
        raise ValueError("the run has no successful baseline ('none') request")
    return {arm: {i: mean_of(v) for i, v in items.items()} for arm, items in runs.items()}


def arm_entry(
    arm: Sequence[Measured], base: Sequence[Measured], rng: np.random.Generator
) -> dict[str, Any]:
    interval = bootstrap_interval(arm, base, rng)
    return {
        "ratio": round(arm_ratio(arm, base), 4),
        "interval": list(interval) if interval else None,
        "alpha": alpha_of(arm),
        "tok_s": round(tok_s_of(arm), 2),
    }


def static_class(
    items: Sequence[int],
    means: Mapping[str, Mapping[int, Measured]],
    statics: Sequence[str],
    rng: np.random.Generator,
) -> dict[str, Any]:
    base = [means[BASELINE_ARM][i] for i in items]
    arms = {arm: arm_entry([means[arm][i] for i in items], base, rng) for arm in statics}
    best = max(statics, key=lambda a: arms[a]["ratio"], default=BASELINE_ARM)
    oracle = best if best != BASELINE_ARM and arms[best]["ratio"] > 1.0 else BASELINE_ARM
    return {
        "prompts": len(set(items)),
        "occurrences": len(items),
        "baseline_tok_s": round(tok_s_of(base), 2),
        "arms": arms,
        "oracle": oracle,
        "oracle_ratio": arms[oracle]["ratio"] if oracle != BASELINE_ARM else 1.0,
    }
