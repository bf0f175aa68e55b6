"""Train a fleet's shared storage: one real daemon on ``TUNER_STORAGE_URL`` serves a
workload's prompts once each, in a seeded order, then stops (it writes what it learned).

The warm-start bench of ``docs/benchmarks.md`` runs this first, on other prompts of the same
kind of traffic, then ``tuner bench --challenger ... --challenger-env TUNER_STORAGE_URL=URL``:
a daemon that joins the trained fleet beside a cold one.

    TUNER_STORAGE_URL=postgresql://... python -m benchmarks.fleet_train \
        --workload benchmarks/workloads/fresh1040.jsonl --every 4 --seed 7 --out /tmp/train
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from pathlib import Path

import httpx

from tuner.bench.daemons import BenchOptions, Quiet, tuner_daemon
from tuner.bench.schedule import TUNER
from tuner.settings import Settings
from tuner.upstream.launch import prepare
from tuner.upstream.provision import stderr_progress
from tuner.workload import load_workload


async def train(workload: Path, every: int, seed: int, out: Path) -> None:
    settings = Settings()
    if not settings.storage_url:
        raise SystemExit("set TUNER_STORAGE_URL: the storage to train")
    items = load_workload(workload)[::every]
    random.Random(seed).shuffle(items)
    prepared = prepare(settings, stderr_progress)
    options = BenchOptions(out=out, seed=seed)
    started = time.monotonic()
    async with (
        tuner_daemon(settings, prepared, options, out) as url,
        httpx.AsyncClient(timeout=600) as http,
    ):
        quiet = Quiet(http, {TUNER: url})
        for n, item in enumerate(items, 1):
            path, body = item.request(None)
            response = await http.post(url + path, json=body)
            response.raise_for_status()
            await quiet.wait(TUNER)
            if n % 20 == 0:
                print(f"{n}/{len(items)} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(f"trained on {len(items)} requests in {time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--every", type=int, default=1, help="use every Nth prompt")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("fleet-train"))
    args = parser.parse_args()
    os.environ.setdefault("TUNER_LOG_FORMAT", "json")
    asyncio.run(train(args.workload, args.every, args.seed, args.out))


if __name__ == "__main__":
    main()
