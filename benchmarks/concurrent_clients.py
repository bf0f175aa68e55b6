"""Clients at once through the daemon: a daemon pinned to one variant on an engine, the same
prompts sent one after another and in groups of ``--clients`` at once, the two ways in
alternating rounds; generated tokens over the wall time each way.

    python -m benchmarks.concurrent_clients --engine ik_llama.cpp --clients 4 --out FILE
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_tuner
from tuner.workload import load_workload

Request = tuple[str, dict[str, Any]]  # path, body


async def _generated(http: httpx.AsyncClient, request: Request) -> int:
    path, body = request
    answer = (await http.post(path, json=body)).json()
    return int(answer["usage"]["completion_tokens"])


async def _round(http: httpx.AsyncClient, bodies: list[Request], clients: int) -> float:
    """Every body, ``clients`` at once (1: one after another); tokens per wall second."""
    began, tokens = time.perf_counter(), 0
    for start in range(0, len(bodies), clients):
        group = bodies[start : start + clients]
        tokens += sum(await asyncio.gather(*(_generated(http, b) for b in group)))
    return tokens / (time.perf_counter() - began)


async def measure(url: str, bodies: list[Request], clients: int, rounds: int) -> dict[str, Any]:
    alone: list[float] = []
    together: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        await _generated(http, (bodies[0][0], {**bodies[0][1], "max_tokens": 4}))  # warm
        for r in range(rounds):  # alternating, so that drift falls on both
            for way in (1, clients) if r % 2 == 0 else (clients, 1):
                (alone if way == 1 else together).append(await _round(http, bodies, way))
    one, many = sum(alone) / len(alone), sum(together) / len(together)
    return {
        "alone_tok_s": [round(x, 1) for x in alone],
        "together_tok_s": [round(x, 1) for x in together],
        "together_over_alone": round(many / one, 3),
    }


def run(
    engine: str, variant: str, workload: Path, prompts: int, clients: int, rounds: int
) -> dict[str, Any]:
    items = load_workload(workload)[:prompts]
    bodies = []
    for item in items:
        path, body = item.request()
        max_tokens = min(int(body.get("max_tokens") or 96), 96)
        bodies.append((path, {**body, "model": "x", "max_tokens": max_tokens, "temperature": 0.0}))
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "tuning.toml").write_text(f'[overrides.all]\npin = "{variant}"\n')
        env = {"TUNER_ENGINE": engine, "TUNER_TUNING_FILE": str(state / "tuning.toml")}
        daemon, url = start_tuner(state, env)
        try:
            found = asyncio.run(measure(url, bodies, clients, rounds))
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    return {
        "engine": engine,
        "variant": variant,
        "prompts": len(bodies),
        "clients": clients,
        **found,
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--engine", choices=("llama.cpp", "ik_llama.cpp"), default="ik_llama.cpp")
    cli.add_argument("--variant", default="ngram-simple.n3.m16")
    cli.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/real.jsonl"))
    cli.add_argument("--prompts", type=int, default=16)
    cli.add_argument("--clients", type=int, default=4)
    cli.add_argument("--rounds", type=int, default=4)
    cli.add_argument("--out", type=Path)
    args = cli.parse_args()
    result = run(args.engine, args.variant, args.workload, args.prompts, args.clients, args.rounds)
    emit(result, args.out)


if __name__ == "__main__":
    main()
