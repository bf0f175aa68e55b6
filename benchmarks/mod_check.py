"""How close is the replay of ``ngram-mod`` (``tuner.tuning.shadow.ModDrafter``) to the server?

``ngram-mod`` keeps its table across requests, so the order matters: each variant's
llama-server (one slot) answers the workload's prompts in order, ``--passes`` times
(later passes repeat earlier prompts, which the table remembers), and one
``ModDrafter`` is fed the same requests in the same order. Per request, the replay
should give the drafted and accepted counts the server reported. Also replayed, as
the daemon does for variants that did not serve: a second drafter fed the outputs of
the server without speculation, in the same order.

    python -m benchmarks.mod_check --out benchmarks/results/mod_check.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.common import emit
from benchmarks.shadow_check import answers
from tuner.settings import Settings
from tuner.tuning.shadow import ModDrafter
from tuner.upstream.launch import default_model_path
from tuner.upstream.provision import locate_llama_server
from tuner.workload import load_workload

VARIANTS = [(12, 16, 12), (24, 64, 48), (12, 64, 48)]  # (n_match, n_max, n_min)


def _name(variant: tuple[int, int, int]) -> str:
    return "ngram-mod.match{}.max{}.min{}".format(*variant)


def flags(variant: tuple[int, int, int] | None) -> list[str]:
    if variant is None:
        return []
    n_match, n_max, n_min = variant
    return ["--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", str(n_match),
            "--spec-ngram-mod-n-max", str(n_max), "--spec-ngram-mod-n-min", str(n_min)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/dev.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = default_model_path()
    items = [i.model_dump(exclude_none=True) for i in load_workload(args.workload)]
    order = items * args.passes
    servers = {"none": flags(None)} | {_name(v): flags(v) for v in VARIANTS}
    runs = answers(binary, model, servers, order, args.max_tokens, args.temperature)
    result: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "prompts": len(items),
        "passes": args.passes,
        "variants": {},
    }
    for variant in VARIANTS:
        name = _name(variant)
        own, other = ModDrafter(*variant), ModDrafter(*variant)
        exact, from_none = [0] * args.passes, [0] * args.passes
        server, replayed, replayed_none = [0, 0], [0, 0], [0, 0]
        misses = []
        for j, (r, b) in enumerate(zip(runs[name], runs["none"], strict=True)):
            found = own.replay(r["prompt"], r["output"], args.max_tokens)
            other_found = other.replay(b["prompt"], b["output"], args.max_tokens)
            truth = (r["drafted"], r["accepted"])
            exact[j // len(items)] += found == truth
            from_none[j // len(items)] += other_found == truth
            for total, pair in ((server, truth), (replayed, found), (replayed_none, other_found)):
                total[0] += pair[0]
                total[1] += pair[1]
            if found != truth:
                misses.append({"request": j, "id": r["id"], "server": truth, "replay": found})
        result["variants"][name] = {
            "exact_per_pass": exact,
            "exact_from_none_output_per_pass": from_none,
            "server_drafted_accepted": server,
            "replay_drafted_accepted": replayed,
            "replay_of_none_output": replayed_none,
            "misses": misses[:10],
        }
    emit(result, args.out)


if __name__ == "__main__":
    main()
