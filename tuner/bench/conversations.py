"""Conversations side by side (``tuner bench --sessions FILE``): each session's turns replayed
in order, with the same history, through every static arm and through the daemon from a
fresh state.

Every arm sees the very same prompts: a turn re-sends the session's fixed history (its
earlier user messages and the workload's assistant replies), not what the arm answered. The
static arms are the bench's matrix server (llama-server's router, or the daemon's pool where
the engine has none: one instance per arm, so each keeps its own prompt cache). At one
client, sessions run one after another, each through every arm in turn (the order rotated
per session); at more, each arm runs the whole workload from that many clients at once.
``tuner.bench.conversation_summary`` makes the sums.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.atomic import write_atomic
from tuner.bench.conversation_summary import looping, messages_for, summarise
from tuner.bench.daemons import BenchOptions, Quiet, tuner_daemon
from tuner.bench.engine import bench_engine
from tuner.bench.run import cancelled_by_sigterm, matrix_server, matrix_variants
from tuner.bench.schedule import TUNER
from tuner.daemon.plan import sized
from tuner.errors import ConfigError
from tuner.records import Timings
from tuner.settings import Settings
from tuner.tuning.variants import BASELINE
from tuner.upstream.provision import Progress, stderr_progress

__all__ = ["SessionOptions", "load_sessions", "run_sessions"]

Turn = dict[str, Any]


@dataclass(frozen=True, slots=True)
class SessionOptions:
    out: Path
    matrix: tuple[str, ...] = ("ngram-mod", "ngram-simple.n3.m16")
    clients: tuple[int, ...] = (1,)
    max_tokens: int = 96
    seed: int = 0
    tuner: bool = True


def load_sessions(path: Path) -> list[dict[str, Any]]:
    """A sessions workload: one JSON object per line with ``id``, ``system`` and ``turns``
    (each a ``user`` message and the ``assistant`` reply the history carries on with), and
    optionally ``fork``: ``after`` a turn, ``subagents`` (sessions of their own) run at once
    before the next turn."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read sessions {path}: {exc}") from exc
    sessions: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            session = json.loads(line)
            ok = _valid(session) and all(_valid(s) for s in _subagents(session))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a session ({exc!r})") from exc
        if not ok:
            raise ConfigError(
                f"{path}:{number}: a session needs a system prompt and turns (a fork: a turn "
                "to follow and sub-agent sessions)"
            )
        session.setdefault("id", f"session-{number}")
        for i, sub in enumerate(_subagents(session)):
            sub.setdefault("id", f"{session['id']}:sub{i}")
        sessions.append(session)
    if not sessions:
        raise ConfigError(f"{path}: no sessions")
    return sessions


def _valid(session: dict[str, Any]) -> bool:
    turns = session["turns"]
    fork = session.get("fork")
    if fork is not None and not (
        isinstance(fork["after"], int) and 0 <= fork["after"] < len(turns) and fork["subagents"]
    ):
        return False
    return (
        bool(turns)
        and isinstance(session["system"], str)
        and all(isinstance(t["user"], str) and isinstance(t["assistant"], str) for t in turns)
    )


def _subagents(session: dict[str, Any]) -> list[dict[str, Any]]:
    fork = session.get("fork")
    return list(fork["subagents"]) if fork else []


async def run_sessions(
    settings: Settings,
    sessions: Sequence[dict[str, Any]],
    options: SessionOptions,
    progress: Progress = stderr_progress,
) -> dict[str, Any]:
    """Run the sessions bench; writes ``turns.jsonl`` and ``summary.json``. SIGTERM cancels
    it after stopping what it started."""
    with cancelled_by_sigterm():
        return await _run(settings, list(sessions), options, progress)


