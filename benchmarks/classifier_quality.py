"""Classifier quality on the project's labeled prompt sets: confusion matrices as markdown.

tests/classify/labeled.jsonl is the set the rules were written against; heldout.jsonl was
written after they were frozen and measured once; short.jsonl holds short completion prompts
(signatures, imports, fill-in-the-middle prefixes, and short prose beside them), written
before the rule for short code and measured before and after it. All were written by this
project.
Usage: python benchmarks/classifier_quality.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.classify import classify, load_definitions  # noqa: E402
from tuner.classify.classes import CONTENT_TYPES  # noqa: E402
from tuner.tables import markdown_table  # noqa: E402

TYPES = sorted(CONTENT_TYPES)


def report(name: str) -> str:
    rows = [
        json.loads(line) for line in (ROOT / "tests" / "classify" / name).read_text().splitlines()
    ]
    definitions = load_definitions()
    types = {(a, b): 0 for a in TYPES for b in TYPES}
    echo = {(a, b): 0 for a in (True, False) for b in (True, False)}
    for row in rows:
        features = classify(row, definitions).features
        types[(row["expected_type"], features.content_type)] += 1
        echo[(row["expected_echo"], features.echo >= definitions.thresholds.echo)] += 1
    right = sum(types[(t, t)] for t in TYPES)
    echo_right = echo[(True, True)] + echo[(False, False)]
    table = markdown_table(
        ["expected \\ got", *TYPES], [[t, *(types[(t, g)] for g in TYPES)] for t in TYPES]
    )
    echo_table = markdown_table(
        ["expected \\ got", "echo", "fresh"],
        [
            ["echo", echo[(True, True)], echo[(True, False)]],
            ["fresh", echo[(False, True)], echo[(False, False)]],
        ],
    )
    return (
        f"### {name}: {len(rows)} prompts\n\ncontent type {right}/{len(rows)} "
        f"({right / len(rows):.0%}), echo {echo_right}/{len(rows)} "
        f"({echo_right / len(rows):.0%})\n\n{table}\n\n{echo_table}\n"
    )


if __name__ == "__main__":
    print(report("labeled.jsonl"))
    print(report("heldout.jsonl"))
    print(report("short.jsonl"))
