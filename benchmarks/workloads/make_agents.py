"""Write ``agents.jsonl``: coding-agent sessions of 20 turns or more whose context grows past
16k tokens, built from real material on this machine (the agents-at-load workload).

Each session is an agent changing one module of the Python standard library. Every session
shares one long system prompt (tools with their JSON schemas, rules). A user turn is what a
tool returned: the directory, the module read in chunks, grep hits over the standard
library, the module's own tests and their unittest output, run here. An assistant turn is
the agent's next tool call, as JSON. Once a session, two sub-agents run at once (``fork``:
after turn ``after``, each a conversation of its own on the shared system prompt, finding
the callers of a function), and the parent's next turn carries what they found. The choice
is seeded; the committed file is the one measured: 6 sessions of 21 turns whose last turn
is 21-25k tokens of Gemma's (a 3.8k-token system prompt), sub-agents up to 5.8k.

    python benchmarks/workloads/make_agents.py --out benchmarks/workloads/agents.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

CHUNK = 4_000  # characters of a file per read_file call
MODULE_CHUNKS, TEST_CHUNKS = 10, 2  # read_file calls on the module and on its tests
GREP_HITS = 25
TEST_OUTPUT = 3_000  # the tail of unittest's output a tool result carries
# Gemma's tokenizer reads about 2.9 characters a token of this material: past 16k tokens,
# and the last turn within the 32768 of Gemma's context (its answer included)
MIN_TURNS, MIN_CONTEXT_CHARS, MAX_CONTEXT_CHARS = 20, 50_000, 82_000

TOOLS: dict[str, tuple[str, dict[str, str]]] = {
    "list_dir": ("List a directory of the repository.", {"path": "string", "depth": "integer"}),
    "read_file": (
        "Read a span of a file; lines are 1-based and inclusive.",
        {"path": "string", "start": "integer", "end": "integer"},
    ),
    "search": (
        "Search the repository for a regular expression; each hit as path:line: text.",
        {"pattern": "string", "glob": "string", "max_hits": "integer"},
    ),
    "apply_edit": (
        "Replace exactly one occurrence of old with new in a file; fails if old is not unique.",
        {"path": "string", "old": "string", "new": "string"},
    ),
    "run_tests": (
        "Run a test module with unittest and return its output.",
        {"module": "string", "verbose": "boolean"},
    ),
    "spawn_agents": (
        "Start sub-agents on tasks at once; returns each one's final answer.",
        {"tasks": "array of strings"},
    ),
    "finish": ("End the task with a summary for the user.", {"summary": "string"}),
}
RULES = [
    "Read a file before you edit it, and never edit code you have not read in this session.",
    "Answer every turn with exactly one tool call as a JSON object: tool and arguments.",
    "Keep edits minimal; keep the file's style, names and public behaviour.",
    "Run the module's tests after each change; stop and report when a test fails.",
    "Give independent searches to sub-agents so that they run at once.",
    "Quote paths relative to the repository root; never invent a file or a function.",
    "When a tool fails, say so in your next call's arguments; never guess its output.",
    "Prefer search over reading whole directories; read only the spans you need.",
]


EXAMPLES = {
    "list_dir": ({"path": "json", "depth": 1}, "decoder.py\nencoder.py\nscanner.py\ntool.py"),
    "read_file": (
        {"path": "textwrap.py", "start": 1, "end": 3},
        '"""Text wrapping and filling.\n"""\n',
    ),
    "search": ({"pattern": r"\bdedent\(", "glob": "*.py", "max_hits": 2}, "textwrap.py:414: ..."),
    "apply_edit": ({"path": "textwrap.py", "old": "x = 1", "new": "x = 2"}, "1 replacement."),
    "run_tests": ({"module": "test.test_textwrap", "verbose": False}, "Ran 70 tests\nOK"),
    "spawn_agents": ({"tasks": ["find the callers of dedent"]}, "- sub0: [...]"),
    "finish": ({"summary": "Renamed the argument; tests pass."}, "(the session ends)"),
}


def agent_system(stdlib: Path) -> str:
    """The system prompt every session shares (about 4k tokens): tools with schemas and
    examples, rules, and a map of the repository."""
    parts = ["You are a coding agent working in a Python repository: the standard library."]
    parts.append("# Tools")
    for name, (doc, params) in TOOLS.items():
        schema = {
            "name": name,
            "description": doc,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": v} for k, v in params.items()},
                "required": list(params),
            },
        }
        example, result = EXAMPLES[name]
        parts.append(
            f"## {name}\n{doc}\n```json\n{json.dumps(schema, indent=2)}\n```\n"
            f"Example: {call(name, **example)}\nReturns, for example:\n{result}"
        )
    parts.append("# Rules")
    parts += [f"{i}. {rule}" for i, rule in enumerate(RULES, 1)]
    parts.append("# Repository map: each top-level module and its docstring's first line")
    parts.append("\n".join(f"- {name}: {line}" for name, line in repository_map(stdlib)))
    return "\n\n".join(parts) + "\n"


def repository_map(stdlib: Path) -> list[tuple[str, str]]:
    found = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if doc and not path.name.startswith("_"):
            found.append((path.name, doc.strip().splitlines()[0][:100]))
    return found


def call(tool: str, **arguments: Any) -> str:
    return json.dumps({"tool": tool, "arguments": arguments})


def _functions(text: str) -> list[ast.FunctionDef]:
    """Top-level functions of six lines or more that take an argument."""
    return [
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.FunctionDef)
        and n.end_lineno is not None
        and n.end_lineno - n.lineno >= 5
        and n.args.args
    ]


def modules(stdlib: Path) -> list[tuple[Path, Path]]:
    """Modules of 40-90k characters with a test module and four functions to work on."""
    found = []
    for path in sorted(stdlib.glob("*.py")):
        test = stdlib / "test" / f"test_{path.stem}.py"
        try:
            text = path.read_text(encoding="utf-8")
            functions = _functions(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        if 40_000 <= len(text) <= 90_000 and len(functions) >= 4 and test.is_file():
            found.append((path, test))
    return found


def grep(stdlib: Path, pattern: str, limit: int = GREP_HITS) -> str:
    """``path:line: text`` hits of ``pattern`` over the standard library's top-level modules."""
    hits = []
    regex = re.compile(pattern)
    for path in sorted(stdlib.glob("*.py")):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for number, line in enumerate(lines, 1):
            if regex.search(line):
                hits.append(f"{path.name}:{number}: {line.strip()[:160]}")
                if len(hits) >= limit:
                    return "\n".join(hits)
    return "\n".join(hits) or "(no hits)"


