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

from pathlib import Path

from benchmarks.common import emit
from benchmarks.side_by_side import ask_side_by_side, over_baseline, parser, server_argv
from tuner.workload import load_workload

ARMS = {
    "none": [],
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-simple+autotune": ["--spec-type", "ngram-simple", "--spec-autotune"],
    "ngram-mod+autotune": ["--spec-type", "ngram-mod", "--spec-autotune"],
}
OURS_ARMS = ("none", "ngram-simple", "ngram-mod")  # this build has no autotune


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--peer", type=Path, required=True, help="ik_llama.cpp's llama-server")
    cli.add_argument("--prompts", type=int, help="only the first N prompts")
    args = cli.parse_args()
    ours = server_argv()
    servers = {
        f"ours:{name}": [*ours, *extra] for name, extra in ARMS.items() if name in OURS_ARMS
    } | {f"peer:{name}": [str(args.peer), *ours[1:], *extra] for name, extra in ARMS.items()}
    answers = ask_side_by_side(servers, load_workload(args.workload)[: args.prompts])
    result = {
        name: over_baseline(got, answers[name.split(":")[0] + ":none"])
        for name, got in answers.items()
    }
    emit({"prompts": len(answers["ours:none"]), "arms": result}, args.out)


if __name__ == "__main__":
    main()
