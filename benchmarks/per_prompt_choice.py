"""Does choosing the variant per request beat choosing it per class, held out? (#56 item 4)

    python benchmarks/per_prompt_choice.py RUN_DIR WORKLOAD [--splits 50] [--k 7]

From a ``tuner bench`` run's static arms (every prompt served by every arm), each request
priced by its counts (``priced_by_counts``: its drafted and accepted tokens at its prompt's
plain decode speed, one drafted-token cost per variant): per split, half the prompts train
and half are scored. The class choice is the arm with the least priced time over the
training prompts of the class; the per-request choice is the arm with the best mean log
speedup over the ``k`` training prompts nearest in the classifier's features (entropy,
tail entropy, echo, material share, repeat ratio, length, sampling; nearest within the same
class first). Reported: the per-request choice's time against the class choice's on the
scored half (above 1: faster), over many random splits, and the in-sample per-prompt oracle.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tuner.bench.compare import priced_by_counts
from tuner.bench.rows import Measured
from tuner.classify.features import extract
from tuner.classify.prompt import view_of

BASELINE = "none"


def load(run: Path, workload: Path) -> tuple[dict[int, dict[str, float]], dict[int, str],
                                             dict[int, list[float]]]:  # fmt: skip
    """Per prompt: each arm's priced seconds per token, its class, its feature vector."""
    bodies = {}
    for line in workload.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            bodies[item["id"]] = item
    rows = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["arm"] not in ("tuner", "challenger") and not r.get("error")]
    base = {r["item"]: Measured.of(r) for r in rows if r["arm"] == BASELINE}
    rows = [r for r in rows if r["item"] in base]
    priced = priced_by_counts([Measured.of(r) for r in rows], [base[r["item"]] for r in rows],
                              [r["arm"] for r in rows])  # fmt: skip
    cost: dict[int, dict[str, float]] = defaultdict(dict)
    classes, features = {}, {}
    for r, m in zip(rows, priced, strict=True):
        cost[r["item"]][r["arm"]] = m.seconds / max(m.tokens, 1.0)
        classes[r["item"]] = r["class"]
        if r["item"] not in features:
            body = bodies[r["id"]]
            f = extract(view_of(body), body)
            features[r["item"]] = [f.entropy, f.tail_entropy, f.echo, f.material_share,
                                   f.repeat_ratio, math.log1p(f.length_tokens),
                                   float(f.sampling == "greedy")]  # fmt: skip
    arms = set.intersection(*(set(c) for c in cost.values()))
    return {i: {a: c[a] for a in arms} for i, c in cost.items()}, classes, features


def standardise(features: dict[int, list[float]]) -> dict[int, list[float]]:
    columns = list(zip(*features.values(), strict=True))
    mean = [statistics.fmean(c) for c in columns]
    spread = [statistics.pstdev(c) or 1.0 for c in columns]
    return {i: [(x - m) / s for x, m, s in zip(v, mean, spread, strict=True)]
            for i, v in features.items()}  # fmt: skip


def one_split(cost: dict[int, dict[str, float]], classes: dict[int, str],
              features: dict[int, list[float]], rng: random.Random, k: int) -> float:  # fmt: skip
    items = sorted(cost)
    rng.shuffle(items)
    train, test = items[: len(items) // 2], items[len(items) // 2 :]
    arms = sorted(next(iter(cost.values())))
    by_class: dict[str, list[int]] = defaultdict(list)
    for i in train:
        by_class[classes[i]].append(i)
    overall = min(arms, key=lambda a: sum(cost[i][a] for i in train))

    def class_choice(i: int) -> str:
        mine = by_class.get(classes[i])
        if not mine:
            return overall
        return min(arms, key=lambda a: sum(cost[j][a] for j in mine))

    def request_choice(i: int) -> str:
        def distance(j: int) -> float:
            d = math.dist(features[i], features[j])
            return d + (0.0 if classes[j] == classes[i] else 100.0)

        near = sorted(train, key=distance)[:k]
        return max(arms, key=lambda a: statistics.fmean(
            math.log(cost[j][BASELINE] / cost[j][a]) for j in near))  # fmt: skip

    per_class = sum(cost[i][class_choice(i)] for i in test)
    per_request = sum(cost[i][request_choice(i)] for i in test)
    return per_class / per_request


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("workload", type=Path)
    parser.add_argument("--splits", type=int, default=50)
    parser.add_argument("--k", type=int, default=7)
    args = parser.parse_args()
    cost, classes, raw = load(args.run, args.workload)
    features = standardise(raw)
    rng = random.Random(0)
    gains = sorted(one_split(cost, classes, features, rng, args.k) for _ in range(args.splits))
    oracle = sum(min(c.values()) for c in cost.values())
    by_class: dict[str, list[int]] = defaultdict(list)
    for i, key in classes.items():
        by_class[key].append(i)
    class_oracle = sum(min(sum(cost[i][a] for i in mine) for a in cost[mine[0]])
                       for mine in by_class.values())  # fmt: skip
    print(json.dumps({
        "prompts": len(cost),
        "arms": sorted(next(iter(cost.values()))),
        "splits": args.splits,
        "k": args.k,
        "held_out_gain_mean": round(statistics.fmean(gains), 4),
        "held_out_gain_p10_p50_p90": [round(gains[int(q * (len(gains) - 1))], 4)
                                      for q in (0.1, 0.5, 0.9)],
        "in_sample_per_prompt_oracle_over_class_oracle": round(class_oracle / oracle, 4),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
