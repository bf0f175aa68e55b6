"""What pricing by counts can reach on a `tuner bench` run: cost models fitted in hindsight.

Each static arm's request is priced from its own exact counts (``n`` tokens, ``d`` drafted,
``a`` accepted, and ``r`` draft rounds, read from the static server's log: llama-server
prints each request's acceptance and mean tokens per round, ``1 + a / r``) by a cost model
fitted by least squares on every static request's decode time of the same run, then set
beside time as the pricing check does: per class and arm, ``sum n / sum work`` against the
arm's tokens/s over its baseline's on the same prompts. The models::

    per variant         t = tau (n - a) + kappa_v d           (what the engine prices by)
    per round           t = tau (n - a) + kappa d + rho r     (one cost, plus one per round)
    one cost            t = tau (n - a) + kappa d
    per class, in hindsight: tau per class, kappa per class and arm, rho: an upper bound

A model fitted on the very times it is checked against does at least as well as any live
pricing could; where it misses, counts alone cannot price the class::

    python -m benchmarks.pricing_hindsight RUN_DIR [--out FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import emit, usable
from tuner.bench.beliefs import noise_floor
from tuner.bench.rows import BASELINE_ARM, is_peer
from tuner.bench.schedule import CHALLENGER, TUNER

Row = dict[str, Any]
SPAWN = re.compile(r"spawning server instance with name=(\S+) on port (\d+)")
DRAFTS = re.compile(
    r"^\[(\d+)\].*draft acceptance = [\d.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), "
    r"mean len =\s*([\d.]+)"
)
TOLERANCE = 0.03
DAEMONS = (TUNER, CHALLENGER)


def with_rounds(rows: Sequence[Row], log: Sequence[str]) -> list[Row]:
    """The static arms' usable rows, each with ``rounds`` where its log line gives them (a
    request that accepted nothing does not: its arm's mean round length stands in)."""
    names: dict[str, str] = {}
    lines: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for line in log:
        if found := SPAWN.search(line):
            names[found.group(2)] = found.group(1)
        elif found := DRAFTS.match(line):
            port, a, d, mean = found.groups()
            lines[names.get(port, "?")].append((int(a), int(d), float(mean)))
    static = sorted(
        (r for r in rows if usable(r) and r["arm"] not in DAEMONS and not is_peer(r["arm"])),
        key=lambda r: float(r["t"]),
    )
    out: list[Row] = []
    at: dict[str, int] = defaultdict(int)
    for row in static:
        row = {**row, "rounds": None}
        logged = lines.get(row["arm"], [])
        if row["drafted"] > 0:  # the next line of its instance with the same counts
            k = at[row["arm"]]
            while k < len(logged) and logged[k][:2] != (row["accepted"], row["drafted"]):
                k += 1
            if k < len(logged):
                a, _, mean = logged[k]
                at[row["arm"]] = k + 1
                row["rounds"] = round(a / (mean - 1)) if a > 0 and mean > 1 else None
        out.append(row)
    known = [r for r in out if r["rounds"]]
    per_round = {
        arm: sum(r["drafted"] for r in known if r["arm"] == arm)
        / sum(r["rounds"] for r in known if r["arm"] == arm)
        for arm in {r["arm"] for r in known}
    }
    for row in out:
        if row["drafted"] > 0 and row["rounds"] is None:
            row["rounds"] = math.ceil(row["drafted"] / per_round.get(row["arm"], 16.0))
    return out


Features = Callable[[Row], tuple[list[float], int]]  # the cost terms, and tau's column


def fit(rows: Sequence[Row], features: Features) -> Callable[[Row], float]:
    """Least squares on relative time; a request's work in plain steps of its tau."""
    design = [features(r) for r in rows]
    x = np.array([f for f, _ in design], float)
    t = np.array([float(r["ms"]) for r in rows])
    beta = np.linalg.lstsq(x / t[:, None], np.ones(len(rows)), rcond=None)[0]

    def work(row: Row) -> float:
        terms, tau = features(row)
        return float(np.dot(beta, terms) / beta[tau])

    return work


def models(rows: Sequence[Row]) -> dict[str, Features]:
    arms = sorted({r["arm"] for r in rows if r["drafted"] > 0})
    classes = sorted({r["class"] for r in rows})
    cells = sorted({(r["class"], r["arm"]) for r in rows if r["drafted"] > 0})

    def steps(r: Row) -> float:
        return float(r["tokens"] - r["accepted"])

    def one_hot(keys: Sequence[Any], key: Any, value: float) -> list[float]:
        return [value if k == key else 0.0 for k in keys]

    return {
        "per_variant": lambda r: ([steps(r), *one_hot(arms, r["arm"], r["drafted"])], 0),
        "per_round": lambda r: ([steps(r), r["drafted"], r["rounds"] or 0], 0),
        "one_cost": lambda r: ([steps(r), r["drafted"]], 0),
        "per_class_hindsight": lambda r: (
            [
                *one_hot(classes, r["class"], steps(r)),
                *one_hot(cells, (r["class"], r["arm"]), r["drafted"]),
                r["rounds"] or 0,
            ],
            classes.index(r["class"]),
        ),
    }