async def _run(
    settings: Settings,
    sessions: list[dict[str, Any]],
    options: SessionOptions,
    progress: Progress,
) -> dict[str, Any]:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    engine = await bench_engine(settings, progress)  # engine auto: the measured faster one
    prepared = engine.prepared
    settings = sized(settings, prepared)  # every arm and the daemon on the same context
    variants = matrix_variants(options.matrix, prepared)
    static = [BASELINE.name, *(v.name for v in variants)]
    arms = static + ([TUNER] if options.tuner else [])
    rows: list[Turn] = []
    walls: dict[tuple[str, int], float] = {}
    async with contextlib.AsyncExitStack() as stack:
        progress(f"starting the static arms ({prepared.capabilities.engine}): {static}")
        url, transport = await stack.enter_async_context(
            matrix_server(settings, prepared, variants, out)
        )
        urls = dict.fromkeys(static, url)
        if options.tuner:
            progress("starting the tuner daemon from a fresh state")
            daemon = BenchOptions(out=out, seed=options.seed, engines=engine.choice)
            urls[TUNER] = await stack.enter_async_context(
                tuner_daemon(settings, prepared, daemon, out)
            )
        mounts = {url: transport} if transport else None
        # a new connection per turn: a kept-alive one llama-server has just closed fails the
        # next request before it is sent ("disconnected without sending a response")
        http = await stack.enter_async_context(
            httpx.AsyncClient(
                timeout=settings.request_timeout_s,
                mounts=mounts,
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        )
        quiet = Quiet(http, urls)

        async def run(arm: str, group: list[dict[str, Any]], clients: int) -> None:
            async def after() -> None:
                if arm == TUNER:
                    await quiet.wait(arm)

            model = "m" if arm == TUNER else arm
            found, wall = await _replay(
                http, urls[arm], model, group, clients, options.max_tokens, after
            )
            rows.extend({"arm": arm, "clients": clients, **r} for r in found)
            if clients == 1:  # one request at a time: its own times, not the replays' waits
                wall = sum(r.get("wall_s", 0.0) for r in found)
            walls[(arm, clients)] = walls.get((arm, clients), 0.0) + wall

        for level, clients in enumerate(options.clients):
            if clients == 1:
                for i, session in enumerate(sessions):
                    for arm in arms[i % len(arms) :] + arms[: i % len(arms)]:
                        await run(arm, [session], 1)
            else:
                for arm in arms[level % len(arms) :] + arms[: level % len(arms)]:
                    await run(arm, sessions, clients)
            progress(f"sessions: {clients} client(s) done")
    write_atomic(out / "turns.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "command": " ".join(sys.argv),
        "engine": prepared.capabilities.engine,
        "sessions": len(sessions),
        "max_tokens": options.max_tokens,
        "ctx_size": settings.ctx_size,
        **summarise(rows, walls, arms),
    }
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


async def _replay(
    http: httpx.AsyncClient,
    url: str,
    model: str,
    sessions: list[dict[str, Any]],
    clients: int,
    max_tokens: int,
    after: Callable[[], Awaitable[None]],
) -> tuple[list[Turn], float]:
    """Every session's turns in order, ``clients`` sessions at a time (each client takes the
    next session when its own ends; a session's sub-agents run at once after the turn they
    fork from; ``after`` runs after each turn at one client); the rows and the wall time."""
    waiting = list(sessions)
    rows: list[Turn] = []

    async def whole(session: dict[str, Any]) -> None:
        fork = session.get("fork")
        for turn in range(len(session["turns"])):
            try:
                found = await _turn(http, url, model, messages_for(session, turn), max_tokens)
            except httpx.HTTPError as exc:  # counted, never dropped
                found = {"error": repr(exc)[:300]}
            rows.append({"session": session["id"], "turn": turn, **found})
            if clients == 1:
                await after()
            if fork is not None and fork["after"] == turn:  # its sub-agents, at once
                await asyncio.gather(*(whole(sub) for sub in fork["subagents"]))

    async def client() -> None:
        while waiting:
            await whole(waiting.pop(0))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return rows, time.perf_counter() - started


async def _turn(
    http: httpx.AsyncClient, url: str, model: str, messages: list[dict[str, str]], max_tokens: int
) -> Turn:
    """One streamed turn, greedy: the server's timings, the time to its first token and in
    all, and whether the answer loops."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    timings: dict[str, Any] = {}
    parts: list[str] = []
    async with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code >= 400:
            said = (await response.aread()).decode(errors="replace")
            raise httpx.HTTPError(f"{response.status_code}: {said[:300]}")
        variant = response.headers.get("x-spec-variant", model)
        async for line in response.aiter_lines():
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
    read = Timings.model_validate(timings)  # ik_llama.cpp's cached count from its n_past
    return {
        "wall_s": time.perf_counter() - started,
        "ttft_s": (first or time.perf_counter()) - started,
        "variant": variant,
        "cache_n": read.cache_n or 0,
        "prompt_n": read.prompt_n or 0,
        "prompt_ms": read.prompt_ms or 0.0,
        "predicted_n": read.predicted_n or 0,
        "predicted_ms": read.predicted_ms or 0.0,
        "draft_n": read.draft_n or 0,
        "draft_n_accepted": read.draft_n_accepted or 0,
        "looping": looping("".join(parts)),
    }
