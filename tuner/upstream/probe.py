"""Whether a llama-server honours per-request draft settings, asked of the binary itself.

A build's help does not say it, and builds differ: mainline compiled the fields out in
2026, ik_llama.cpp reads them as flat ``speculative.*`` keys. So one instance of an n-gram
type is started on a prompt it is sure to draft on (a repeated run of numbers) and asked
twice, greedily: as it is, and with ``speculative.n_max`` 0. The fields are honoured where
the first drafts and the second drafts nothing (read from the server's own timings). The
answer is kept per binary (its path, size and time) in the state folder, so the model is
loaded for it once.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tuner.atomic import write_atomic
from tuner.logs import get_logger
from tuner.upstream.process import die_with_parent, free_port

__all__ = ["honours_request_fields"]

log = get_logger(__name__)

PROMPT = " ".join(str(i % 8) for i in range(96))  # "0 1 2 ... 7 0 1 ..." repeated
CACHE_FILE = "request-fields.json"


def honours_request_fields(
    argv: Callable[[int], list[str]], binary: Path, cache_dir: Path, *, timeout_s: float = 300.0
) -> bool:
    """``argv``: an n-gram instance's command line for a port, of ``binary``; the answer is
    kept in ``cache_dir``."""
    key = _binary_key(binary)
    cache = cache_dir / CACHE_FILE
    known = _read(cache)
    if key in known:
        return bool(known[key])
    answer = _ask(argv, timeout_s)
    if answer is not None:
        write_atomic(cache, json.dumps({**known, key: answer}, indent=2) + "\n")
    return bool(answer)


def _binary_key(binary: Path) -> str:
    stat = binary.stat()
    return f"{binary.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _ask(argv: Callable[[int], list[str]], timeout_s: float) -> bool | None:
    """True or False as the server answered; None when it could not be asked (not kept)."""
    port = free_port()
    process = subprocess.Popen(
        argv(port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=die_with_parent,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=timeout_s) as client:
            if not _healthy(client, process, timeout_s):
                log.warning("request_fields_unprobed", reason="the probe instance did not start")
                return None
            drafted = _drafted(client, {})
            silenced = _drafted(client, {"speculative.n_max": 0})
    except httpx.HTTPError as exc:
        log.warning("request_fields_unprobed", reason=str(exc))
        return None
    finally:
        process.kill()
        process.wait()
    honoured = drafted > 0 and silenced == 0
    log.info("request_fields_probed", honoured=honoured, drafted=drafted, with_n_max_0=silenced)
    return honoured


def _healthy(client: httpx.Client, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if client.get("/health", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def _drafted(client: httpx.Client, fields: dict[str, object]) -> int:
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "cache_prompt": False}
    response = client.post("/v1/completions", json={**body, **fields})
    response.raise_for_status()
    timings = response.json().get("timings") or {}
    return int(timings.get("draft_n") or 0)
