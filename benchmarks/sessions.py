"""Conversations side by side: each session's turns replayed in order, with the same history,
through one plain llama-server per static setting and through the daemon from a fresh state.

Every arm sees the very same prompts: a turn re-sends the session's fixed history (its
earlier user messages and the workload's assistant replies), not what the arm answered. Per
arm, from the servers' own timings: the share of later turns' prompt tokens processed again
(not from the cache), prefill and decode seconds apart, and the whole sessions' time. Turns
where an answer repeats itself verbatim (a greedy loop, which flatters n-gram drafting) are
flagged, and the summary is given with and without them. Sessions run one after another,
each through every arm in turn (the order rotated per session), one request at a time.

    python benchmarks/sessions.py --workload benchmarks/workloads/sessions.jsonl \\
        --arms none,ngram-mod,ngram-simple.n3.m16 --out benchmarks/results/sessions/run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import start_llama_server
from tuner.bench.daemons import BenchOptions, Quiet, daemon_env
from tuner.settings import Settings
from tuner.tuning.variants import parse_name
from tuner.upstream.launch import Prepared, prepare
from tuner.upstream.process import die_with_parent, free_port

TUNER = "tuner"
LOOP_WINDOW = 24  # an answer whose last characters occur this many times over loops


def looping(text: str, window: int = LOOP_WINDOW, times: int = 3) -> bool:
    """Whether an answer repeats itself verbatim: its last ``window`` characters occur
    ``times`` times or more (a greedy loop)."""
    tail = text[-window:]
    return len(text) >= window * times and len(tail.strip()) > 4 and text.count(tail) >= times


def static_server(prepared: Prepared, arm: str, ctx: int, workdir: Path) -> tuple[Any, str]:
    flags = parse_name(arm).flags(prepared.capabilities)
    argv = [str(prepared.binary), "-m", str(prepared.model), "--ctx-size", str(ctx), *flags]
    log = (workdir / f"{arm}.log").open("wb")
    return start_llama_server(argv, log=log, timeout_s=120)


@contextlib.contextmanager
def tuner_daemon(
    prepared: Prepared, ctx: int, workdir: Path, seed: int, warm: Path | None = None
) -> Iterator[str]:
    """The daemon from a fresh state dir, or from a copy of ``warm`` (an earlier run's)."""
    state = workdir / "tuner-state"
    shutil.rmtree(state, ignore_errors=True)
    if warm is not None:
        shutil.copytree(warm, state, ignore=shutil.ignore_patterns("*.lock", "records"))
    state.mkdir(parents=True, exist_ok=True)
    port = free_port()
    settings = Settings(ctx_size=ctx)
    env = daemon_env(settings, prepared, state, port, BenchOptions(out=workdir, seed=seed))
    log = (workdir / "tuner-daemon.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tuner", "serve"],
        env=env,
        stdout=log,
        stderr=log,
        preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),  # killed with the bench
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            if process.poll() is not None:
                raise SystemExit(f"the daemon exited; see {log.name}")
            time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def messages_for(session: dict[str, Any], turn: int) -> list[dict[str, str]]:
    out = [{"role": "system", "content": session["system"]}]
    for earlier in session["turns"][:turn]:
        out += [
            {"role": "user", "content": earlier["user"]},
            {"role": "assistant", "content": earlier["assistant"]},
        ]
    return [*out, {"role": "user", "content": session["turns"][turn]["user"]}]


