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

from pathlib import Path

from benchmarks.common import emit
from benchmarks.side_by_side import ask_side_by_side, over_baseline, parser, server_argv
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
    cli = parser(__doc__)
    cli.add_argument("--draft", type=Path, required=True, help="a draft GGUF for the target")
    cli.add_argument("--model", type=Path, help="target GGUF (default: Gemma 3 270M)")
    args = cli.parse_args()
    base = server_argv(model=args.model)
    servers = {name: base + extra for name, extra in arms(args.draft).items()}
    answers = ask_side_by_side(servers, load_workload(args.workload), cache_prompt=False)
    result = {name: over_baseline(got, answers["none"]) for name, got in answers.items()}
    emit({"model": base[2], "draft": str(args.draft), "arms": result}, args.out)


if __name__ == "__main__":
    main()
