"""Proxy overhead: the same llama-server, directly and through spec-tuner, interleaved.

Starts ``tuner serve`` on the default model (it manages its own llama-server),
then sends each workload prompt to llama-server directly and through the proxy,
alternating which goes first, for several rounds. Reports, side by side in one
run:

- decode throughput ratio, proxied / direct (client-side tokens per wall second,
  and llama-server's own ``predicted_per_second``), target >= 0.99. Both arms
  send ``cache_prompt: false`` so neither profits from the other's prompt cache;
- median added latency per non-streaming request, paired, on short requests
  (a few prompt tokens, ``max_tokens`` 1) where generation noise is smallest,
  target <= 2 ms;
- the proxy's own overhead from its request records (``overhead_ms``: ``proxy_ms -
  upstream_ms``, less any wait for a variant's turn).

Usage: python benchmarks/proxy_overhead.py [--workload FILE] [--rounds N] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
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
from tuner.records import read_records  # noqa: E402
from tuner.upstream.process import free_port  # noqa: E402

DEFAULT_WORKLOAD = ROOT.parent / "shared" / "workloads" / "dev.jsonl"


def start_daemon(state: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    port = free_port()
    env = {**os.environ, "TUNER_LOG_FORMAT": "json", "TUNER_LOG_LEVEL": "warning"}
    with (state / "daemon.log").open("wb") as sink:
        argv = [
            sys.executable,
            "-m",
            "tuner",
            "serve",
            "--port",
            str(port),
            "--state-dir",
            str(state),
        ]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=sink, env=env)
    proxy = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        try:
            if httpx.get(proxy + "/ready", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"daemon exited: {(state / 'daemon.log').read_text()[-2000:]}")
        time.sleep(0.25)
    child = next(c for c in psutil.Process(proc.pid).children() if "llama-server" in c.name())
    cmd = child.cmdline()
    direct = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    return proc, proxy, direct


def timed_post(
    client: httpx.Client, url: str, body: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = client.post(url, json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return elapsed, response.json()


def run(workload: Path, rounds: int) -> dict[str, Any]:
    prompts = [json.loads(line) for line in workload.read_text().splitlines() if line.strip()]
    state = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    proc, proxy, direct = start_daemon(state)
    arms: dict[str, dict[str, list[float]]] = {
        a: {"wall": [], "tokens": [], "tps": []} for a in ("direct", "proxy")
    }
    short: dict[str, list[float]] = {"direct": [], "proxy": []}
    try:
        with httpx.Client(timeout=300) as client:
            for r in range(rounds):
                for i, row in enumerate(prompts):
                    body = {
                        "prompt": row["prompt"],
                        "max_tokens": row.get("max_tokens", 128),
                        "temperature": row.get("temperature", 0),
                        "cache_prompt": False,
                    }
                    order = ("direct", "proxy") if (r + i) % 2 == 0 else ("proxy", "direct")
                    for arm in order:
                        base = direct if arm == "direct" else proxy
                        wall, data = timed_post(client, base + "/v1/completions", body)
                        arms[arm]["wall"].append(wall)
                        arms[arm]["tokens"].append(data["timings"]["predicted_n"])
                        arms[arm]["tps"].append(data["timings"]["predicted_per_second"])
                    # Short requests: the added latency stands out from the noise.
                    tiny = {**body, "prompt": row["prompt"][:24], "max_tokens": 1}
                    for _ in range(4):
                        for arm in order:
                            base = direct if arm == "direct" else proxy
                            url = base + "/v1/completions"
                            short[arm].append(timed_post(client, url, tiny)[0])
                print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    overhead = [
        rec.overhead_ms
        for rec in read_records(state / "records")
        if rec.overhead_ms is not None and rec.status == 200
    ]
    tput = {a: sum(v["tokens"]) / sum(v["wall"]) for a, v in arms.items()}
    added = [(p - d) * 1000 for p, d in zip(short["proxy"], short["direct"], strict=True)]
    return {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "workload": str(workload.name),
        "requests_per_arm": len(arms["direct"]["wall"]),
        "throughput_tok_s": {a: round(v, 2) for a, v in tput.items()},
        "throughput_ratio": round(tput["proxy"] / tput["direct"], 4),
        "server_tps_ratio": round(
            statistics.mean(arms["proxy"]["tps"]) / statistics.mean(arms["direct"]["tps"]), 4
        ),
        "short_request_ms_median": {
            a: round(statistics.median(v) * 1000, 3) for a, v in short.items()
        },
        "added_latency_ms_median": round(statistics.median(added), 3),
        "proxy_internal_overhead_ms": {
            "median": round(statistics.median(overhead), 3),
            "p99": round(sorted(overhead)[int(0.99 * (len(overhead) - 1))], 3),
            "n": len(overhead),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.workload, args.rounds)
    emit(result, args.out)


if __name__ == "__main__":
    main()
