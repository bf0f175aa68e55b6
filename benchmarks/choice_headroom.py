"""How much a choice per class can earn over the best single static arm of a bench run.

The ceiling the tuner's choices work under, measured without timing noise. Each static
arm's request on each prompt is priced by its counts, ``n / (n - a + c d)`` with ``c``
that arm's own drafted-token cost measured in the run (``benchmarks.drafted_cost``), so
a prompt's arms are compared on what they drafted and accepted rather than on two decode
times that scatter by ~10 % each on a shared 2-core machine.

- ``arms``: each static arm's speedup over no speculation, all prompts.
- ``in_sample``: the best single arm, the best arm per class and the best per prompt,
  each chosen on the prompts it is measured on (upper bounds: the choice sees the answer).
- ``held_out``: per grouping of the prompts (``static``: one group; ``class``: the
  bench's class; with ``--workload``, ``class+form``: chat or completion within a class,
  ``class+echo``: a class's prompts in thirds of the classifier's echo score, and
  ``kind``: the workload's own label of each prompt, its ``class_hint`` with its form and
  whether it is sampled, as many groups as the generator has templates: the finest prompt
  type any feature of a prompt could tell apart), the arm
  chosen per group on a random half of the prompts and measured on the other half, as a
  ratio to the single arm chosen on that same half; mean and 5th-95th percentiles over
  ``--splits`` halves. A group missing from a half takes its class's choice, then the
  single arm's. This is what a choice per group earns when it is learned on other
  prompts than the ones it serves, as the tuner's is.

    python -m benchmarks.choice_headroom DIR [--workload FILE.jsonl] [--splits 200] [--out F]
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import emit, read_requests, usable
from benchmarks.drafted_cost import drafted_cost
from benchmarks.exploration_cost import DAEMONS
from tuner.classify.classes import classify, load_definitions
from tuner.errors import ConfigError
from tuner.workload import WorkloadItem, load_workload

# prompt id -> arm -> (tokens generated, plain decode steps the counts price them at)
Priced = dict[str, dict[str, tuple[float, float]]]
Grouping = Callable[[str], Hashable]


def priced(rows: Iterable[dict[str, Any]]) -> tuple[Priced, dict[str, str]]:
    """Each static arm's requests per prompt, priced by counts at the arm's measured
    drafted-token cost, and each prompt's class; only prompts every arm answered."""
    rows = [r for r in rows if usable(r)]
    costs = {arm: float(v["c"]) for arm, v in drafted_cost(rows).get("static", {}).items()}
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    classes: dict[str, str] = {}
    arms: set[str] = set()
    for row in rows:
        arm = str(row["arm"])
        if arm in DAEMONS or arm == "none":
            continue
        n, d, a = (float(row.get(k) or 0) for k in ("tokens", "drafted", "accepted"))
        if d > 0 and arm not in costs:
            continue  # drafted, but its cost could not be measured (no baseline)
        arms.add(arm)
        each = sums[str(row["id"])][arm]
        each[0] += n
        each[1] += n - a + costs.get(arm, 0.0) * d
        classes[str(row["id"])] = str(row.get("class") or "all")
    out: Priced = {
        pid: {arm: (n, steps) for arm, (n, steps) in by_arm.items()}
        for pid, by_arm in sums.items()
        if set(by_arm) == arms
    }
    return out, {pid: classes[pid] for pid in out}


def _arms(prompts: Priced) -> list[str]:
    return sorted(next(iter(prompts.values())))


def _chosen_speedup(prompts: Priced, choice: Callable[[str], str], ids: Iterable[str]) -> float:
    """The speedup of ``ids`` with each prompt served by the arm ``choice`` gives it."""
    n = steps = 0.0
    for pid in ids:
        each = prompts[pid][choice(pid)]
        n, steps = n + each[0], steps + each[1]
    return n / steps if steps > 0 else 0.0


def _speedup(prompts: Priced, ids: Iterable[str], arm: str) -> float:
    return _chosen_speedup(prompts, lambda _: arm, ids)


def _best(prompts: Priced, ids: Sequence[str], arms: Sequence[str]) -> str:
    return max(arms, key=lambda arm: _speedup(prompts, ids, arm))


def _best_by(prompts: Priced, ids: Iterable[str], group: Grouping) -> dict[Hashable, str]:
    """The best arm of each group of ``ids``."""
    members: dict[Hashable, list[str]] = defaultdict(list)
    for pid in ids:
        members[group(pid)].append(pid)
    arms = _arms(prompts)
    return {key: _best(prompts, each, arms) for key, each in members.items()}


