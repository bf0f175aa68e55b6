"""Route latency while the learner works: does the request path wait for learning?

Builds the tuning engine on the shipped tuning file and the variants of a saved
llama-server help text, gives it 16 classes of evidence (simulated answers, trials from
an Optuna study in a temporary folder), then, for ``--seconds``:

- one thread (the event loop's part) routes requests of the 16 classes in a tight loop,
  timing each ``route`` call;
- another (the learner's work, as the daemon's background thread does it) saves the
  whole state as the policy file does (``snapshot`` under the engine's lock, JSON, an
  atomic write), absorbs a fleet batch of 400 events, and observes answered requests,
  over and over.

Prints route p50 / p99 / p99.9 / max in microseconds, with the same figures for a
quiet engine beside them. ``--code DIR`` runs another checkout's ``tuner`` package (a git
worktree of the commit before a change), so before and after are measured alike.

Usage: python benchmarks/route_latency.py [--seconds 20] [--code DIR] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HELP = ROOT / "tests" / "upstream" / "data" / "help-0c1e570.txt"
CLASSES = [
    f"{group}/{echo}/{sampling}"
    for group in ("code", "prose", "data", "other")
    for echo in ("echo", "fresh")
    for sampling in ("greedy", "sampled")
]
BATCH = 400  # events in one fleet batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--code", type=Path, help="the checkout whose tuner package runs")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.code.resolve() if args.code else ROOT))
    import structlog

    from benchmarks.common import emit

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # errors only

    with tempfile.TemporaryDirectory() as tmp:
        quiet = measure(Path(tmp) / "quiet", args.seconds / 4, busy=False)
        busy = measure(Path(tmp) / "busy", args.seconds, busy=True)
    import tuner

    result = {
        "code": str(args.code or ROOT),
        "tuner_file": tuner.__file__,
        "classes": len(CLASSES),
        "quiet": quiet,
        "busy": busy,
    }
    emit(result, args.out)
    return 0


def build(folder: Path, io: Any) -> Any:
    from tuner.tuning.config import load_tuning
    from tuner.tuning.runtime.engine import Engine
    from tuner.tuning.search.studies import StudyBook
    from tuner.tuning.variants import grid
    from tuner.upstream.capabilities import parse_capabilities

    folder.mkdir(parents=True)
    config = load_tuning()
    variants = grid(config.search, parse_capabilities(HELP.read_text()))
    book = StudyBook(folder / "studies.db", "bench", seed=3)
    return Engine(config, variants, book, io=io)


def answer(rng: random.Random, key: str, decision: Any, count: int) -> Any:
    """A simulated answer: speculation pays on echo classes, loses elsewhere."""
    from tuner.records import RequestRecord, Timings

    n = 64
    timings: dict[str, Any] = {"predicted_n": n, "prompt_n": 300, "prompt_ms": 900.0}
    speedup = 1.0
    if decision.variant != "none":
        drafted = 60
        accepted = rng.randint(30, 55) if "/echo/" in key else rng.randint(0, 15)
        speedup = n / (n - accepted + 0.45 * drafted)
        timings |= {"draft_n": drafted, "draft_n_accepted": accepted}
    tok_s = 60.0 * speedup * rng.lognormvariate(0.0, 0.04)
    timings |= {"predicted_ms": 1000 * n / tok_s, "predicted_per_second": tok_s}
    return RequestRecord(
        id=f"r{count}",
        ts=float(count),
        endpoint="/v1/completions",
        stream=False,
        status=200,
        proxy_ms=1.0,
        timings=Timings.model_validate(timings),
        class_key=key,
        variant=decision.variant,
        trial=decision.trial,
        role=decision.role,
    )


def warm(engine: Any, requests: int) -> None:
    rng = random.Random(7)
    for i in range(requests):
        key = CLASSES[i % len(CLASSES)]
        engine.observe(answer(rng, key, engine.route(key), i))


def fleet_batch(engine: Any, rng: random.Random) -> list[Any]:
    from tuner.tuning.evidence.counts import Counts
    from tuner.tuning.runtime.events import served

    names = sorted(engine.variants)
    return [
        served(
            rng.choice(CLASSES),
            rng.choice(names),
            60.0 * rng.uniform(0.8, 1.6),
            Counts(64, 40, rng.randint(10, 35)),
        )
        for _ in range(BATCH)
    ]


def save(engine: Any, path: Path) -> None:
    """What the policy file's writer does with the engine (``TuningService.save``)."""
    with engine.locked():
        classes = engine.snapshot()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"classes": classes}))
    os.replace(tmp, path)


def measure(folder: Path, seconds: float, *, busy: bool) -> dict[str, Any]:
    learner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tuning")
    engine = build(folder, io=lambda job: learner.submit(job))
    warm(engine, 1600)
    learner.submit(lambda: None).result()  # the warm-up's queued work is done
    stop = threading.Event()
    work = {"saves": 0, "batches": 0, "observed": 0}

    from tuner.tuning.policy.guard import Decision

    names = sorted(engine.variants)

    def learn() -> None:
        rng = random.Random(11)
        while not stop.is_set():
            save(engine, folder / "policies.json")
            work["saves"] += 1
            engine.absorb(fleet_batch(engine, rng))
            work["batches"] += 1
            for _ in range(16):  # answers of requests the loop routed
                key = rng.choice(CLASSES)
                decision = Decision(rng.choice(names), "exploit", policy_class=key)
                engine.observe(answer(rng, key, decision, 10_000 + work["observed"]))
                work["observed"] += 1

    background = threading.Thread(target=learn, daemon=True) if busy else None
    if background is not None:
        background.start()
    took: list[int] = []
    until = time.monotonic() + seconds
    i = 0
    while time.monotonic() < until:
        key = CLASSES[i % len(CLASSES)]
        start = time.perf_counter_ns()
        engine.route(key)
        took.append(time.perf_counter_ns() - start)
        i += 1
    stop.set()
    if background is not None:
        background.join()
    learner.shutdown(wait=True)
    took.sort()

    def q(p: float) -> float:
        return round(took[min(len(took) - 1, int(p * len(took)))] / 1000, 1)

    return {
        "routes": len(took),
        "route_us": {"p50": q(0.5), "p99": q(0.99), "p999": q(0.999), "max": q(1.0)},
        **({"work": work} if busy else {}),
    }


if __name__ == "__main__":
    raise SystemExit(main())
