"""ik_llama.cpp: slots per instance and flash attention, at 1 and 4 clients.

The pool runs each ik_llama.cpp instance with one slot: ``--parallel`` above 1 aborts the
pinned build in flash attention on Gemma 3. This measures what more slots would give with
flash attention off: the same prompts (128 greedy tokens, ``ngram-mod.match24.max16``'s
flags, context 32768, 2 threads) through each configuration, all at once from 1 and from 4
clients; total generated tokens per wall second, failed requests, and whether the server
survived::

    python -m benchmarks.ik_slots --prompts 24 --out benchmarks/results/ik_slots.json
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_llama_server
from tuner.settings import Settings
from tuner.upstream.launch import default_model_path
from tuner.upstream.provision import locate_llama_server
from tuner.workload import WorkloadItem, load_workload

CONFIGS = {
    "one slot (the pool's)": ["-np", "1"],
    "one slot, flash attention off": ["-np", "1", "-fa", "off"],
    "four slots, flash attention off": ["-np", "4", "-fa", "off"],
    "four slots": ["-np", "4"],
}
ARM = ["--spec-type", "ngram-mod", "--spec-ngram-size-n", "24", "--draft-max", "16"]
ARM += ["--draft-min", "12"]


def load(url: str, items: list[WorkloadItem], clients: int) -> dict[str, Any]:
    """Every item once, ``clients`` at a time."""
    queue, lock = list(items), threading.Lock()
    tokens, errors = [0], [0]

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            path, body = item.request()
            try:
                answer = httpx.post(
                    url + path, json={**body, "temperature": 0.0, "max_tokens": 128}, timeout=600
                )
                answer.raise_for_status()
            except httpx.HTTPError:
                with lock:
                    errors[0] += 1
                continue
            with lock:
                tokens[0] += answer.json()["timings"]["predicted_n"]

    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"tok_s": round(tokens[0] / (time.monotonic() - started), 1), "failed": errors[0]}


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/real.jsonl"))
    cli.add_argument("--prompts", type=int, default=24)
    cli.add_argument("--out", type=Path)
    args = cli.parse_args()
    settings = Settings(engine="ik_llama.cpp")
    binary = locate_llama_server(settings.llama_server, settings.cache_dir, engine="ik_llama.cpp")
    base = [str(binary), "-m", str(default_model_path()), "-c", "32768", "-t", "2"]
    base += ["--no-context-shift", "--threads-http", "16", *ARM]
    items = load_workload(args.workload)[: args.prompts]
    result: dict[str, Any] = {}
    for name, flags in CONFIGS.items():
        proc, url = start_llama_server([*base, *flags], timeout_s=120)
        try:
            result[name] = {f"{n} clients": load(url, items, n) for n in (1, 4)}
            result[name]["survived"] = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    emit(result, args.out)


if __name__ == "__main__":
    main()
