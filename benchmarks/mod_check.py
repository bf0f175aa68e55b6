"""How close is the replay of ``ngram-mod`` (``replay.drafters.ModDrafter``) to the server?

``ngram-mod`` keeps its table across requests, so the order matters: each variant's
llama-server (one slot) answers the workload's prompts in order, ``--passes`` times
(later passes repeat earlier prompts, which the table remembers), and one
``ModDrafter`` is fed the same requests in the same order. Per request, the replay
should give the drafted and accepted counts the server reported. Also replayed, as
the daemon does for variants that did not serve: a second drafter fed the outputs of
the server without speculation, in the same order.

    python -m benchmarks.mod_check --out benchmarks/results/mod_check.json

As the daemon's instances run (several slots, the prompt cache on, each item's own
sampling, prompts in shuffled cycles like the bench's tuner stream)::

    python -m benchmarks.mod_check --slots 4 --cache-prompt --item-sampling --shuffle 1 \
        --passes 3 --variants 24,16,12
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from benchmarks.common import emit
from benchmarks.shadow_check import answers
from tuner.bench.schedule import tuner_stream
from tuner.settings import Settings
from tuner.tuning.replay.drafters import ModDrafter
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
    return [
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-match",
        str(n_match),
        "--spec-ngram-mod-n-max",
        str(n_max),
        "--spec-ngram-mod-n-min",
        str(n_min),
    ]


def _triple(text: str) -> tuple[int, int, int]:
    n_match, n_max, n_min = (int(x) for x in text.split(","))
    return n_match, n_max, n_min


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/dev.jsonl"))
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument(
        "--item-sampling", action="store_true", help="each item's own temperature and seed"
    )
    parser.add_argument("--slots", type=int, default=1, help="llama-server -np")
    parser.add_argument("--cache-prompt", action="store_true", help="the server's prompt cache")
    parser.add_argument("--shuffle", type=int, help="each pass in its own order (this seed)")
    parser.add_argument("--variants", help="n_match,n_max,n_min;... (default: three)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    variants = [_triple(v) for v in args.variants.split(";")] if args.variants else VARIANTS
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = default_model_path()
    items = [i.model_dump(exclude_none=True) for i in load_workload(args.workload)]
    if args.shuffle is None:
        order = items * args.passes
    else:  # shuffled cycles, as the bench's tuner sees the workload
        stream = tuner_stream(len(items), len(items) * args.passes, random.Random(args.shuffle))
        order = [items[i] for i in stream]
    servers = {"none": flags(None)} | {_name(v): flags(v) for v in variants}
    temperature = None if args.item_sampling else args.temperature
    runs = answers(
        binary,
        model,
        servers,
        order,
        args.max_tokens,
        temperature,
        slots=args.slots,
        cache_prompt=args.cache_prompt,
    )
    result: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "temperature": "per item" if temperature is None else temperature,
        "slots": args.slots,
        "cache_prompt": args.cache_prompt,
        "shuffle": args.shuffle,
        "prompts": len(items),
        "passes": args.passes,
        "variants": {},
    }
    sampled = {j for j, item in enumerate(order) if float(item.get("temperature", 0) or 0) > 0}
    for variant in variants:
        name = _name(variant)
        own, other = ModDrafter(*variant), ModDrafter(*variant)
        exact, from_none = [0] * args.passes, [0] * args.passes
        server, replayed, replayed_none = [0, 0], [0, 0], [0, 0]
        misses: list[dict[str, Any]] = []
        sampled_server, sampled_replay = [0, 0], [0, 0]
        for j, (r, b) in enumerate(zip(runs[name], runs["none"], strict=True)):
            found = own.replay(r["prompt"], r["output"], args.max_tokens)
            other_found = other.replay(b["prompt"], b["output"], args.max_tokens)
            truth = (r["drafted"], r["accepted"])
            exact[j // len(items)] += found == truth
            from_none[j // len(items)] += other_found == truth
            for total, pair in ((server, truth), (replayed, found), (replayed_none, other_found)):
                total[0] += pair[0]
                total[1] += pair[1]
            if j in sampled:
                for total, pair in ((sampled_server, truth), (sampled_replay, found)):
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
            "sampled_server_drafted_accepted": sampled_server,
            "sampled_replay_drafted_accepted": sampled_replay,
            "misses": misses[:10],
        }
    emit(result, args.out)


if __name__ == "__main__":
    main()
