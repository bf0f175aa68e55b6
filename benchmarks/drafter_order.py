"""Does an n-gram type with a draft model behind it (``--spec-type ngram-simple,draft-simple``)
beat either alone? llama-server tries the n-gram drafter first and the model only where it
found nothing, so the mix pays where the model drafter pays alone.

Four llama-servers of one binary (none, the n-gram type, both, the draft alone); each prompt's
four requests run back to back, so the machine's drift hits all four alike. Ratios are the
geometric mean over prompts of each arm's decode speed over no speculation's::

    tuner derive-draft /tmp/draft.gguf --layers 0-17 --embedding q4_0
    awk 'NR % 5 == 1' benchmarks/workloads/real.jsonl > /tmp/real30.jsonl
    python -m benchmarks.drafter_order --draft /tmp/draft.gguf --workload /tmp/real30.jsonl
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_llama_server
from tuner.settings import Settings
from tuner.upstream.launch import default_model_path
from tuner.upstream.provision import locate_llama_server
from tuner.workload import load_workload

NGRAM = ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "16"]


def arms(draft: Path) -> dict[str, list[str]]:
    model = ["--spec-draft-model", str(draft), "--spec-draft-n-max", "3"]
    return {
        "none": [],
        "ngram-simple.n3.m16": ["--spec-type", "ngram-simple", *NGRAM],
        "ngram-simple.n3.m16+draft-simple.max3": [
            "--spec-type",
            "ngram-simple,draft-simple",
            *NGRAM,
            *model,
        ],
        "draft-simple.max3": ["--spec-type", "draft-simple", *model],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", type=Path, required=True, help="a draft GGUF for the target")
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--model", type=Path, help="target GGUF (default: Gemma 3 270M)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = args.model or default_model_path()
    base = [str(binary), "-m", str(model), "-c", "4096", "-t", "2", "-np", "1"]
    servers = {name: start_llama_server(base + extra) for name, extra in arms(args.draft).items()}
    speed: dict[str, list[tuple[str, float, int, int]]] = defaultdict(list)
    try:
        for item in load_workload(args.workload):
            path, body = item.request()
            body = {**body, "temperature": 0.0, "cache_prompt": False}  # greedy: same text
            for name, (_, url) in servers.items():
                t = httpx.post(url + path, json=body, timeout=600)
                got: dict[str, Any] = t.json()["timings"]
                kind = item.id.rsplit("-", 1)[0]
                speed[name].append((kind, got["predicted_per_second"], got.get("draft_n", 0),
                                    got.get("draft_n_accepted", 0)))  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
    result: dict[str, Any] = {}
    for name, rows in speed.items():
        logs: dict[str, list[float]] = defaultdict(list)
        for (kind, tok_s, _, _), (_, base_tok_s, _, _) in zip(rows, speed["none"], strict=True):
            logs[kind].append(math.log(tok_s / base_tok_s))
        every = [v for values in logs.values() for v in values]
        drafted = sum(r[2] for r in rows)
        result[name] = {
            "ratio": round(math.exp(sum(every) / len(every)), 3),
            "alpha": round(sum(r[3] for r in rows) / drafted, 3) if drafted else None,
            "by_kind": {k: round(math.exp(sum(v) / len(v)), 3) for k, v in logs.items()},
        }
    emit({"model": str(model), "draft": str(args.draft), "arms": result}, args.out)


if __name__ == "__main__":
    main()
