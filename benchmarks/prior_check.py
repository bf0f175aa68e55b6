"""How good is the prior's first pick? Checked against the static arms a `tuner bench` measured.

For every class of one or more bench summaries, rank the static arms (n-gram variants)
with the prior as the engine would (the class key's guessed acceptance, this machine's
calibrated verify curve), once with the copy model for n-gram variants (what the engine
uses) and once with Leviathan's independent-token model (what it used before), and
report the measured ratio of each model's first pick, the best arm's, and the Spearman
rank correlation between predicted and measured.

Usage: python benchmarks/prior_check.py SUMMARY.json [...] [--profile PROFILE.json] [--out F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import json  # noqa: E402

from benchmarks.common import emit  # noqa: E402
from tuner.model.speedup import CostModel, interpolated_curve, speedup  # noqa: E402
from tuner.tuning.config import load_tuning  # noqa: E402
from tuner.tuning.prior import class_alpha, rank  # noqa: E402
from tuner.tuning.variants import Variant, parse_name  # noqa: E402

PROFILE = ROOT / "profiles" / "gemma-3-270m-q4_k_m-f6bc941d5fb4@f88f0bf3f042.json"


def spearman(a: dict[str, float], b: dict[str, float]) -> float:
    names = sorted(a)
    ra = {n: i for i, n in enumerate(sorted(names, key=lambda n: a[n]))}
    rb = {n: i for i, n in enumerate(sorted(names, key=lambda n: b[n]))}
    n = len(names)
    return 1 - 6 * sum((ra[x] - rb[x]) ** 2 for x in names) / (n * (n * n - 1))


def iid(key: str, variants: list[Variant], cost: CostModel) -> dict[str, float]:
    """The prior before the copy model: every n-gram round drafts its full length."""
    prior = load_tuning().prior
    return {
        v.name: speedup(class_alpha(key, v, prior), max(1, min(v.draft_length, 64)), cost)
        for v in variants
    }


def check(summaries: list[Path], profile: Path) -> dict[str, Any]:
    curve = json.loads(profile.read_text())["verify_curve"]
    cost = CostModel(verify=interpolated_curve([(int(n), float(t)) for n, t in curve]))
    prior = load_tuning().prior
    rows = []
    for path in summaries:
        for key, data in json.loads(path.read_text())["classes"].items():
            measured = {a: float(v["ratio"]) for a, v in data["arms"].items() if a != "none"}
            variants = [parse_name(a) for a in measured]
            models = {
                "copy": {v.name: s for v, s in rank(key, variants, prior, cost).ranked},
                "iid": iid(key, variants, cost),
            }
            row: dict[str, Any] = {"summary": path.parent.name, "class": key,
                                   "best": max(measured.values())}  # fmt: skip
            for name, predicted in models.items():
                top = max(predicted, key=lambda n: (predicted[n], n))
                row[f"{name}_pick"], row[f"{name}_pick_ratio"] = top, measured[top]
                row[f"{name}_spearman"] = round(spearman(predicted, measured), 3)
            rows.append(row)
    mean = {
        f"{m}_{what}": round(statistics.mean(r[f"{m}_{what}"] for r in rows), 4)
        for m in ("copy", "iid")
        for what in ("pick_ratio", "spearman")
    }
    return {"classes": len(rows), "mean_best": round(statistics.mean(r["best"] for r in rows), 4),
            **mean, "rows": rows}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summaries", type=Path, nargs="+")
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit(check(args.summaries, args.profile), args.out)


if __name__ == "__main__":
    main()
