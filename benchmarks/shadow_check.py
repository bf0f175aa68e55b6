"""Does the replay of ``ngram-simple`` (``tuner.tuning.replay.drafters``) give the server's counts?

For each variant, one llama-server with that variant; each workload prompt (chat ones
through the server's own template) decodes ``--max-tokens`` with ``return_tokens``; the
replay of its prompt and output token ids must give the drafted and accepted counts the
server reported in ``timings``. Also replayed: the output as the daemon sees it (text,
tokenized again), and the variants the request did not run (from the ``none`` server's
output: the variant-independence the daemon relies on, greedy).

    python benchmarks/shadow_check.py --out benchmarks/results/shadow_check.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_llama_server
from tuner.settings import Settings
from tuner.tuning.replay.drafters import replay_simple
from tuner.upstream.launch import default_model_path
from tuner.upstream.provision import locate_llama_server
from tuner.workload import load_workload

VARIANTS = [(3, 16), (12, 48), (6, 8), (3, 48)]


def simple_flags(size: tuple[int, int] | None) -> list[str]:
    if size is None:
        return []
    return [
        "--spec-type",
        "ngram-simple",
        "--spec-ngram-simple-size-n",
        str(size[0]),
        "--spec-ngram-simple-size-m",
        str(size[1]),
    ]


def start(
    binary: Path, model: Path, flags: list[str], slots: int = 1
) -> tuple[subprocess.Popen[bytes], str]:
    """One llama-server with the given flags and ``slots`` slots (1: one drafter state)."""
    return start_llama_server(
        [
            str(binary),
            "-m",
            str(model),
            "-t",
            "2",
            "-c",
            str(4096 * slots),
            "-np",
            str(slots),
            "--no-webui",
            *flags,
        ]
    )


def tokens(client: httpx.Client, url: str, text: str, special: bool) -> list[int]:
    body = {"content": text, "add_special": special, "parse_special": special}
    return list(client.post(url + "/tokenize", json=body).json()["tokens"])


def run(
    client: httpx.Client,
    url: str,
    item: dict[str, Any],
    max_tokens: int,
    temperature: float | None,
    cache_prompt: bool = False,
) -> dict[str, Any]:
    """One request; ``temperature`` None: the item's own (and its seed), as the bench sends."""
    if "messages" in item:
        prompt = client.post(url + "/apply-template", json={"messages": item["messages"]}).json()[
            "prompt"
        ]
    else:
        prompt = item["prompt"]
    sampling = (
        {"temperature": item.get("temperature", 0.0), "seed": item.get("seed", 1)}
        if temperature is None
        else {"temperature": temperature, "seed": 1}
    )
    body = {
        "prompt": prompt,
        "n_predict": max_tokens,
        "return_tokens": True,
        "cache_prompt": cache_prompt,
        **sampling,
    }
    reply = client.post(url + "/completion", json=body, timeout=300).json()
    t = reply["timings"]
    return {
        "id": item["id"],
        "prompt": tokens(client, url, prompt, True),
        "output": list(reply["tokens"]),
        "retokenized": tokens(client, url, reply["content"], False),
        "drafted": t.get("draft_n", 0),
        "accepted": t.get("draft_n_accepted", 0),
    }


def answers(
    binary: Path,
    model: Path,
    servers: dict[str, list[str]],
    items: list[dict[str, Any]],
    max_tokens: int,
    temperature: float | None,
    *,
    slots: int = 1,
    cache_prompt: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Each server (name -> its flags), one after another, answers ``items`` in order."""
    runs: dict[str, list[dict[str, Any]]] = {}
    with httpx.Client(timeout=60) as client:
        for name, flags in servers.items():
            proc, url = start(binary, model, flags, slots)
            try:
                runs[name] = [
                    run(client, url, item, max_tokens, temperature, cache_prompt) for item in items
                ]
            finally:
                proc.terminate()
                proc.wait()
            print(name, "done", file=sys.stderr)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/dev.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = default_model_path()
    items = [i.model_dump(exclude_none=True) for i in load_workload(args.workload)]
    servers = {
        "none" if size is None else f"ngram-simple.n{size[0]}.m{size[1]}": simple_flags(size)
        for size in [None, *VARIANTS]
    }
    runs = answers(binary, model, servers, items, args.max_tokens, args.temperature)
    result: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "prompts": len(items),
        "variants": {},
    }
    base = {r["id"]: r for r in runs["none"]}
    retok_same = sum(r["output"] == r["retokenized"] for r in runs["none"])
    for n, m in VARIANTS:
        name = f"ngram-simple.n{n}.m{m}"
        exact = from_text = from_none = 0
        server = [0, 0]
        replayed = [0, 0]
        replayed_none = [0, 0]
        misses = []
        for r in runs[name]:
            d, a = replay_simple(r["prompt"], r["output"], n, m, args.max_tokens)
            dt, at = replay_simple(r["prompt"], r["retokenized"], n, m, args.max_tokens)
            b = base[r["id"]]
            dn, an = replay_simple(b["prompt"], b["output"], n, m, args.max_tokens)
            exact += (d, a) == (r["drafted"], r["accepted"])
            from_text += (dt, at) == (r["drafted"], r["accepted"])
            from_none += (dn, an) == (r["drafted"], r["accepted"])
            server[0] += r["drafted"]
            server[1] += r["accepted"]
            replayed[0] += d
            replayed[1] += a
            replayed_none[0] += dn
            replayed_none[1] += an
            if (d, a) != (r["drafted"], r["accepted"]):
                misses.append(
                    {"id": r["id"], "server": [r["drafted"], r["accepted"]], "replay": [d, a]}
                )
        result["variants"][name] = {
            "exact": exact,
            "exact_from_text": from_text,
            "exact_from_none_output": from_none,
            "server_drafted_accepted": server,
            "replay_drafted_accepted": replayed,
            "replay_of_none_output": replayed_none,
            "misses": misses[:10],
        }
    result["none_output_retokenizes_same"] = retok_same
    result["same_output_as_none"] = {
        name: sum(r["output"] == base[r["id"]]["output"] for r in rs)
        for name, rs in runs.items()
        if name != "none"
    }
    emit(result, args.out)


if __name__ == "__main__":
    main()
