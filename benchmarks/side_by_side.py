"""Several llama-servers answering one workload side by side (``drafter_order.py``; a peer
build beside this one is ``tuner bench --peer``). Each prompt's requests run back to back on
every server, so the machine's drift hits all alike; each server's answers are then read
against a baseline server's, answer by answer."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import geometric_mean
from typing import Any

import httpx

from benchmarks.common import start_llama_server
from tuner.settings import Settings
from tuner.upstream.launch import default_model_path
from tuner.upstream.provision import locate_llama_server
from tuner.workload import WorkloadItem

__all__ = ["Answer", "ask_side_by_side", "over_baseline", "parser", "server_argv"]


def parser(doc: str) -> argparse.ArgumentParser:
    """The options both scripts take: ``--workload`` and ``--out``."""
    out = argparse.ArgumentParser(description=doc.splitlines()[0])
    out.add_argument("--workload", type=Path, required=True)
    out.add_argument("--out", type=Path, help="also write the result to this JSON file")
    return out


def server_argv(binary: Path | None = None, model: Path | None = None) -> list[str]:
    """A one-slot llama-server on both cores: this project's binary and Gemma by default."""
    if binary is None:
        settings = Settings()
        binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    model = model or default_model_path()
    return [str(binary), "-m", str(model), "-c", "4096", "-t", "2", "-np", "1"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer's decode speed and draft counts, from llama-server's ``timings``."""

    kind: str  # the prompt's kind: its id without the trailing number
    tok_s: float
    drafted: int
    accepted: int


def ask_side_by_side(
    servers: Mapping[str, list[str]], items: Sequence[WorkloadItem], **fields: Any
) -> dict[str, list[Answer]]:
    """Start each named llama-server command line, send every item to all of them in turn
    (greedy, plus ``fields``), stop them; the answers per server, in item order."""
    running: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    answers: dict[str, list[Answer]] = {name: [] for name in servers}
    try:  # one that fails to start stops the ones started before it
        for name, argv in servers.items():
            running[name] = start_llama_server(argv, timeout_s=120)
        for item in items:
            path, body = item.request()
            body = {**body, "temperature": 0.0, **fields}  # greedy: every server writes one text
            for name, (_, url) in running.items():
                got = httpx.post(url + path, json=body, timeout=600).json()["timings"]
                answers[name].append(
                    Answer(
                        item.id.rsplit("-", 1)[0],
                        got["predicted_per_second"],
                        got.get("draft_n", 0),
                        got.get("draft_n_accepted", 0),
                    )
                )
    finally:
        for proc, _ in running.values():
            proc.terminate()
        for proc, _ in running.values():
            proc.wait(timeout=30)
    return answers


def over_baseline(answers: Sequence[Answer], base: Sequence[Answer]) -> dict[str, Any]:
    """Speed over the baseline's on the same prompts (geometric mean, overall and by kind),
    mean tokens/s and acceptance."""
    ratios: dict[str, list[float]] = {}
    for a, b in zip(answers, base, strict=True):
        ratios.setdefault(a.kind, []).append(a.tok_s / b.tok_s)
    every = [r for values in ratios.values() for r in values]
    drafted = sum(a.drafted for a in answers)
    return {
        "ratio": round(geometric_mean(every), 3),
        "tok_s": round(sum(a.tok_s for a in answers) / len(answers), 1),
        "alpha": round(sum(a.accepted for a in answers) / drafted, 3) if drafted else None,
        "by_kind": {k: round(geometric_mean(v), 3) for k, v in ratios.items()},
    }
