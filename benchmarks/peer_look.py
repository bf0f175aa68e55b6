"""A first look at the peer: ik_llama.cpp's llama-server with ``--spec-autotune`` against its
own defaults and against this project's llama-server with llama.cpp's defaults.

Each arm is one llama-server (one slot, greedy); each prompt's requests run back to back, so
the machine's drift hits every arm alike. Each arm's ratio is over its own binary's run
without speculation (geometric mean over prompts), so two binaries compare fairly::

    bash benchmarks/peers/build_ik_llama.sh ~/src/ik_llama.cpp
    awk 'NR % 5 == 1' benchmarks/workloads/real.jsonl > /tmp/real30.jsonl
    LD_LIBRARY_PATH=~/.cache/spec-tuner/peers/ik_llama.cpp python -m benchmarks.peer_look \\
        --peer ~/.cache/spec-tuner/peers/ik_llama.cpp/llama-server --workload /tmp/real30.jsonl

Not the tuner: ``tuner bench`` runs it (an external-server arm there is #56's item 5).
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


def arms(ours: Path, peer: Path) -> dict[str, tuple[Path, list[str]]]:
    return {
        "ours:none": (ours, []),
        "ours:ngram-simple": (ours, ["--spec-type", "ngram-simple"]),
        "ours:ngram-mod": (ours, ["--spec-type", "ngram-mod"]),
        "peer:none": (peer, []),
        "peer:ngram-simple": (peer, ["--spec-type", "ngram-simple"]),
        "peer:ngram-simple+autotune": (peer, ["--spec-type", "ngram-simple", "--spec-autotune"]),
        "peer:ngram-mod+autotune": (peer, ["--spec-type", "ngram-mod", "--spec-autotune"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", type=Path, required=True, help="ik_llama.cpp's llama-server")
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--prompts", type=int, help="only the first N prompts")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings()
    ours = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = default_model_path()
    common = ["-m", str(model), "-c", "4096", "-t", "2", "-np", "1"]
    servers = {
        name: start_llama_server([str(binary), *common, *extra], timeout_s=120)
        for name, (binary, extra) in arms(ours, args.peer).items()
    }
    rows: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    try:
        for item in load_workload(args.workload)[: args.prompts]:
            path, body = item.request()
            body = {**body, "temperature": 0.0}
            for name, (_, url) in servers.items():
                answer = httpx.post(url + path, json=body, timeout=600).json()
                got: dict[str, Any] = answer["timings"]
                rows[name].append((got["predicted_per_second"], got.get("draft_n", 0),
                                   got.get("draft_n_accepted", 0)))  # fmt: skip
    finally:
        for proc, _ in servers.values():
            proc.terminate()
    result: dict[str, Any] = {}
    for name, values in rows.items():
        base = rows[name.split(":")[0] + ":none"]
        logs = [math.log(v[0] / b[0]) for v, b in zip(values, base, strict=True)]
        drafted = sum(v[1] for v in values)
        result[name] = {
            "ratio_to_own_none": round(math.exp(sum(logs) / len(logs)), 3),
            "tok_s": round(sum(v[0] for v in values) / len(values), 1),
            "alpha": round(sum(v[2] for v in values) / drafted, 3) if drafted else None,
        }
    emit({"prompts": len(rows["ours:none"]), "arms": result}, args.out)


if __name__ == "__main__":
    main()
