"""Two versions of the daemon's code side by side under concurrent clients.

Each daemon starts from the same policies (``tuner policies export``), imported into a fresh
state dir, with exploration off, so both serve the same per-class choices on the same
engine. N clients then send the same prompts of a workload (each client its own seeded
order), streaming, through one daemon at a time, the arms alternating A B B A ...; each
round is one daemon from its fresh import. Reports per arm: generated tokens over the wall
time, p50/p95 time to first token and latency, and from the daemon's records the requests
that waited at the CPU gate, how long, and those that joined the variant decoding.

Usage: python benchmarks/concurrent_ab.py --policies FILE --code-a DIR --code-b DIR
       [--workload benchmarks/workloads/fresh.jsonl] [--clients 4] [--requests 16]
       [--rounds 2] [--out FILE.json]
(``git worktree add DIR <commit>`` gives a version's code; its daemon runs from DIR. The
policies must be a file both versions read: an older one refuses class fields it lacks.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit, start_tuner  # noqa: E402
from tuner.records import read_records  # noqa: E402
from tuner.workload import WorkloadItem, load_workload  # noqa: E402


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3)


def _daemon(code: Path, state: Path, policies: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``tuner serve`` from ``code`` on a fresh state dir holding ``policies``, not exploring."""
    env = {**os.environ, "TUNER_LOG_FORMAT": "json", "TUNER_LOG_LEVEL": "warning"}
    env.setdefault("TUNER_ENGINE", "llama.cpp")
    tuning = (ROOT / "tuner" / "data" / "tuning.toml").read_text()
    frozen = state.parent / f"{state.name}-tuning.toml"
    off, found = re.subn(r"(?m)^explore_share = [0-9.]+", "explore_share = 0.0", tuning, count=1)
    if not found:
        raise SystemExit("the shipped tuning file has no explore_share to turn off")
    frozen.write_text(off)
    env["TUNER_TUNING_FILE"] = str(frozen)
    imports = ["policies", "import", str(policies), "--state-dir", str(state)]
    subprocess.run(
        [sys.executable, "-m", "tuner", *imports],
        cwd=code,
        env=env,
        check=True,
        capture_output=True,
    )
    return start_tuner(state, env, timeout_s=600, code=code)


async def _client(
    url: str, items: list[WorkloadItem], found: dict[str, list[float]], tokens: list[int]
) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        for item in items:
            path, body = item.request()
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
            started = time.perf_counter()
            first: float | None = None
            async with client.stream("POST", url + path, json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first is None:
                        first = time.perf_counter() - started
                    usage = json.loads(line.removeprefix("data: ")).get("usage")
                    if usage:
                        tokens.append(int(usage["completion_tokens"]))
            found["latency"].append(time.perf_counter() - started)
            found["ttft"].append(first if first is not None else time.perf_counter() - started)


def _round(
    code: Path, policies: Path, orders: list[list[WorkloadItem]], workdir: Path
) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="state-", dir=workdir))
    proc, url = _daemon(code, state, policies)
    found: dict[str, list[float]] = {"latency": [], "ttft": []}
    tokens: list[int] = []
    try:
        started, wall = time.time(), time.perf_counter()

        async def clients() -> None:
            await asyncio.gather(*(_client(url, items, found, tokens) for items in orders))

        asyncio.run(clients())
        wall = time.perf_counter() - wall
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    records = [r for r in read_records(state / "records") if r.ts >= started]
    waits = [r.wait_ms / 1000 for r in records if r.wait_ms is not None and r.wait_ms >= 1]
    return {
        "wall_s": round(wall, 2),
        "tokens": sum(tokens),
        "tok_s": round(sum(tokens) / wall, 2),
        "ttft_p50_s": _quantile(found["ttft"], 0.5),
        "ttft_p95_s": _quantile(found["ttft"], 0.95),
        "latency_p95_s": _quantile(found["latency"], 0.95),
        "waited": len(waits),
        "wait_s": round(sum(waits), 2),
        "joined": sum(r.role == "joined" for r in records),
        "served": dict(Counter(f"{r.role}:{r.variant}" for r in records)),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    items = [i for i in load_workload(args.workload) if i.prompt or i.messages]
    orders = []
    for client in range(args.clients):  # each client its own order, the same in every round
        rng = random.Random(args.seed + client)
        orders.append([rng.choice(items) for _ in range(args.requests)])
    arms = {"a": Path(args.code_a).resolve(), "b": Path(args.code_b).resolve()}
    sequence = [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(args.rounds)]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="concurrent-ab-") as workdir:
        for pair in sequence:
            for arm in pair:
                found = _round(arms[arm], Path(args.policies), orders, Path(workdir))
                rounds.append({"arm": arm, **found})
                print(json.dumps(rounds[-1]), file=sys.stderr)
    summary: dict[str, Any] = {}
    for arm in arms:
        mine = [r for r in rounds if r["arm"] == arm]
        summary[arm] = {
            key: round(statistics.fmean(float(r[key] or 0) for r in mine), 3)
            for key in ("tok_s", "ttft_p50_s", "ttft_p95_s", "latency_p95_s", "wait_s", "joined")
        }
    pairs = [
        (rounds[i], rounds[i + 1]) for i in range(0, len(rounds), 2)
    ]  # one a and one b per round pair
    ratios = []
    for first, second in pairs:
        a, b = (first, second) if first["arm"] == "a" else (second, first)
        ratios.append(round(b["tok_s"] / a["tok_s"], 3))
    return {
        "command": " ".join(sys.argv),
        "code": {k: str(v) for k, v in arms.items()},
        "clients": args.clients,
        "requests_per_client": args.requests,
        "rounds": rounds,
        "arms": summary,
        "b_over_a_tok_s": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", required=True, help="a `tuner policies export` file")
    parser.add_argument("--code-a", required=True)
    parser.add_argument("--code-b", required=True)
    parser.add_argument("--workload", type=Path, default=ROOT / "benchmarks/workloads/fresh.jsonl")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16, help="per client and round")
    parser.add_argument("--rounds", type=int, default=2, help="A B pairs, alternating order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit(run(args), args.out)


if __name__ == "__main__":
    main()