def in_sample(prompts: Priced, classes: Mapping[str, str]) -> dict[str, float]:
    """The best single arm, per class and per prompt, each chosen where it is measured."""
    ids = sorted(prompts)
    arms = _arms(prompts)
    single = _best(prompts, ids, arms)
    per_class = _best_by(prompts, ids, classes.__getitem__)
    return {
        "best_static": round(_speedup(prompts, ids, single), 4),
        "per_class": round(_chosen_speedup(prompts, lambda p: per_class[classes[p]], ids), 4),
        "per_prompt": round(_chosen_speedup(prompts, lambda p: _best(prompts, [p], arms), ids), 4),
    }


def held_out(
    prompts: Priced, classes: Mapping[str, str], group: Grouping, splits: int, seed: int = 0
) -> list[float]:
    """Per random half: the per-group choice learned on it, measured on the other half,
    over the single arm learned on it (see the module's docstring)."""
    ids = sorted(prompts)
    arms = _arms(prompts)
    rng = random.Random(seed)
    ratios = []
    for _ in range(splits):
        shuffled = ids[:]
        rng.shuffle(shuffled)
        train, test = shuffled[: len(ids) // 2], shuffled[len(ids) // 2 :]
        single = _best(prompts, train, arms)
        by_group = _best_by(prompts, train, group)
        by_class = _best_by(prompts, train, classes.__getitem__)
        chosen = {
            pid: by_group.get(group(pid)) or by_class.get(classes[pid]) or single for pid in test
        }
        ratios.append(
            _chosen_speedup(prompts, chosen.__getitem__, test) / _speedup(prompts, test, single)
        )
    return ratios


def _summary(ratios: Sequence[float]) -> dict[str, float]:
    ordered = sorted(ratios)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "vs_best_static": round(sum(ordered) / len(ordered), 4),
        "low": round(at(0.05), 4),
        "high": round(at(0.95), 4),
    }


def workload_groupings(
    items: Iterable[WorkloadItem], classes: Mapping[str, str]
) -> dict[str, Grouping]:
    """``class+form`` and ``class+echo`` from the workload's prompts (the classifier's
    features of each prompt id, from the request the bench sends for it), and ``kind``
    when the workload labels its prompts (``class_hint``)."""
    definitions = load_definitions()
    by_id = {item.id: item for item in items}
    features = {
        item.id: classify(item.model_dump(exclude_none=True), definitions).features
        for item in by_id.values()
    }
    known = [pid for pid in classes if pid in features]
    echoes = sorted(features[pid].echo for pid in known)
    cuts = (echoes[len(echoes) // 3], echoes[2 * len(echoes) // 3]) if echoes else (0.0, 0.0)

    def form(pid: str) -> Hashable:
        f = features.get(pid)
        return (classes[pid], None if f is None else f.chat)

    def echo(pid: str) -> Hashable:
        f = features.get(pid)
        return (classes[pid], None if f is None else sum(f.echo >= cut for cut in cuts))

    def kind(pid: str) -> Hashable:
        item = by_id.get(pid)
        if item is None or item.class_hint is None:
            return (classes[pid], None)
        return (item.class_hint, item.messages is not None, item.temperature > 0)

    found: dict[str, Grouping] = {"class+form": form, "class+echo": echo}
    if any(item.class_hint is not None for item in by_id.values()):
        found["kind"] = kind
    return found


def choice_headroom(
    rows: Iterable[dict[str, Any]],
    workload: Sequence[WorkloadItem] | None = None,
    splits: int = 200,
) -> dict[str, Any]:
    prompts, classes = priced(rows)
    if not prompts:
        return {"prompts": 0}
    ids = sorted(prompts)
    groupings: dict[str, Grouping] = {"static": lambda _: "all", "class": classes.__getitem__}
    if workload is not None:
        groupings |= workload_groupings(workload, classes)
    return {
        "prompts": len(ids),
        "arms": {arm: round(_speedup(prompts, ids, arm), 4) for arm in _arms(prompts)},
        "in_sample": in_sample(prompts, classes),
        "held_out": {
            name: _summary(held_out(prompts, classes, group, splits))
            for name, group in groupings.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench run's directory (with requests.jsonl)")
    parser.add_argument("--workload", type=Path, help="the run's workload (prompt features)")
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.splits < 1:
        parser.error("--splits must be at least 1")
    rows = read_requests(parser, args.run)
    try:
        items = load_workload(args.workload) if args.workload else None
    except ConfigError as exc:
        parser.error(str(exc))
    result = choice_headroom(rows, items, args.splits)
    emit({"run": str(args.run), **result}, args.out)


if __name__ == "__main__":
    main()
