"""One variant at a time on the real llama-server: reloads, windows and the chosen variant.

Starts ``tuner serve`` on the default model with ``TUNER_MAX_INSTANCES=1`` (the router
holds one instance, as with a large model on one GPU), replays a workload's prompts in
order for ``--requests`` requests, and reports from the daemon's policy file and request
records: the active variant and its gain over the traffic mix, the reload it measured,
switches and exploration windows, how many requests needed a reload (the variant
changed from the previous request), and decode speed per variant.

Usage: python benchmarks/one_variant.py [--workload F] [--requests 150] [--max-tokens 64]
       [--explore-share 0.2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from benchmarks.proxy_overhead import start_daemon  # noqa: E402
from tuner.records import read_records  # noqa: E402
from tuner.workload import load_workload  # noqa: E402


def run(workload: Path, requests: int, max_tokens: int, share: float) -> dict[str, Any]:
    items = load_workload(workload)
    state = Path(tempfile.mkdtemp(prefix="bench-one-variant-"))
    os.environ |= {"TUNER_MAX_INSTANCES": "1", "TUNER_EXPLORE_SHARE": str(share),
                   "TUNER_SEED": "0"}  # fmt: skip
    proc, proxy, _ = start_daemon(state)
    started = time.monotonic()
    try:
        with httpx.Client(timeout=600) as client:
            for n in range(requests):
                path, body = items[n % len(items)].request(max_tokens)
                client.post(proxy + path, json=body).raise_for_status()
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    wall = time.monotonic() - started
    single = json.loads((state / "policies.json").read_text())["single"]
    records = [r for r in read_records(state / "records") if r.status == 200 and not r.replay]
    reloads = sum(a.variant != b.variant for a, b in itertools.pairwise(records))
    speeds: dict[str, list[float]] = {}
    for r in records:
        if r.timings and r.timings.predicted_per_second and r.variant:
            speeds.setdefault(r.variant, []).append(r.timings.predicted_per_second)
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "workload": str(workload),
        "requests": len(records),
        "wall_s": round(wall, 1),
        "requests_after_a_variant_change": reloads,
        "single": single,
        "roles": {
            role: sum(r.role == role for r in records) for role in ("exploit", "trial", "control")
        },
        "decode_tok_s": {
            v: {"requests": len(s), "median": round(statistics.median(s), 1)}
            for v, s in sorted(speeds.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path,
                        default=ROOT / "benchmarks" / "workloads" / "dev.jsonl")  # fmt: skip
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--explore-share", type=float, default=0.2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit(run(args.workload, args.requests, args.max_tokens, args.explore_share), args.out)


if __name__ == "__main__":
    main()
