"""How fast identical llama-server processes decode the same requests, and whether that moves.

Starts ``--processes`` llama-server processes with the same arguments (the default model,
no speculation, ``--ctx-size 4096``, as the bench's ``none`` instances), then for
``--rounds`` rounds sends every process the same greedy prompt, one process at a time in a
rotating order, and reads ``timings.predicted_ms / predicted_n``. Reports per process and
per quarter of the rounds its mean decode time per token over all processes' mean in that
quarter (``spread``): 1.00 everywhere means the processes are interchangeable, and a bench
comparing one process's arm with another's compares like with like. No speculation, no
proxy, no daemon: what is left is the processes themselves on this machine.

``--idle N`` starts N more processes with the same arguments that get one warm-up request
and nothing after, as a bench's router keeps loaded instances that its daemon has moved
away from: whether processes that are only resident move the measured ones' speed or their
spread. ``ms_per_token_by_quarter`` (all measured processes' mean per quarter) compares
one run's absolute speed with another's on the same machine.

Usage: python -m benchmarks.process_spread [--processes 3] [--rounds 40] [--max-tokens 96]
       [--idle 0] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_llama_server
from tuner.model.profile import hardware_fingerprint
from tuner.settings import Settings
from tuner.upstream.launch import resolve_model
from tuner.upstream.provision import locate_llama_server

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _part_means(ms_per_token: Sequence[Sequence[float]], parts: int) -> list[list[float]]:
    """Per part of the rounds (``parts`` equal stretches; an empty one left out), each
    process's mean time per token in it."""
    rounds = min(len(p) for p in ms_per_token)
    cuts = [rounds * part // parts for part in range(parts + 1)]
    return [
        [statistics.fmean(p[lo:hi]) for p in ms_per_token] for lo, hi in pairwise(cuts) if hi > lo
    ]


def spread(ms_per_token: Sequence[Sequence[float]], parts: int = 4) -> list[list[float]]:
    """Per process, per part of the rounds: its mean time per token over every process's
    mean in that part (rounds split into ``parts`` equal stretches). Pure."""
    out: list[list[float]] = [[] for _ in ms_per_token]
    for means in _part_means(ms_per_token, parts):
        overall = statistics.fmean(means)
        for mine, mean in zip(out, means, strict=True):
            mine.append(round(mean / overall, 3))
    return out


def quarter_means(ms_per_token: Sequence[Sequence[float]], parts: int = 4) -> list[float]:
    """Per part of the rounds, every process's mean time per token in it, averaged. Pure."""
    return [round(statistics.fmean(means), 3) for means in _part_means(ms_per_token, parts)]


def run(processes: int, rounds: int, max_tokens: int, idle: int = 0) -> dict[str, Any]:
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir, build=False)
    model, _ = resolve_model(settings)
    logs = Path(tempfile.mkdtemp(prefix="process-spread-"))
    argv = [str(binary), "--spec-type", "none", "--no-webui", "--ctx-size", "4096",
            "--model", str(model)]  # fmt: skip
    body = {"prompt": PROMPT, "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": False}
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    times: list[list[float]] = [[] for _ in range(processes)]
    try:
        for n in range(processes + idle):
            with (logs / f"{n}.log").open("wb") as log:
                started.append(start_llama_server(argv, log=log, timeout_s=180))
        with httpx.Client(timeout=600) as client:
            for _, url in started:  # one warm-up request each, not counted
                client.post(f"{url}/completion", json=body).raise_for_status()
            for r in range(rounds):
                for k in range(processes):
                    n = (r + k) % processes  # rotate who goes first
                    found = client.post(f"{started[n][1]}/completion", json=body)
                    found.raise_for_status()
                    timings = found.json()["timings"]
                    times[n].append(float(timings["predicted_ms"]) / int(timings["predicted_n"]))
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            proc.wait(timeout=60)
    return {
        "hardware": hardware_fingerprint(),
        "processes": processes,
        "idle": idle,
        "rounds": rounds,
        "max_tokens": max_tokens,
        "ms_per_token": [round(statistics.fmean(t), 3) for t in times],
        "ms_per_token_by_quarter": quarter_means(times),
        "spread_by_quarter": spread(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--idle", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.processes < 2 or args.rounds < 4 or args.max_tokens < 1 or args.idle < 0:
        parser.error("need --processes >= 2, --rounds >= 4, --max-tokens >= 1, --idle >= 0")
    emit(run(args.processes, args.rounds, args.max_tokens, args.idle), args.out)


if __name__ == "__main__":
    main()
