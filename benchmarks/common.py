"""What the benchmark scripts share."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import httpx

from tuner.bench.rows import parse_rows
from tuner.upstream.process import free_port


def read_requests(parser: argparse.ArgumentParser, run: Path) -> list[dict[str, Any]]:
    """The rows of a bench run's ``run/requests.jsonl``; a missing or unreadable file, or a
    row without the fields the analyses read (``tuner.bench.analyse.parse_rows``), is a
    usage error (``parser.error``: a message and exit status 2), not a traceback."""
    try:
        return parse_rows((run / "requests.jsonl").read_text().splitlines())
    except (OSError, ValueError) as exc:
        parser.error(f"{run}: no readable requests.jsonl: {exc}")


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


def start_llama_server(
    argv: list[str], *, log: IO[bytes] | None = None, timeout_s: float = 60.0
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` (a llama-server command line without host and port) on a free local
    port, its output to ``log`` (default: discarded), and wait until ``/health`` answers
    200: the process and its URL. One that is not ready within ``timeout_s`` is killed and
    the script stops with a message (``SystemExit``)."""
    port = free_port()
    sink = log if log is not None else subprocess.DEVNULL
    command = [*argv, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(command, stdout=sink, stderr=sink)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("llama-server did not start")


def start_tuner(
    state: Path, env: Mapping[str, str], *, timeout_s: float = 300.0, code: Path | None = None
) -> tuple[subprocess.Popen[bytes], str]:
    """``tuner serve`` on state dir ``state`` with these settings (its log in
    ``state/daemon.log``) once ``/ready`` answers 200: the process and its URL. One that
    exits or is not ready in time stops the script with a message (``SystemExit``).
    ``code``: a checkout whose tuner package it runs (``-m`` imports from there first)."""
    port = free_port()
    argv = [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--state-dir", str(state)]
    with (state / "daemon.log").open("wb") as sink:
        env = {**os.environ, **env}
        proc = subprocess.Popen(argv, cwd=code, stdout=sink, stderr=sink, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited: {(state / 'daemon.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit("the daemon did not become ready")
