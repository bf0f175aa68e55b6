"""Replay a measured `tuner bench` summary through the tuning engine, simulated (seconds).

A development aid for engine changes, not evidence: the real bench is (``tuner bench``).
The per-class speedups of the static arms come from a real ``summary.json``; a variant of the
search space that was not a static arm takes the nearest arm's (same spec type, nearest
lookup length) times a fixed per-class jitter. Each simulated request draws a decode speed
around its class's true speedup (``tests.tuning.sim.SimUpstream``: log-normal, ``--noise``,
half that without speculation: prompts in one class differ), with token counts that make
that speedup at a drafted token's cost of 0.45 (the Gemma CPU runs' fit), in a
shuffled stream with the bench's per-class request counts. The engine is the real one, with
the shipped tuning file (``--set`` changes a value), a dense target's default cost model (the
daemon's adds the model file's facts and a calibration profile; here only the prior's ordering
of first trials can differ) and Optuna in a temporary directory.

With ``--requests`` (the run's ``requests.jsonl``) it simulates per prompt instead: each
prompt's own measured speed without speculation and its own static arms' speedups (one
measurement each; the other variants the nearest arm's), the tuner's prompts in the bench's
own order for seed 0 (shuffled for the others), so the spread of prompts within a class is
in the simulation. ``--scale`` makes the run longer or shorter than the bench's.

    python benchmarks/engine_replay.py benchmarks/results/bench/gemma-cost-budget/summary.json
    python benchmarks/engine_replay.py SUMMARY --seeds 6 --noise 0.25 --set budget.patience=0
    python benchmarks/engine_replay.py DIR/summary.json --requests DIR/requests.jsonl --noise 0.08

Prints, averaged over seeds: the whole-run speedup (true speedups of what was served), the
last half's, the best single static arm's and the per-class oracle's, and the share of
requests that explored.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the simulated upstream is the engine tests' own

from tests.tuning.sim import BASE_TOK_S, HELP, SimUpstream  # noqa: E402
from tuner.logs import configure_logging  # noqa: E402
from tuner.model.speedup import CostModel  # noqa: E402
from tuner.tuning.config import TuningConfig, load_tuning  # noqa: E402
from tuner.tuning.engine import Engine  # noqa: E402
from tuner.tuning.prior import PriorView  # noqa: E402
from tuner.tuning.studies import StudyBook  # noqa: E402
from tuner.tuning.variants import Variant, grid, parse_name  # noqa: E402
from tuner.upstream.capabilities import parse_capabilities  # noqa: E402

LOOKUP = {"ngram-simple": "size_n", "ngram-map-k": "size_n", "ngram-map-k4v": "size_n",
          "ngram-mod": "n_match"}  # fmt: skip


def _lookup(variant: Variant) -> float:
    param = LOOKUP.get(variant.spec_type)
    value = variant.param(param) if param else None
    return float(value) if value is not None else 12.0


def fill(
    measured: dict[str, float],
    arms: dict[str, Variant],
    variants: list[Variant],
    rng: random.Random,
) -> dict[str, float]:
    """The measured arms' speedups, and every speculative variant's: a static arm's as
    measured, the rest the nearest measured arm's (same spec type, nearest lookup length)
    times a fixed jitter."""
    found = dict(measured)
    for v in variants:
        if not v.speculative or v.name in found:
            continue
        same = [n for n, a in arms.items() if a.spec_type == v.spec_type and n in measured]
        if not same:
            found[v.name] = 0.9
            continue
        near = min(same, key=lambda n: abs(_lookup(arms[n]) - _lookup(v)))
        found[v.name] = measured[near] * rng.lognormvariate(0.0, 0.03)
    return found


def _arms(summary: dict[str, Any]) -> dict[str, Variant]:
    return {name: parse_name(name) for name in summary["static_arms"] if name != "none"}


def truth(
    summary: dict[str, Any], variants: list[Variant], seed: int
) -> dict[str, dict[str, float]]:
    """Per class, every variant's true speedup (static arms as measured, the rest nearest)."""
    rng, arms = random.Random(seed), _arms(summary)
    return {
        key: fill({n: float(a["ratio"]) for n, a in cls["arms"].items()}, arms, variants, rng)
        for key, cls in summary["classes"].items()
    }


