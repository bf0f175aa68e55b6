"""Write ``sessions.jsonl``: multi-turn conversations built from real material on a Debian
machine, as chat apps and coding agents send them (the conversations workload).

Each line is one session: a system prompt, then turns of a user message and the assistant
reply that the next turn re-sends (fixed here, so every arm of a bench replays the very same
history). Two kinds:

- ``agent``: a coding agent on a module of the Python standard library. One long system
  prompt (its tools) is shared by every agent session; the first turn carries the file as a
  tool's output, later turns re-send everything and ask for edits, explanations, JSON lists
  and continuations, with more of the file as further tool output.
- ``chat``: questions about a passage of a licence or package document.

Contexts grow to 6k tokens and more (Gemma's tokenizer). The choice is seeded; the committed
file is the one measured.

    python benchmarks/workloads/make_sessions.py --out benchmarks/workloads/sessions.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sysconfig
from pathlib import Path
from typing import Any

TOOLS = {
    "read_file": "Read a file of the repository. Arguments: path (string), start and end lines.",
    "apply_edit": "Replace a span of a file. Arguments: path, old (exact text), new (text).",
    "run_tests": "Run the test suite or one test. Arguments: selector (string, optional).",
    "search": "Search the repository for a regular expression. Arguments: pattern, glob.",
    "list_dir": "List a directory. Arguments: path (string), depth (integer, default 1).",
}
RULES = [
    "Read before you edit: never change code you have not seen in this conversation.",
    "Keep every edit minimal and keep the file's existing style and names.",
    "When asked for code, answer with the code only, in one fenced block.",
    "When asked for a list, answer with JSON only.",
    "Explain in plain sentences; never invent functions the file does not define.",
    "If a tool fails, say so and stop; do not guess its output.",
]


def agent_system() -> str:
    """The agent's system prompt, the same for every agent session (about 1.5k tokens)."""
    tools = "\n".join(
        f"## {name}\n{doc}\nSchema: "
        + json.dumps({"name": name, "parameters": {"type": "object", "description": doc}})
        for name, doc in TOOLS.items()
    )
    rules = "\n".join(f"{i}. {rule}" for i, rule in enumerate(RULES * 4, 1))
    head = "You are a coding agent working in a Python repository."
    return f"{head}\n\n# Tools\n{tools}\n\n# Rules\n{rules}\n"


def _functions(text: str) -> list[ast.FunctionDef]:
    tree = ast.parse(text)
    return [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.end_lineno]


def _editable(text: str) -> list[ast.FunctionDef]:
    """Top-level functions of six lines or more that take an argument."""
    return [f for f in _functions(text) if (f.end_lineno or 0) - f.lineno >= 5 and f.args.args]


def _source(lines: list[str], node: ast.FunctionDef) -> str:
    return "\n".join(lines[node.lineno - 1 : node.end_lineno])


def modules(stdlib: Path) -> list[Path]:
    """Modules of 20-60k characters with at least six top-level functions of 6+ lines."""
    found = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            functions = _editable(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if 20_000 <= len(text) <= 60_000 and len(functions) >= 6:
            found.append(path)
    return found


def agent_session(path: Path, rng: random.Random, system: str) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    functions = _editable(text)
    picked = rng.sample(functions, 5)
    first, rest = text[:11_000], text[11_000:19_000]
    edit, explain, finish, names, doc = picked
    arg = edit.args.args[0].arg
    renamed = re.sub(rf"\b{re.escape(arg)}\b", f"{arg}_value", _source(lines, edit))
    half = _source(lines, finish).splitlines()
    cut = max(2, len(half) // 2)
    used = sorted({n.id for n in ast.walk(names) if isinstance(n, ast.Name)})[:24]
    docstring = ast.get_docstring(explain) or f"It implements {explain.name}."
    turns = [
        (
            f"Tool read_file({path.name}) returned:\n```python\n{first}\n```\n"
            "List the names of the functions this part of the file defines, as JSON.",
            json.dumps([f.name for f in _functions(text) if f.lineno <= first.count("\n")]),
        ),
        (
            f"Rename the argument {arg} of {edit.name} to {arg}_value. Show the whole function.",
            f"```python\n{renamed}\n```",
        ),
        (
            f"Tool read_file({path.name}, more) returned:\n```python\n{rest}\n```\n"
            f"Explain in two sentences what {explain.name} does.",
            docstring.split("\n\n")[0],
        ),
        (
            "Continue this function from where it stops:\n```python\n"
            + "\n".join(half[:cut])
            + "\n```",
            "```python\n" + "\n".join(half[cut:]) + "\n```",
        ),
        (
            f"List the names {names.name} uses, as JSON.",
            json.dumps(used),
        ),
        (
            f"Add a one-line docstring to {doc.name} and show the whole function.",
            f"```python\n{_source(lines, doc)}\n```",
        ),
    ]
    return {
        "id": f"agent:{path.stem}",
        "kind": "agent",
        "system": system,
        "turns": [{"user": u, "assistant": a} for u, a in turns],
    }


def documents() -> list[Path]:
    """Licence texts of 24k characters or more."""
    roots = [Path("/usr/share/common-licenses")]
    found = [p for root in roots if root.is_dir() for p in sorted(root.iterdir()) if p.is_file()]
    return [p for p in found if p.stat().st_size >= 24_000]


def chat_session(path: Path, rng: random.Random) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8", errors="replace")
    start = rng.randrange(0, max(1, len(text) - 22_000))
    passage = text[start : start + 14_000]
    paragraphs = [p.strip() for p in passage.split("\n\n") if len(p.strip()) > 200]
    words = sorted({w for w in re.findall(r"\b[A-Z][a-z]{4,}\b", passage)})[:20]
    more = text[start + 14_000 : start + 22_000]
    turns = [
        (
            f"Here is a passage of {path.name}:\n\n{passage}\n\nSummarize its first paragraph.",
            paragraphs[0][:400] if paragraphs else passage[:400],
        ),
        ("Quote the sentence that says who may copy the work.", (paragraphs[1:2] or [""])[0][:300]),
        ("List the capitalised terms it uses, as JSON.", json.dumps(words)),
        (f"Here is how it continues:\n\n{more}\n\nWhat changes in this part?", more[:300]),
        ("Explain the last paragraph in plain words.", (paragraphs[-1:] or [""])[0][:400]),
        ("Continue the text after the last sentence.", more[-400:]),
    ]
    return {
        "id": f"chat:{path.name}:{start}",
        "kind": "chat",
        "system": "You are a careful assistant. Answer directly.",
        "turns": [{"user": u, "assistant": a} for u, a in turns],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--agents", type=int, default=6)
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--seed", type=int, default=67)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    system = agent_system()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sessions = [agent_session(p, rng, system) for p in rng.sample(modules(stdlib), args.agents)]
    docs = documents()
    # more chats than licence texts: passages of a text drawn again (at other offsets)
    picked = (
        rng.sample(docs, args.chats) if args.chats <= len(docs) else rng.choices(docs, k=args.chats)
    )
    sessions += [chat_session(p, rng) for p in picked]
    rng.shuffle(sessions)
    args.out.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions))


if __name__ == "__main__":
    main()
