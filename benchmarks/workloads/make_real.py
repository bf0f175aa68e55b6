"""Write ``real.jsonl``: prompts built from real text found on a Debian machine, none of it
written for this project (the second workload of the pricing and learning checks).

Sources: functions of the Python standard library (``/usr/lib/python3.X``), passages of
package documentation (``/usr/share/doc``), and system data files (``/etc/services``, the
time zone tables). The tasks around them are the few a local assistant is asked for most:
edit this code, explain it, finish it; summarize or quote a passage; convert rows of data.
The choice is seeded; the committed file is the one measured (another machine's files
differ).

    python benchmarks/workloads/make_real.py --out benchmarks/workloads/real.jsonl
"""

from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SYSTEM = "You are a careful assistant. Answer directly."
GREEDY_SHARE = 0.7  # the rest sampled at temperature 0.8


def functions(stdlib: Path, rng: random.Random) -> list[tuple[str, str, list[str]]]:
    """(module, source, argument names) of top-level functions of 8-24 lines."""
    found: list[tuple[str, str, list[str]]] = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.end_lineno is not None:
                body = lines[node.lineno - 1 : node.end_lineno]
                args = [a.arg for a in node.args.args if len(a.arg) > 2 and a.arg != "self"]
                if 8 <= len(body) <= 24 and args and max(map(len, body)) <= 100:
                    found.append((path.stem, "\n".join(body), args))
    rng.shuffle(found)
    return found


def passages(docs: Path, rng: random.Random) -> list[tuple[str, str]]:
    """(package, passage of 500-1200 characters) from README/NEWS-like documentation."""
    found: list[tuple[str, str]] = []
    for path in sorted(docs.glob("*/*")):
        if not path.name.upper().startswith(("README", "NEWS", "TODO", "FAQ")) or path.is_dir():
            continue
        try:
            raw = path.read_bytes()
            text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        paragraphs = [p.strip() for p in text.split("\n\n") if len(p.strip()) > 80]
        chunk = ""
        for paragraph in paragraphs:
            chunk = f"{chunk}\n\n{paragraph}".strip()
            if len(chunk) >= 500:
                if len(chunk) <= 1200:
                    found.append((path.parent.name, chunk))
                chunk = ""
    rng.shuffle(found)
    return found


def data_chunks(rng: random.Random) -> list[tuple[str, str]]:
    """(source, 8-14 lines) of system data tables."""
    found: list[tuple[str, str]] = []
    zoneinfo = Path("/usr/share/zoneinfo")
    for name in ("/etc/services", zoneinfo / "iso3166.tab", zoneinfo / "zone.tab"):
        try:
            rows = [r for r in Path(name).read_text().splitlines() if r and not r.startswith("#")]
        except OSError:
            continue
        start = 0
        while start < len(rows):
            size = rng.randint(8, 14)
            found.append((Path(name).name, "\n".join(rows[start : start + size])))
            start += size
    rng.shuffle(found)
    return found


def item(rng: random.Random, ident: str, kind: str, user: str, max_tokens: int) -> dict[str, Any]:
    greedy = rng.random() < GREEDY_SHARE
    out: dict[str, Any] = {
        "id": ident,
        "class_hint": kind,
        "max_tokens": max_tokens,
        "temperature": 0 if greedy else 0.8,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
    }
    if not greedy:
        out["seed"] = rng.randrange(1 << 16)
    return out


def build(stdlib: Path, docs: Path, seed: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    code, text, data = functions(stdlib, rng), passages(docs, rng), data_chunks(rng)
    for n, (module, source, args) in enumerate(code[:50]):
        old = rng.choice(args)
        user = (
            f"Rewrite this function from Python's {module} module with the argument "
            f"`{old}` renamed to `{old}_value`. Change nothing else.\n\n"
            f"{source}\n"
        )
        yield item(rng, f"code-edit-{n:02d}", "code-edit", user, 192)
    for n, (module, source, _) in enumerate(code[50:70]):
        user = f"Explain what this function from Python's {module} module does.\n\n{source}\n"
        yield item(rng, f"code-explain-{n:02d}", "code-explain", user, 128)
    for n, (module, source, _) in enumerate(code[70:90]):
        head = "\n".join(source.splitlines()[: max(3, len(source.splitlines()) // 2)])
        user = f"Complete this function from Python's {module} module.\n\n{head}\n"
        yield item(rng, f"code-complete-{n:02d}", "code-complete", user, 128)
    for n, (package, passage) in enumerate(text[:20]):
        user = f"Summarize this passage from the {package} documentation.\n\n{passage}\n"
        yield item(rng, f"doc-summarize-{n:02d}", "summarize", user, 128)
    for n, (package, passage) in enumerate(text[20:40]):
        user = (
            f"Quote, word for word, the two most important sentences of this passage "
            f"from the {package} documentation.\n\n{passage}\n"
        )
        yield item(rng, f"doc-quote-{n:02d}", "summarize-quote", user, 128)
    for n, (source, rows) in enumerate(data[:20]):
        user = (
            f"Convert these lines of {source} to a JSON array with one object per line.\n\n{rows}\n"
        )
        yield item(rng, f"data-json-{n:02d}", "json-extract", user, 192)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("real.jsonl"))
    parser.add_argument("--seed", type=int, default=56)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    parser.add_argument("--docs", type=Path, default=Path("/usr/share/doc"))
    args = parser.parse_args()
    items = list(build(args.stdlib, args.docs, args.seed))
    random.Random(args.seed).shuffle(items)  # so that the first N prompts are a mix
    args.out.write_text("".join(json.dumps(i) + "\n" for i in items))
    print(f"{len(items)} prompts -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