def prompt_truth(
    summary: dict[str, Any], rows: list[dict[str, Any]], variants: list[Variant], seed: int
) -> tuple[dict[str, dict[str, float]], dict[str, float], list[tuple[str, str]]]:
    """From the bench's ``requests.jsonl``: per prompt, every variant's true speedup over that
    prompt's own baseline (its static arms' one measurement each, the rest nearest), each
    prompt's baseline speed relative to the simulator's base, and the tuner's (class, prompt)
    sequence as the bench sent it."""
    rng, arms = random.Random(seed), _arms(summary)
    speed: dict[str, dict[str, float]] = {}
    for row in rows:
        if row["arm"] != "tuner" and row.get("ms") and row.get("tokens"):
            speed.setdefault(row["id"], {})[row["arm"]] = row["tokens"] / row["ms"] * 1000
    table, base = {}, {}
    for prompt, arm_speeds in speed.items():
        none = arm_speeds.get("none")
        if not none:
            continue
        measured = {n: v / none for n, v in arm_speeds.items() if n != "none"}
        table[prompt] = fill(measured, arms, variants, rng)
        base[prompt] = none / BASE_TOK_S
    order = [(r["class"], r["id"]) for r in rows if r["arm"] == "tuner" and r["id"] in table]
    return table, base, order


def stream(summary: dict[str, Any], seed: int, scale: float = 1.0) -> list[str]:
    counts = {k: round(int(c["occurrences"]) * scale) for k, c in summary["classes"].items()}
    keys = [k for k, n in counts.items() for _ in range(n)]
    random.Random(seed).shuffle(keys)
    return keys


class _KnowingEngine(Engine):
    """The engine with a prior that knows the true speedups: each class ranks the variants by
    ``table(class_key)``, best first (an upper bound on what a better prior could do)."""

    def __init__(self, table: Callable[[str], dict[str, float]], *args: Any, **kw: Any) -> None:
        self.table = table
        super().__init__(*args, **kw)

    def _rank(self, key: str) -> PriorView:
        view = super()._rank(key)
        table = self.table(key)
        order = sorted(view.ranked, key=lambda pair: -table.get(pair[0].name, 0.0))
        return PriorView(tuple((v, table.get(v.name, p)) for v, p in order), True, "known")


