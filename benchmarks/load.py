"""Load: 32 concurrent streaming clients for 60 s through the daemon on the real llama-server.

Starts ``tuner serve`` on the default model (tuning on, as users run it), then runs N
client tasks that each send streaming chat completions back to back for the duration.
Reports:

- requests, errors (non-200, an error event, a stream without ``[DONE]``), 429s;
- the daemon's open file descriptors and TCP connections before the load and after it
  (settled), to catch leaks;
- the proxy's added latency under load from its request records (``overhead_ms``: time
  in the proxy around the upstream call, queueing excluded), how long requests waited for
  their variant's turn (``wait_ms``, exclusive variants), and the client's time to first token.

Usage: python benchmarks/load.py [--clients 32] [--seconds 60] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import emit  # noqa: E402
from benchmarks.proxy_overhead import start_daemon  # noqa: E402
from tuner.records import read_records  # noqa: E402

PROMPTS = [
    "Rename x to count in: def f(x):\n    return x + 1",
    "Write one sentence about the sea.",
    "List three prime numbers.",
    'Extract the name as JSON: "Ada Lovelace wrote the first program."',
]


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 3)


def _resources(pid: int) -> dict[str, int]:
    proc = psutil.Process(pid)
    return {
        "fds": proc.num_fds(),
        "tcp": len(proc.net_connections(kind="tcp")),
        "children": len(proc.children(recursive=True)),
    }


async def _client(
    url: str, index: int, until: float, out: dict[str, Any], ttft: list[float]
) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        n = 0
        while time.monotonic() < until:
            body = {
                "messages": [{"role": "user", "content": PROMPTS[(index + n) % len(PROMPTS)]}],
                "max_tokens": 16,
                "temperature": 0.7,
                "seed": index * 1000 + n,
                "stream": True,
            }
            n += 1
            start = time.perf_counter()
            first: float | None = None
            try:
                async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    if r.status_code != 200:
                        out["status"][r.status_code] = out["status"].get(r.status_code, 0) + 1
                        text = (await r.aread()).decode(errors="replace")[:300]
                        if len(out["bodies"]) < 5:
                            out["bodies"].append(f"{r.status_code}: {text}")
                        continue
                    done = False
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and first is None:
                            first = time.perf_counter() - start
                        if line.startswith('data: {"error"'):
                            out["error_events"] += 1
                        done |= line == "data: [DONE]"
                    out["ok" if done else "truncated"] += 1
                    if first is not None:
                        ttft.append(first * 1000)
            except httpx.HTTPError as exc:
                out["transport"].append(type(exc).__name__)


async def _load(url: str, clients: int, seconds: float) -> tuple[dict[str, Any], list[float]]:
    out: dict[str, Any] = {
        "ok": 0,
        "truncated": 0,
        "error_events": 0,
        "status": {},
        "transport": [],
        "bodies": [],
    }
    ttft: list[float] = []
    until = time.monotonic() + seconds
    await asyncio.gather(*(_client(url, i, until, out, ttft) for i in range(clients)))
    return out, ttft


def run(clients: int, seconds: float) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="bench-load-"))
    proc, proxy, _ = start_daemon(state)
    try:
        warm = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        httpx.post(proxy + "/v1/chat/completions", json=warm, timeout=120)
        time.sleep(1)
        before = _resources(proc.pid)
        started = time.time()
        wall = time.monotonic()
        counts, ttft = asyncio.run(_load(proxy, clients, seconds))
        wall = time.monotonic() - wall
        time.sleep(3)  # let keep-alive connections close and records flush
        after = _resources(proc.pid)
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    records = [r for r in read_records(state / "records") if r.ts >= started]
    added = [r.overhead_ms for r in records if r.overhead_ms is not None and r.stream]
    waits = [r.wait_ms for r in records if r.wait_ms is not None]
    errors = (
        sum(v for k, v in counts["status"].items() if k != 429)
        + counts["truncated"]
        + counts["error_events"]
        + len(counts["transport"])
    )
    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "clients": clients,
        "seconds": round(wall, 1),
        "requests_ok": counts["ok"],
        "requests_per_s": round(counts["ok"] / wall, 2),
        "errors": errors,
        "refused_429": counts["status"].get(429, 0),
        "detail": counts,
        "daemon_alive_after": alive,
        "daemon_exit_code": code,
        "resources_before": before,
        "resources_after": after,
        "records": len(records),
        "proxy_added_ms": {
            "p50": _quantile(added, 0.5),
            "p99": _quantile(added, 0.99),
            "mean": round(statistics.fmean(added), 3) if added else None,
        },
        "variant_wait_ms": {
            "p50": _quantile(waits, 0.5),
            "p99": _quantile(waits, 0.99),
            "waited": sum(1 for w in waits if w > 1),
        },
        "client_ttft_ms": {"p50": _quantile(ttft, 0.5), "p99": _quantile(ttft, 0.99)},
        "variants": sorted({r.variant or "-" for r in records}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    emit(run(args.clients, args.seconds), args.out)


if __name__ == "__main__":
    main()
