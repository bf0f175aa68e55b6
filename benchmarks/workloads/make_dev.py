"""Write benchmarks/workloads/dev.jsonl from the shipped development workload.

The 25 completion prompts (greedy) of ``tuner/data/dev.jsonl``, plus, for one prompt of
each kind, the same request in chat form (a system message and the prompt as the user's
turn) and a sampled copy (temperature 0.8, fixed seed), so the bench sees both forms and
both sampling modes. Run: ``python benchmarks/workloads/make_dev.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a careful assistant. Answer directly."


def chat_messages(prompt: str) -> list[dict[str, str]]:
    """A prompt in chat form: the system message, then the prompt as the user's turn."""
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def main() -> None:
    rows = [json.loads(line) for line in (ROOT / "tuner/data/dev.jsonl").read_text().splitlines()]
    first_of_kind: dict[str, dict[str, object]] = {}
    for row in rows:
        first_of_kind.setdefault(str(row["class_hint"]), row)
    out = list(rows)
    for row in first_of_kind.values():
        chat = {k: v for k, v in row.items() if k != "prompt"}
        chat["id"] = f"{row['id']}-chat"
        chat["messages"] = chat_messages(str(row["prompt"]))
        sampled = dict(row, id=f"{row['id']}-sampled", temperature=0.8, seed=7)
        out += [chat, sampled]
    path = Path(__file__).with_name("dev.jsonl")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    print(f"wrote {len(out)} lines to {path}")


if __name__ == "__main__":
    main()