def send(
    http: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """One streamed turn: the server's timings, the time to its first token and in all."""
    body = {
        "model": "m",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    timings: dict[str, Any] = {}
    parts: list[str] = []
    with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        variant = response.headers.get("x-spec-variant")
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if "error" in chunk:  # the server gave up mid-stream (its KV cache was full, say)
                raise httpx.HTTPError(json.dumps(chunk["error"])[:300])
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first if first is not None else time.perf_counter()
                    parts.append(text)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "ttft_s": (first or time.perf_counter()) - started,
        "variant": variant,
        "cache_n": timings.get("cache_n", 0),
        "prompt_n": timings.get("prompt_n", 0),
        "prompt_ms": timings.get("prompt_ms", 0.0),
        "predicted_n": timings.get("predicted_n", 0),
        "predicted_ms": timings.get("predicted_ms", 0.0),
        "draft_n": timings.get("draft_n", 0),
        "draft_n_accepted": timings.get("draft_n_accepted", 0),
        "looping": looping("".join(parts)),
    }


def replay(
    url: str, sessions: list[dict[str, Any]], clients: int, max_tokens: int, after: Any
) -> tuple[list[dict[str, Any]], float]:
    """Every session's turns in order, ``clients`` sessions at a time (each client takes the
    next session when its own ends); the rows and the wall time."""
    queue = list(reversed(sessions))
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []

    def client() -> None:
        # a new connection per request: a kept-alive one the server has just closed fails
        # the next request before it is sent ("disconnected without sending a response")
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=900, limits=fresh) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    session = queue.pop()
                for turn in range(len(session["turns"])):
                    try:
                        found = send(http, url, messages_for(session, turn), max_tokens)
                    except httpx.HTTPError as exc:  # counted, never dropped
                        found = {"error": repr(exc)[:300]}
                    with lock:
                        rows.append({"session": session["id"], "turn": turn, **found})
                    if clients == 1:
                        after()

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return rows, time.perf_counter() - started


def _p95(values: list[float]) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else None