def test_output(test: Path) -> str:
    """The tail of the module's tests run with unittest here (cut at 300 s)."""
    command = [sys.executable, "-m", "unittest", "-v", f"test.{test.stem}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out[-TEST_OUTPUT:]


def _chunks(text: str) -> list[tuple[int, int, str]]:
    """The file in read_file spans: first and last line, and the text."""
    lines, spans, start = text.splitlines(), [], 0
    while start < len(lines):
        end, size = start, 0
        while end < len(lines) and size < CHUNK:
            size += len(lines[end]) + 1
            end += 1
        spans.append((start + 1, end, "\n".join(lines[start:end])))
        start = end
    return spans


def subagent(stdlib: Path, system: str, name: str, key: str) -> dict[str, Any]:
    """A sub-agent finding the callers of ``name``: search, read two hits, answer."""
    hits = grep(stdlib, rf"\b{re.escape(name)}\(")
    found = [h for h in hits.splitlines() if ":" in h][:2]
    turns = [
        {
            "user": f"Sub-task: find every call of {name}() in the standard library and say "
            "which calls pass keyword arguments.",
            "assistant": call("search", pattern=rf"\b{name}\(", glob="*.py", max_hits=GREP_HITS),
        },
        {"user": f"Tool search returned:\n{hits}", "assistant": ""},
    ]
    for hit in found:
        path, line = hit.split(":")[:2]
        lines = (stdlib / path).read_text(encoding="utf-8").splitlines()
        at = int(line)
        span = "\n".join(lines[max(0, at - 40) : at + 40])
        turns[-1]["assistant"] = call("read_file", path=path, start=max(1, at - 40), end=at + 40)
        turns.append({"user": f"Tool read_file returned:\n```python\n{span}\n```", "assistant": ""})
    answer = [h.split(": ", 1)[0] for h in hits.splitlines() if "=" in h.split(": ", 1)[-1]]
    turns[-1]["assistant"] = call("finish", summary=json.dumps(answer[:12]))
    return {"id": f"{key}:sub:{name}", "kind": "subagent", "system": system, "turns": turns}


def agent_session(
    path: Path, test: Path, stdlib: Path, rng: random.Random, system: str
) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    edit, document, *callers = rng.sample(_functions(text), 4)
    key = f"agent:{path.stem}"
    task = (
        f"In {path.name}, rename the argument {edit.args.args[0].arg} of {edit.name} to "
        f"{edit.args.args[0].arg}_value and give {document.name} a one-line docstring; "
        "keep the tests passing."
    )
    listing = "\n".join(sorted(p.name for p in stdlib.iterdir())[:160])
    turns: list[dict[str, str]] = [
        {"user": task, "assistant": call("list_dir", path=".", depth=1)},
        {"user": f"Tool list_dir returned:\n{listing}", "assistant": ""},
    ]

    def then(tool_call: str, result: str) -> None:
        turns[-1]["assistant"] = tool_call
        turns.append({"user": result, "assistant": ""})

    for first, last, chunk in _chunks(text)[:MODULE_CHUNKS]:
        then(
            call("read_file", path=path.name, start=first, end=last),
            f"Tool read_file returned lines {first}-{last}:\n```python\n{chunk}\n```",
        )
    for name in (edit.name, document.name):
        pattern = rf"\b{name}\("
        then(
            call("search", pattern=pattern, glob="*.py", max_hits=GREP_HITS), grep(stdlib, pattern)
        )
    test_text = test.read_text(encoding="utf-8")
    for first, last, chunk in _chunks(test_text)[:TEST_CHUNKS]:
        then(
            call("read_file", path=f"test/{test.name}", start=first, end=last),
            f"Tool read_file returned lines {first}-{last}:\n```python\n{chunk}\n```",
        )
    output = test_output(test)
    then(call("run_tests", module=f"test.{test.stem}", verbose=True), f"Tool run_tests:\n{output}")
    lines = text.splitlines()
    head = lines[edit.lineno - 1]
    arg = edit.args.args[0].arg
    new = re.sub(rf"\b{re.escape(arg)}\b", f"{arg}_value", head)
    then(call("apply_edit", path=path.name, old=head, new=new), "Tool apply_edit: 1 replacement.")
    doc_head = lines[document.lineno - 1]
    docstring = f'{doc_head}\n    """{document.name.replace("_", " ").strip()}."""'
    then(
        call("apply_edit", path=path.name, old=doc_head, new=docstring),
        "Tool apply_edit: 1 replacement.",
    )
    then(call("run_tests", module=f"test.{test.stem}", verbose=True), f"Tool run_tests:\n{output}")
    subs = [subagent(stdlib, system, f.name, key) for f in callers]
    fork_after = len(turns) - 1
    then(
        call("spawn_agents", tasks=[s["turns"][0]["user"] for s in subs]),
        "Tool spawn_agents returned:\n"
        + "\n".join(
            f"- {s['id']}: {json.loads(s['turns'][-1]['assistant'])['arguments']}" for s in subs
        ),
    )
    turns[-1]["assistant"] = call(
        "finish", summary=f"Renamed {arg} in {edit.name}, documented {document.name}; tests pass."
    )
    return {
        "id": key,
        "kind": "agent",
        "system": system,
        "turns": turns,
        "fork": {"after": fork_after, "subagents": subs},
    }


def context_chars(session: dict[str, Any]) -> int:
    return len(session["system"]) + sum(
        len(t["user"]) + len(t["assistant"]) for t in session["turns"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--seed", type=int, default=71)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    system = agent_system(stdlib)
    sessions = []
    for path, test in rng.sample(modules(stdlib), len(modules(stdlib))):
        session = agent_session(path, test, stdlib, rng, system)
        if len(session["turns"]) >= MIN_TURNS and (
            MIN_CONTEXT_CHARS <= context_chars(session) <= MAX_CONTEXT_CHARS
        ):
            sessions.append(session)
        if len(sessions) == args.sessions:
            break
    args.out.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in sessions))
    for s in sessions:
        print(f"{s['id']}: {len(s['turns'])} turns, {context_chars(s):,} characters")


if __name__ == "__main__":
    main()
