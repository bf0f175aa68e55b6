"""Do the classes separate acceptance? Real llama-server, every n-gram variant, the dev workload.

For each variant (and no speculation) a llama-server instance replays every prompt
once (greedy). Per prompt: acceptance alpha = accepted / drafted, and speedup =
the variant's decode tok/s over no speculation's. Then, for the classifier's class
keys (and, for reference, the workload's own class hints), the share of variance
explained: eta^2 = SS_between / SS_total, and the adjusted value
1 - (1 - eta^2)(N - 1)/(N - k), since few prompts over several classes inflate eta^2.

Usage: python benchmarks/class_separation.py [--workload FILE] [--max-tokens N] [--out F.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from tuner.calibrate import DEFAULT_VARIANTS, replay_each, temporary_server  # noqa: E402
from tuner.classify import classify, load_definitions  # noqa: E402
from tuner.settings import load_settings  # noqa: E402
from tuner.upstream.launch import prepare  # noqa: E402
from tuner.workload import DEFAULT_WORKLOAD, WorkloadItem, load_workload  # noqa: E402


def eta_squared(values: Sequence[float], groups: Sequence[str]) -> dict[str, float | int]:
    pairs = list(zip(values, groups, strict=True))
    n, k = len(pairs), len(set(groups))
    mean = statistics.fmean(values)
    total = sum((v - mean) ** 2 for v in values)
    by: dict[str, list[float]] = defaultdict(list)
    for v, g in pairs:
        by[g].append(v)
    between = sum(len(vs) * (statistics.fmean(vs) - mean) ** 2 for vs in by.values())
    eta = between / total if total else 0.0
    adjusted = 1 - (1 - eta) * (n - 1) / (n - k) if n > k else float("nan")
    return {"eta2": round(eta, 3), "eta2_adjusted": round(adjusted, 3), "n": n, "classes": k}


async def measure(items: list[WorkloadItem], max_tokens: int) -> dict[str, list[dict[str, Any]]]:
    settings = load_settings()
    prepared = prepare(settings)
    binary, caps, model = prepared.binary, prepared.capabilities, prepared.model
    variants = {"none": ["--spec-type", "none"], **DEFAULT_VARIANTS}
    out = {}
    for name, flags in variants.items():
        print(f"replaying {len(items)} prompts with {name}", file=sys.stderr, flush=True)
        async with temporary_server(binary, settings, caps, model, flags, name) as client:
            out[name] = await replay_each(client, items, max_tokens)
    return out


def analyse(items: list[WorkloadItem], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    definitions = load_definitions()
    keys = [classify(item.model_dump(exclude_none=True), definitions).key for item in items]
    hints = [item.class_hint or "?" for item in items]
    base = [t["predicted_per_second"] for t in runs["none"]]
    report: dict[str, Any] = {"classes": dict(zip([i.id for i in items], keys, strict=True))}
    per_variant = {}
    for name, timings in runs.items():
        if name == "none":
            continue
        speedups = [t["predicted_per_second"] / b for t, b in zip(timings, base, strict=True)]
        drafted = [(t.get("draft_n", 0), t.get("draft_n_accepted", 0)) for t in timings]
        idx = [i for i, (d, _) in enumerate(drafted) if d > 0]
        alphas = [drafted[i][1] / drafted[i][0] for i in idx]
        per_variant[name] = {
            "mean_speedup": round(statistics.fmean(speedups), 3),
            "alpha_by_class": eta_squared(alphas, [keys[i] for i in idx]) if idx else None,
            "alpha_by_hint": eta_squared(alphas, [hints[i] for i in idx]) if idx else None,
            "speedup_by_class": eta_squared(speedups, keys),
            "speedup_by_hint": eta_squared(speedups, hints),
            "prompts_with_drafts": len(idx),
        }
    report["variants"] = per_variant
    best_name = max(per_variant, key=lambda n: per_variant[n]["mean_speedup"])
    best = [
        max(t["predicted_per_second"] for t in (runs[v][i] for v in per_variant)) / base[i]
        for i in range(len(items))
    ]
    report["best_single_variant"] = best_name
    report["per_prompt_best_speedup_by_class"] = eta_squared(best, keys)
    report["per_prompt_best_speedup_by_hint"] = eta_squared(best, hints)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--max-tokens", type=int, default=128, dest="max_tokens")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    items = load_workload(args.workload)
    runs = asyncio.run(measure(items, args.max_tokens))
    result = analyse(items, runs)
    result["raw"] = runs
    print(json.dumps({k: v for k, v in result.items() if k != "raw"}, indent=2))
    emit(result, args.out, quiet=True)


if __name__ == "__main__":
    main()
