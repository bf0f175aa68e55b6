"""What the benchmark scripts share."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner.bench.analyse import check_row


def read_requests(parser: argparse.ArgumentParser, run: Path) -> list[dict[str, Any]]:
    """The rows of a bench run's ``run/requests.jsonl``; a missing or unreadable file, or a
    row without the fields the analyses read (``tuner.bench.analyse.check_row``), is a
    usage error (``parser.error``: a message and exit status 2), not a traceback."""
    try:
        lines = (run / "requests.jsonl").read_text().splitlines()
        rows = [(n, json.loads(line)) for n, line in enumerate(lines, 1) if line.strip()]
    except (OSError, ValueError) as exc:
        parser.error(f"{run}: no readable requests.jsonl: {exc}")
    for n, row in rows:
        if problem := check_row(row):
            parser.error(f"{run}/requests.jsonl line {n}: {problem}")
    return [row for _, row in rows]


def usable(row: dict[str, Any]) -> bool:
    """Whether a request row was answered with decode time and tokens (a failed one, or one
    that generated nothing, is left out of every figure)."""
    return not row.get("error") and float(row.get("ms") or 0) > 0 and float(row["tokens"]) > 0


def emit(result: dict[str, Any], out: Path | None, *, quiet: bool = False) -> None:
    """Print the result as JSON (unless quiet) and write it to ``out`` when given."""
    text = json.dumps(result, indent=2)
    if not quiet:
        print(text)
    if out:
        out.write_text(text + "\n")


def run_main(doc: str, analyse: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
    """The command line of a script that reads one bench run: ``DIR [--out FILE.json]``;
    prints (and writes) ``{"run": DIR, **analyse(rows)}``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("run", type=Path, help="a bench run's directory (with requests.jsonl)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = read_requests(parser, args.run)
    emit({"run": str(args.run), **analyse(rows)}, args.out)
