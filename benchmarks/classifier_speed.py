"""Classifier speed and memory: p99 per prompt size, and peak memory against chat history.

Targets (issue 4): p99 <= 0.5 ms for an 8 KB prompt, <= 5 ms for a 128 KB prompt, on this
machine; memory independent of history. Prompts mix code and prose like real traffic.
Usage: python benchmarks/classifier_speed.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from tuner.classify import classify, load_definitions  # noqa: E402

CODE = (
    "def summarize(items):\n    total = 0\n    for item in items:\n        if item.price > 0:\n"
    "            total += item.price * item.quantity\n        else:\n"
    "            total -= item.discount\n    return total\n\n"
)
PROSE = (
    "The council met on Tuesday to discuss the new bicycle lanes on Main Street. Council "
    "member Rivera said the lanes reduced accidents by 18 percent in the first year. "
)


def prompt_of(size: int) -> str:
    head = "Rewrite the code below with total renamed to acc, keeping everything else.\n\n"
    body = ""
    while len(body) < size:
        body += CODE + PROSE
    return head + body[: size - len(head)]


def timings(body: dict[str, Any], runs: int) -> dict[str, float]:
    definitions = load_definitions()
    for _ in range(20):  # warm caches, compile regexes
        classify(body, definitions)
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        classify(body, definitions)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 4),
        "p99_ms": round(samples[int(0.99 * (len(samples) - 1))], 4),
        "max_ms": round(samples[-1], 4),
        "runs": runs,
    }


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def machine_jitter(target_ms: float, runs: int) -> dict[str, float]:
    """The same percentiles for a fixed pure-Python loop of about the classifier's median.

    What this VM does to a constant amount of work: its p99 / p50 is the floor for the
    classifier's own ratio, whatever the code does.
    """
    n = 1000
    start = time.perf_counter_ns()
    _spin(n)
    per = (time.perf_counter_ns() - start) / 1e6 / n
    n = max(int(target_ms / per), 1)
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        _spin(n)
        samples.append((time.perf_counter_ns() - start) / 1e6)
    samples.sort()
    p50, p99 = statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]
    return {"p50_ms": round(p50, 4), "p99_ms": round(p99, 4), "p99_over_p50": round(p99 / p50, 2)}


def peak_memory_kib(messages: int) -> float:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": PROSE * 8}
        for i in range(messages)
    ]
    body = {"messages": history, "temperature": 0}
    definitions = load_definitions()
    classify(body, definitions)
    tracemalloc.start()
    classify(body, definitions)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return round(peak / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "prompt_8kb": timings({"prompt": prompt_of(8 * 1024), "temperature": 0}, 3000),
        "prompt_128kb": timings({"prompt": prompt_of(128 * 1024), "temperature": 0}, 400),
        "chat_8kb": timings({"messages": [{"role": "user", "content": prompt_of(8 * 1024)}]}, 3000),
    }
    result["machine_jitter"] = machine_jitter(result["prompt_8kb"]["p50_ms"], 3000)
    result |= {
        "peak_memory_kib_by_history_messages": {
            str(n): peak_memory_kib(n) for n in (10, 100, 1000, 10000)
        },
        "history_bytes": {str(n): n * len(PROSE * 8) for n in (10, 100, 1000, 10000)},
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
