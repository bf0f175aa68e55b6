"""What a client sees when one router instance fails, on the real llama-server.

    python benchmarks/router_faults.py --rounds 3 --out benchmarks/results/router_faults.json

Every class is pinned to one n-gram variant; each round starts a fresh daemon. The serving
instance is killed with -9 two seconds into a 400-token stream, or stopped with SIGSTOP
(``TUNER_STALL_TIMEOUT_S=5``): the seconds from the fault to the client's error, and the
next request's latency and variant (a 16-token completion; the same request on a healthy
instance is the reference). Then SIGSTOP two seconds into a whole (non-streaming) 400-token
answer at the default stall bound: the seconds from the fault to its answer, and the
variant that gave it. Last, a daemon whose speculative preset cannot load: each request's
latency, answered without speculation. ``--engine ik_llama.cpp``: the same on the pool.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import httpx
import openai
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import emit
from tuner.upstream.process import free_port

PINNED = "ngram-simple.n3.m16"
TUNING = f'[search.ngram-simple]\nsize_n = [3]\nsize_m = [16]\n[overrides.all]\npin = "{PINNED}"\n'
BAD_VALUE = {
    "llama.cpp": "--spec-draft-p-min notanumber",
    "ik_llama.cpp": "--draft-p-min notanumber",
}
PROMPT = "Write a long story about a lighthouse keeper and the sea, in many chapters.\n\n"


def _daemon(tmp: Path, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    (tmp / "tuning.toml").write_text(TUNING)
    port = free_port()
    full = {**os.environ, "TUNER_TUNING_FILE": str(tmp / "tuning.toml"), **env}
    argv = [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--state-dir", str(tmp)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=full)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.25)
    raise SystemExit("the daemon did not become ready")


def _instance(proc: subprocess.Popen[bytes]) -> psutil.Process:
    for child in psutil.Process(proc.pid).children(recursive=True):
        argv = " ".join(child.cmdline())
        if "--models-preset" not in argv and "ngram-simple" in argv:
            return child
    raise SystemExit("no instance of the pinned variant")


def _short(client: openai.OpenAI) -> tuple[float, str]:
    """A 16-token completion: its latency and the variant that served it."""
    started = time.monotonic()
    raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=16)
    raw.parse()
    return time.monotonic() - started, raw.headers.get("x-spec-variant", "")


def _fault(sig: int) -> dict[str, Any]:
    """A fresh daemon whose pinned instance faults 2 s into a stream: seconds to the
    client's error, and the next request's latency and variant."""
    with TemporaryDirectory() as tmp:
        proc, url = _daemon(Path(tmp), TUNER_STALL_TIMEOUT_S="5")
        client = openai.OpenAI(api_key="-", base_url=url + "/v1", max_retries=0, timeout=300)
        try:
            return _faulted(client, proc, sig)
        finally:
            client.close()
            proc.terminate()
            proc.wait(60)


def _in_two_seconds(instance: psutil.Process, sig: int) -> list[float]:
    """Send ``sig`` to the instance two seconds from now; the time it went, once it has."""
    at = [0.0]

    def fault() -> None:
        time.sleep(2.0)
        at[0] = time.monotonic()
        instance.send_signal(sig)

    threading.Thread(target=fault, daemon=True).start()
    return at


def _stopped_whole() -> dict[str, Any]:
    """A fresh daemon at the default stall bound whose pinned instance is stopped 2 s into
    a whole answer: seconds from the fault to the answer, and the variant that gave it."""
    with TemporaryDirectory() as tmp:
        proc, url = _daemon(Path(tmp))
        client = openai.OpenAI(api_key="-", base_url=url + "/v1", max_retries=0, timeout=300)
        try:
            client.completions.create(model="x", prompt="Hello", max_tokens=2)  # loaded
            instance = _instance(proc)
            at = _in_two_seconds(instance, signal.SIGSTOP)
            raw = client.completions.with_raw_response.create(
                model="x", prompt=PROMPT, max_tokens=400
            )
            raw.parse()
            if instance.is_running() and instance.status() == psutil.STATUS_STOPPED:
                instance.kill()
            return {
                "to_answer_s": round(time.monotonic() - at[0], 2),
                "variant": raw.headers.get("x-spec-variant", ""),
                "role": raw.headers.get("x-spec-role", ""),
            }
        finally:
            client.close()
            proc.terminate()
            proc.wait(60)


def _faulted(client: openai.OpenAI, proc: subprocess.Popen[bytes], sig: int) -> dict[str, Any]:
    client.completions.create(model="x", prompt="Hello", max_tokens=2)  # loaded
    instance = _instance(proc)
    at = _in_two_seconds(instance, sig)
    try:
        for _ in client.completions.create(model="x", prompt=PROMPT, max_tokens=400, stream=True):
            pass
        raise SystemExit("the stream was not cut")
    except openai.APIError:
        to_error = time.monotonic() - at[0]
    seconds, variant = _short(client)
    if instance.is_running() and instance.status() == psutil.STATUS_STOPPED:
        instance.kill()
    return {
        "to_error_s": round(to_error, 2),
        "next_request_s": round(seconds, 2),
        "next_variant": variant,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "ik_llama.cpp"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ["TUNER_ENGINE"] = args.engine  # every daemon below runs on it
    result: dict[str, Any] = {"rounds": args.rounds, "engine": args.engine}
    with TemporaryDirectory() as tmp:
        proc, url = _daemon(Path(tmp))
        client = openai.OpenAI(api_key="-", base_url=url + "/v1", max_retries=0, timeout=300)
        _short(client)
        healthy = statistics.median(_short(client)[0] for _ in range(5))
        result["healthy_request_s"] = round(healthy, 2)
        client.close()
        proc.terminate()
        proc.wait(60)
    for name, sig in (("kill_9", signal.SIGKILL), ("sigstop", signal.SIGSTOP)):
        result[name] = [_fault(sig) for _ in range(args.rounds)]
    result["sigstop_whole_answer"] = [_stopped_whole() for _ in range(args.rounds)]
    with TemporaryDirectory() as tmp:
        proc, url = _daemon(Path(tmp), TUNER_SPEC_ARGS=BAD_VALUE[args.engine])
        client = openai.OpenAI(api_key="-", base_url=url + "/v1", max_retries=0, timeout=300)
        shorts = [_short(client) for _ in range(6)]
        result["preset_cannot_load"] = [{"s": round(s, 2), "variant": v} for s, v in shorts]
        client.close()
        proc.terminate()
        proc.wait(60)
    emit(result, args.out)


if __name__ == "__main__":
    main()