def mean_abs_log(values: Iterable[float]) -> float:
    logs = [abs(math.log(v)) for v in values]
    return sum(logs) / max(1, len(logs))


def request_sd(rows: Sequence[Row]) -> float | None:
    """One request's timing noise (log sd): a static arm's repeats of a prompt that did the
    same work (identical counts) differ by time alone."""
    runs: dict[tuple[str, str, int, int, int], list[float]] = defaultdict(list)
    for r in rows:
        key = (r["arm"], r["id"], r["tokens"], r["drafted"], r["accepted"])
        runs[key].append(math.log(float(r["ms"])))
    diffs = [a - b for logs in runs.values() if len(logs) == 2 for a, b in [logs]]
    if len(diffs) < 8:
        return None
    return math.sqrt(sum(d * d for d in diffs) / len(diffs) / 2)


def check(
    rows: Sequence[Row], work: Callable[[Row], float], sd: float | None = None
) -> dict[str, Any]:
    """Predicted over measured per class and arm (3 prompts or more), and per pair of arms
    in a class (what a choice between them rests on)."""
    base = {(r["item"], r["repeat"]): r for r in rows if r["arm"] == BASELINE_ARM}
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 5)
    for r in rows:
        plain = base.get((r["item"], r["repeat"])) or base.get((r["item"], 0))
        if r["arm"] == BASELINE_ARM or plain is None:
            continue
        cell = sums[(r["class"], r["arm"])]
        for i, v in enumerate((r["tokens"], work(r), r["ms"], plain["tokens"], plain["ms"])):
            cell[i] += float(v)
    ratios = {
        key: (n / w) / ((n / ms) / (bn / bms))
        for key, (n, w, ms, bn, bms) in sums.items()
        if sum(1 for r in rows if (r["class"], r["arm"]) == key) >= 3
    }
    prompts = {key: len({r["id"] for r in rows if (r["class"], r["arm"]) == key}) for key in ratios}
    floor = noise_floor([{"prompts": n} for n in prompts.values()], sd) if sd else None
    by_class: dict[str, list[float]] = defaultdict(list)
    for (key, _), ratio in sorted(ratios.items()):
        by_class[key].append(ratio)
    pairs = [a / b for rs in by_class.values() for a, b in itertools.combinations(rs, 2)]
    return {
        "pairs": len(ratios),
        "within": sum(abs(r - 1) <= TOLERANCE for r in ratios.values()),
        "mean_error": round(math.expm1(mean_abs_log(ratios.values())), 4),
        "median": round(sorted(ratios.values())[len(ratios) // 2], 4) if ratios else None,
        "noise_floor": floor,
        "variant_pairs": len(pairs),
        "variant_pairs_within": sum(abs(r - 1) <= TOLERANCE for r in pairs),
    }


def per_round(rows: Sequence[Row], arm: str) -> float:
    mine = [r for r in rows if r["arm"] == arm]
    drafted, rounds = sum(int(r["drafted"]) for r in mine), sum(int(r["rounds"]) for r in mine)
    return round(drafted / max(1, rounds), 1)


def hindsight(
    rows: Sequence[Row], log: Sequence[str], same_work_sd: float | None = None
) -> dict[str, Any]:
    """``same_work_sd``: the run's same-work log sd (``summary.json``), for the noise floor
    where no static arm repeated a prompt."""
    priced = with_rounds(rows, log)
    sd = request_sd(priced) or (same_work_sd / math.sqrt(2) if same_work_sd else None)
    rounds = [r for r in priced if r["drafted"] > 0]
    arms = {str(r["arm"]) for r in rounds}
    return {
        "requests": len(priced),
        "drafted_per_round": {arm: per_round(rounds, arm) for arm in sorted(arms)},
        "request_sd": round(sd, 4) if sd else None,
        "models": {name: check(priced, fit(priced, f), sd) for name, f in models(priced).items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench run's directory")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        rows = [json.loads(line) for line in (args.run / "requests.jsonl").read_text().splitlines()]
        log = (args.run / "matrix-llama-server.log").read_text(errors="replace").splitlines()
    except (OSError, ValueError) as exc:
        parser.error(f"{args.run}: {exc}")
    try:
        summary = json.loads((args.run / "summary.json").read_text())
        same = summary["overall"].get("tuner_same_work") or {}
    except (OSError, ValueError, KeyError):
        same = {}
    emit({"run": str(args.run), **hindsight(rows, log, same.get("sd"))}, args.out)


if __name__ == "__main__":
    main()