def totals(mine: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One arm at one number of clients: prompt tokens processed again, prefill and decode
    seconds (the servers' own), the whole time, throughput and time to first token."""
    errors = sum("error" in r for r in mine)
    mine = [r for r in mine if "error" not in r]
    later = [r for r in mine if r["turn"] > 0]
    held = sum(r["cache_n"] + r["prompt_n"] for r in later)
    prefill = sum(r["prompt_ms"] for r in mine) / 1000
    decode = sum(r["predicted_ms"] for r in mine) / 1000
    tokens = sum(r["predicted_n"] for r in mine)
    ordered = sorted(mine, key=lambda r: (r["session"], r["turn"]))
    moves = sum(
        b["session"] == a["session"] and b["variant"] != a["variant"]
        for a, b in itertools.pairwise(ordered)
    )
    return {
        "turns": len(mine),
        "errors": errors,
        "reprocessed_share": round(sum(r["prompt_n"] for r in later) / held, 4) if held else None,
        "prefill_s": round(prefill, 2),
        "later_prefill_s": round(sum(r["prompt_ms"] for r in later) / 1000, 2),
        "decode_s": round(decode, 2),
        "total_s": round(prefill + decode, 2),
        "decode_tok_s": round(tokens / decode, 1) if decode else None,
        "wall_s": round(wall, 2),
        "throughput_tok_s": round(tokens / wall, 2) if wall else None,
        "ttft_p95_s": _p95([r["ttft_s"] for r in mine]),
        "moves": moves,
    }


def summarise(
    rows: list[dict[str, Any]], walls: dict[tuple[str, int], float], arms: list[str]
) -> dict[str, Any]:
    """Per number of clients and arm (``totals``); the tuner against the best static arm:
    whole time at one client, throughput and p95 time to first token at more; over every
    turn, and at one client also over the turns no arm looped on."""
    out: dict[str, Any] = {}
    for clients in sorted({r["clients"] for r in rows}):
        level = [r for r in rows if r["clients"] == clients]
        loops = {(r["session"], r["turn"]) for r in level if r.get("looping")}
        sections: dict[str, set[tuple[str, int]]] = {"all": set()}
        if clients == 1 and loops:
            sections["no_loops"] = loops
        found: dict[str, Any] = {"looping_turns": sorted(f"{s}#{t}" for s, t in loops)}
        for label, skip in sections.items():
            per = {
                arm: totals(
                    [r for r in level if r["arm"] == arm and (r["session"], r["turn"]) not in skip],
                    walls[(arm, clients)],
                )
                for arm in arms
            }
            static = [a for a in arms if a != TUNER]
            best = min(static, key=lambda a: per[a]["total_s"])
            section: dict[str, Any] = {"arms": per, "best_static": best}
            if TUNER in per:
                mine = per[TUNER]
                section["tuner_vs_best_static_time"] = round(
                    per[best]["total_s"] / mine["total_s"], 3
                )
                top = max(static, key=lambda a: per[a]["throughput_tok_s"] or 0.0)
                section["best_static_throughput"] = top
                section["tuner_vs_best_static_throughput"] = round(
                    mine["throughput_tok_s"] / per[top]["throughput_tok_s"], 3
                )
                section["tuner_ttft_p95_vs_best_static"] = round(
                    mine["ttft_p95_s"] / per[top]["ttft_p95_s"], 3
                )
                plain = per.get("none", {}).get("reprocessed_share")
                if plain is not None and mine["reprocessed_share"] is not None:
                    extra = mine["reprocessed_share"] - plain
                    section["tuner_reprocessed_above_plain_pp"] = round(100 * extra, 2)
            found[label] = section
        sessions: dict[str, dict[str, Any]] = {}
        for r in level:
            if "error" in r:
                continue
            mine = sessions.setdefault(r["session"], {})
            mine[r["arm"]] = round(
                mine.get(r["arm"], 0.0) + (r["prompt_ms"] + r["predicted_ms"]) / 1000, 2
            )
            if r["arm"] == TUNER and r["turn"] == 0:
                mine["tuner_first_variant"] = r["variant"]
        found["sessions_total_s"] = sessions
        out[f"clients_{clients}"] = found
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", type=Path, required=True)
    parser.add_argument("--arms", default="none,ngram-mod,ngram-simple.n3.m16")
    parser.add_argument("--sessions", type=int, default=0, help="first N sessions (0: all)")
    parser.add_argument("--clients", default="1", help="numbers of concurrent clients, e.g. 1,2,4")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ctx-size", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=67)
    parser.add_argument("--no-tuner", action="store_true")
    parser.add_argument("--warm", type=Path, help="start the daemon from a copy of this state")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sessions = [json.loads(line) for line in args.workload.read_text().splitlines() if line]
    sessions = sessions[: args.sessions or None]
    args.out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(Settings())
    static = args.arms.split(",")
    arms = static + ([] if args.no_tuner else [TUNER])
    servers = {arm: static_server(prepared, arm, args.ctx_size, args.out) for arm in static}
    urls = {arm: url for arm, (_, url) in servers.items()}
    rows: list[dict[str, Any]] = []
    walls: dict[tuple[str, int], float] = {}

    def run(arm: str, group: list[dict[str, Any]], clients: int) -> None:
        after = functools.partial(quiet.wait, arm) if arm == TUNER else lambda: None
        found, wall = replay(urls[arm], group, clients, args.max_tokens, after)
        rows.extend({"arm": arm, "clients": clients, **r} for r in found)
        if clients == 1:  # one request at a time: its own times, not the replays' waits
            wall = sum(r.get("wall_s", 0.0) for r in found)
        walls[(arm, clients)] = walls.get((arm, clients), 0.0) + wall

    with contextlib.ExitStack() as stack:
        if not args.no_tuner:
            urls[TUNER] = stack.enter_context(
                tuner_daemon(prepared, args.ctx_size, args.out, args.seed, args.warm)
            )
        quiet = _SyncQuiet(urls)
        for level, clients in enumerate(int(c) for c in args.clients.split(",")):
            if clients == 1:  # session by session, each through every arm in turn
                for i, session in enumerate(sessions):
                    for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
                        run(arm, [session], 1)
            else:  # the whole workload per arm, the arms' order rotated per level
                for arm in arms[level % len(arms) :] + arms[: level % len(arms)]:
                    run(arm, sessions, clients)
            print(f"{clients} client(s) done", file=sys.stderr, flush=True)
    for process, _ in servers.values():
        process.terminate()
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "command": " ".join(sys.argv),
        "workload": str(args.workload),
        "max_tokens": args.max_tokens,
        "ctx_size": args.ctx_size,
        "tuner": f"warm from {args.warm}" if args.warm else "fresh state",
        **summarise(rows, walls, arms),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


class _SyncQuiet:
    """``tuner.bench.daemons.Quiet`` from synchronous code: wait for the daemon's replays."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.answered: dict[str, int] = {}

    def wait(self, arm: str) -> None:
        async def run() -> None:
            async with httpx.AsyncClient(timeout=5) as http:
                quiet = Quiet(http, self.urls)
                quiet.answered = dict(self.answered)
                await quiet.wait(arm)
                self.answered = quiet.answered

        asyncio.run(run())


if __name__ == "__main__":
    main()