def replay(
    summary: dict[str, Any],
    config: TuningConfig,
    seed: int,
    noise: float,
    prior: str = "model",
    scale: float = 1.0,
    rows: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """One simulated run: per class (the summary's speedups, a shuffled stream of its request
    counts) or, given the bench's ``rows``, per prompt (each prompt's own measured speeds,
    the bench's own order for seed 0, shuffled for the others)."""
    caps = parse_capabilities(HELP.read_text())
    variants = grid(config.search, caps)
    sim: SimUpstream
    if rows is None:
        speeds = truth(summary, variants, seed)
        units = [(k, k) for k in stream(summary, seed, scale)]
        sim = SimUpstream(speeds, noise=noise, baseline_noise=noise / 2, seed=seed + 1000)
    else:
        speeds, base, order = prompt_truth(summary, rows, variants, seed)
        units = [order[i % len(order)] for i in range(round(len(order) * scale))]
        if seed:
            random.Random(seed).shuffle(units)
        sim = SimUpstream(speeds, bases=base, noise=noise, baseline_noise=noise / 2, seed=seed)

    def rel(unit: str, variant: str) -> float:
        return 1.0 if variant == "none" else speeds[unit].get(variant, 0.9)

    names = [v.name for v in variants if v.speculative]
    by_class: dict[str, list[str]] = {}
    for cls, unit in units:
        by_class.setdefault(cls, []).append(unit)
    per_class = {
        cls: {n: statistics.fmean(rel(u, n) for u in us) for n in names}
        for cls, us in by_class.items()
    }
    weighted = {n: statistics.fmean(rel(u, n) for _, u in units) for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        book = StudyBook(Path(tmp) / "studies.db", "replay", seed=seed)
        if prior == "model":
            engine = Engine(config, variants, book, cost=CostModel())
        else:
            table = per_class.get if prior == "class" else (lambda _: None)
            engine = _KnowingEngine(
                lambda key: table(key) or weighted, config, variants, book, cost=CostModel()
            )
        served: list[float] = []
        explored = 0
        for cls, unit in units:
            d = engine.route(cls)
            served.append(rel(unit, d.variant))
            explored += d.role in ("trial", "control")
            engine.observe(sim.answer(unit, d).model_copy(update={"class_key": cls}))
    arms = [name for name in summary["static_arms"] if name != "none"]
    static = {a: statistics.fmean(rel(u, a) for _, u in units) for a in arms}
    best = {cls: max([1.0, *(statistics.fmean(rel(u, a) for u in us) for a in arms)])
            for cls, us in by_class.items()}  # fmt: skip
    oracle = statistics.fmean(best[cls] for cls, _ in units)
    half = len(served) // 2
    return {
        "whole": statistics.fmean(served),
        "last_half": statistics.fmean(served[half:]),
        "best_static": max(static.values()),
        "oracle": oracle,
        "explored": explored / len(served),
        "requests": len(served),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("summary", type=Path)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--noise", type=float, default=0.12)
    parser.add_argument(
        "--scale", type=float, default=1.0,
        help="requests per class: the bench's count times this (a longer or shorter run)",
    )  # fmt: skip
    parser.add_argument(
        "--requests", type=Path, metavar="REQUESTS_JSONL",
        help="the bench's requests.jsonl: simulate per prompt (each prompt's own measured "
        "speeds and baseline, the bench's order) instead of per class",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, help="also write the per-seed results as JSON")
    parser.add_argument(
        "--prior", choices=["model", "global", "class"], default="model",
        help="what orders each class's first trials: the engine's speedup model (default), "
        "the true traffic-weighted speedups (a perfect search shared by all classes), or the "
        "class's own true speedups (a perfect per-class prior)",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="change one tuning-file value, e.g. budget.max_trials=6 (repeatable)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        summary = json.loads(args.summary.read_text())
        rows = None
        if args.requests is not None:
            lines = args.requests.read_text().splitlines()
            rows = [json.loads(line) for line in lines if line.strip()]
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read the run: {exc}")
    data = load_tuning().model_dump()
    for item in args.set:
        path, _, value = item.partition("=")
        section, _, name = path.partition(".")
        if not isinstance(data.get(section), dict) or not name:
            parser.error(f"--set {item}: want SECTION.KEY=VALUE with a tuning-file section")
        try:
            data[section][name] = json.loads(value)
        except json.JSONDecodeError:
            parser.error(f"--set {item}: the value must be a number, true/false or JSON")
    try:
        config = TuningConfig.model_validate(data)  # the tuning file's own checks
    except ValidationError as exc:
        first = exc.errors()[0]
        parser.error(f"--set {'.'.join(map(str, first['loc']))}: {first['msg']}")
    try:
        runs = [
            replay(summary, config, seed, args.noise, args.prior, args.scale, rows)
            for seed in range(args.seeds)
        ]
    except (KeyError, TypeError, ValueError, ZeroDivisionError, statistics.StatisticsError) as exc:
        parser.error(f"not a bench summary.json / requests.jsonl pair: {type(exc).__name__} {exc}")
    for name in runs[0]:
        values = [r[name] for r in runs]
        print(f"{name:12s} {statistics.fmean(values):.3f}  ({min(values):.3f}-{max(values):.3f})")
    whole = statistics.fmean(r["whole"] / r["best_static"] for r in runs)
    print(f"whole run / best static {whole:.3f}")
    if args.out is not None:
        document = {"summary": str(args.summary), "noise": args.noise, "set": args.set,
                    "prior": args.prior, "scale": args.scale,
                    "requests_file": str(args.requests) if args.requests else None,
                    "explore_share": config.budget.explore_share, "runs": runs,
                    "whole_vs_best_static": round(whole, 4)}  # fmt: skip
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    configure_logging(level="warning")  # the engine logs every policy change at info
    sys.exit(main())
