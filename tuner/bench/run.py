"""``tuner bench``: replay a workload against no speculation, a static matrix, and the tuner.

Servers run side by side, on the configured model and build:

- the **matrix**: one llama-server in router mode with a preset per static arm
  (``none`` and every matrix variant), asked directly with ``model`` = the arm;
- the **tuner**: the real daemon (``python -m tuner serve``) from a fresh state dir
  with a fixed seed, learning online from the run's own stream; the proxy's
  ``x-spec-variant``, ``x-spec-role`` and ``x-spec-class`` headers say what it did;
- with ``--peer``, another build's llama-server, one per peer arm (``tuner.bench.peers``),
  its arms in each prompt's block beside the matrix's.

Requests go one at a time in the order of ``tuner.bench.schedule`` (so no two
decode at once and the matrix is spread through the tuner's stream). Every answer
is appended to ``DIR/requests.jsonl`` as it arrives; at the end ``DIR/summary.json``
(``tuner.bench.analyse``), ``DIR/summary.md`` and ``DIR/summary.png`` are written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import shlex
import signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from tuner.atomic import write_atomic
from tuner.bench import machine
from tuner.bench.analyse import summarize
from tuner.bench.beliefs import beliefs, lock_in
from tuner.bench.daemons import (
    DEFAULT_MATRIX,
    BenchOptions,
    Quiet,
    final_policies,
    final_speedups,
    state_dir,
    tuner_daemon,
)
from tuner.bench.engine import bench_engine, tuner_engine
from tuner.bench.peers import peer_servers
from tuner.bench.rows import AUTOTUNE_PREFIX, PEER_BASELINE, is_peer, parse_rows
from tuner.bench.schedule import CHALLENGER, TUNER, Step, schedule
from tuner.classify import classify, load_definitions
from tuner.daemon.capacity import instances_that_fit
from tuner.daemon.plan import draft_kind, pool_members, sized, tuning_config, write_presets
from tuner.engines.choice import CHOICE_FILE, load_choice
from tuner.errors import ConfigError, UpstreamError
from tuner.model.gguf_facts import read_facts
from tuner.profiles import hardware_fingerprint
from tuner.settings import Settings
from tuner.tuning.variants import BASELINE, Variant, parse_name, unavailable
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import Prepared, instance_argv, router_argv
from tuner.upstream.pool import POOL_URL, Pool
from tuner.upstream.process import ManagedServer, free_port
from tuner.upstream.provision import Progress, stderr_progress
from tuner.workload import WorkloadItem

__all__ = [
    "DEFAULT_MATRIX",
    "BenchOptions",
    "cancelled_by_sigterm",
    "finish",
    "matrix_server",
    "matrix_variants",
    "run_bench",
]


BUSY_WARNING = 0.05  # a share of the machine's CPU used by others worth a warning


def matrix_variants(names: Sequence[str], prepared: Prepared) -> list[Variant]:
    """The matrix's variants this build, target and draft can run (draft types only with a
    draft model, ``draft-mtp`` only on a target with MTP layers)."""
    out: list[Variant] = []
    mtp_layers = read_facts(prepared.model).nextn_layers
    kind = draft_kind(read_facts(prepared.draft) if prepared.draft else None)
    for name in names:
        try:
            variant = parse_name(name)
        except ValueError as exc:
            raise ConfigError(f"matrix: {exc}") from exc
        if unavailable(variant.spec_type, prepared.capabilities, draft=kind, mtp_layers=mtp_layers):
            continue
        if variant != BASELINE and variant not in out:
            out.append(variant)
    return out


def _timings(row: dict[str, Any], data: dict[str, Any]) -> None:
    timings = data.get("timings") or {}
    row["tokens"] = int(timings.get("predicted_n", 0))
    row["ms"] = float(timings.get("predicted_ms", 0.0))
    row["drafted"] = int(timings.get("draft_n", 0) or 0)
    row["accepted"] = int(timings.get("draft_n_accepted", 0) or 0)
    if not timings:
        row["error"] = "the answer had no timings"


async def _send(
    http: httpx.AsyncClient, url: str, item: WorkloadItem, model: str | None, max_tokens: int | None
) -> tuple[dict[str, Any], httpx.Headers]:
    path, body = item.request(max_tokens)
    if model is not None:
        body["model"] = model
    try:
        response = await http.post(url + path, json=body)
    except httpx.RemoteProtocolError:  # llama-server closed a pooled connection: once more
        response = await http.post(url + path, json=body)
    if response.status_code >= 400:
        raise UpstreamError(f"{response.status_code}: {response.text[:300]}")
    data: dict[str, Any] = response.json()
    return data, response.headers


@asynccontextmanager
async def matrix_server(
    settings: Settings, prepared: Prepared, variants: Sequence[Variant], workdir: Path
) -> AsyncIterator[tuple[str, httpx.AsyncBaseTransport | None]]:
    """The static arms' server: llama-server's router, or where the engine has none the
    daemon's pool (its address is then a transport the bench's client mounts). Each arm's
    settings are on its command line, as a user would start a static server."""
    arms = [BASELINE, *variants]
    facts = read_facts(prepared.model)
    capacity = instances_that_fit(facts, settings.ctx_size, gpu=prepared.gpu, limit=len(arms))
    if not prepared.capabilities.router:
        members = pool_members(arms, settings, prepared, per_request=False)
        launch = functools.partial(instance_argv, prepared, settings)
        pool = Pool(members, launch, capacity=capacity.instances, log_dir=workdir / "matrix-pool")
        await pool.start()
        try:
            await pool.wait_ready(settings.startup_timeout_s)
            yield POOL_URL, pool
        finally:
            await pool.stop()
        return
    presets = write_presets(workdir, arms, settings, prepared)
    port = free_port()
    client = UpstreamClient(f"http://127.0.0.1:{port}", read_timeout_s=settings.request_timeout_s)
    argv = router_argv(
        prepared.binary, settings, prepared.capabilities, presets, capacity.instances, port
    )
    server = ManagedServer(argv, client, log_path=workdir / "matrix-llama-server.log")
    await server.start()
    try:
        await server.wait_ready(settings.startup_timeout_s)
        yield f"http://127.0.0.1:{port}", None
    finally:
        await server.stop()
        await client.aclose()


def autotune_arms(prepared: Prepared) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The engine's own per-step tuning (ik_llama.cpp's ``--spec-autotune``) on each n-gram
    type it tunes, as peer arms of the engine's own binary (none where it has no autotune)."""
    caps = prepared.capabilities
    if not caps.autotune:
        return ()
    return tuple(
        (f"{AUTOTUNE_PREFIX}{kind}", ("--spec-type", kind, "--spec-autotune"))
        for kind in ("ngram-mod", "ngram-simple")
        if caps.supports_spec_type(kind)
    )


@contextlib.contextmanager
def cancelled_by_sigterm() -> Iterator[None]:
    """While the bench runs, SIGTERM (``timeout``, ``kill``, systemd) cancels it as Ctrl-C
    does, so its servers and daemon are stopped on the way out: by default Python dies at
    once, and the daemon, in a session of its own, went on running with its llama-servers."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    try:
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError, ValueError):  # not Unix, or not the main thread
        task = None
    try:
        yield
    finally:
        if task is not None:
            loop.remove_signal_handler(signal.SIGTERM)


async def run_bench(
    settings: Settings,
    items: Sequence[WorkloadItem],
    options: BenchOptions,
    progress: Progress = stderr_progress,
) -> dict[str, Any]:
    """Run the bench; writes ``requests.jsonl``, ``summary.json``, ``summary.md``, the plot.
    SIGTERM cancels it (``asyncio.CancelledError``) after stopping what it started."""
    with cancelled_by_sigterm():
        return await _run_bench(settings, items, options, progress)


async def _run_bench(
    settings: Settings,
    items: Sequence[WorkloadItem],
    options: BenchOptions,
    progress: Progress,
) -> dict[str, Any]:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    engine = await bench_engine(settings, progress)
    prepared = engine.prepared
    settings = sized(settings, prepared)  # every arm and daemon on the same context
    options = replace(options, engines=engine.choice)
    if options.peer is None and autotune_arms(prepared):  # the engine's own tuning, beside
        options = replace(options, peer=prepared.binary, peer_arms=autotune_arms(prepared))
    variants = matrix_variants(options.matrix, prepared)
    arms = [BASELINE.name, *(v.name for v in variants)]
    if options.peer is not None:
        arms += [PEER_BASELINE, *(name for name, _ in options.peer_arms)]
    definitions = load_definitions(settings.classes_file)
    item_classes = [classify(i.model_dump(exclude_none=True), definitions).key for i in items]
    challenger = options.challenger if options.requests else None
    steps = schedule(
        len(items),
        arms,
        requests=options.requests,
        repeats=options.repeats,
        seed=options.seed,
        challenger=challenger is not None,
        baseline=options.baseline_repeats,
    )
    progress(
        f"bench: {len(items)} prompts, {len(arms)} static arms x {options.repeats} "
        f"(baseline x {options.repeats * options.baseline_repeats}), "
        f"{options.requests} tuner requests{' (x2: tuner, challenger)' if challenger else ''}: "
        f"{len(steps)} requests"
    )
    hardware = hardware_fingerprint()
    meta = {
        "workload": len(items),
        "model": prepared.model.name,
        "engine": prepared.capabilities.engine,
        "build": prepared.capabilities.commit,
        "tuner_engine": "auto" if engine.tuner_auto else prepared.capabilities.engine,
        "hardware": hardware,
        "seed": options.seed,
        "repeats": options.repeats,
        "baseline_repeats": options.baseline_repeats,
        "tuner_requests_planned": options.requests,
        "explore_share": tuning_config(settings).budget.explore_share,
        "max_tokens": options.max_tokens,
    }
    if challenger is not None:
        meta["challenger_tuning"] = str(challenger)
        meta["challenger_env"] = dict(options.challenger_env)
        if options.challenger_code is not None:
            meta["challenger_code"] = str(options.challenger_code)
    if options.peer is not None:
        meta["peer"] = str(options.peer)
        meta["peer_arms"] = {name: shlex.join(flags) for name, flags in options.peer_arms}
    write_atomic(out / "run.json", json.dumps(meta, indent=2) + "\n")
    rows_path = out / "requests.jsonl"
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        how = "router mode" if prepared.capabilities.router else "a pool, one server per arm"
        progress(f"starting the static matrix ({prepared.capabilities.engine}, {how})")
        matrix_url, matrix_transport = await stack.enter_async_context(
            matrix_server(settings, prepared, variants, out)
        )
        urls = {"matrix": matrix_url}
        if options.peer is not None:
            progress(f"starting the peer's llama-servers ({options.peer}), one per arm")
            urls |= await stack.enter_async_context(
                peer_servers(options.peer, dict(options.peer_arms), settings, prepared.model, out)
            )
        if options.requests:
            progress(
                "starting the tuner daemon from a fresh state"
                + (" (engine auto, with the measurement above)" if engine.tuner_auto else "")
            )
            urls[TUNER] = await stack.enter_async_context(
                tuner_daemon(settings, prepared, options, out)
            )
        if challenger is not None:
            progress(
                f"starting the challenger daemon (tuning file {challenger}) from a fresh state"
            )
            urls[CHALLENGER] = await stack.enter_async_context(
                tuner_daemon(settings, prepared, options, out, CHALLENGER, challenger)
            )
        timeout = settings.request_timeout_s
        mounts = {matrix_url: matrix_transport} if matrix_transport else None
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, mounts=mounts))
        quiet = Quiet(http, urls)
        samples = [machine.sample()]
        with rows_path.open("w") as sink:
            started = time.monotonic()
            for number, step in enumerate(steps, 1):
                row = await _one(http, step, items, item_classes, urls, options)
                if step.arm in (TUNER, CHALLENGER) and not row.get("error"):
                    await quiet.wait(step.arm)
                rows.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()
                if number % 10 == 0 or number == len(steps):
                    samples.append(machine.sample())
                    _report_progress(progress, number, len(steps), started, rows)
    meta["machine"] = load = machine.load(samples, int(hardware.get("cores") or 1))
    write_atomic(out / "run.json", json.dumps(meta, indent=2) + "\n")
    _report_machine(progress, load)
    return finish(out)


def _report_machine(progress: Progress, load: Mapping[str, Any]) -> None:
    """Say so when something outside the bench used the machine while it ran."""
    other = float(load.get("other_share") or 0.0)
    steal = float(load.get("steal_share") or 0.0)
    if other >= BUSY_WARNING or steal >= BUSY_WARNING:
        progress(
            f"warning: while the bench ran, other processes used {other:.0%} of the machine's "
            f"CPU and the hypervisor took {steal:.0%}: ratios within this run compare, its "
            "absolute speeds do not compare with other runs'"
        )


def finish(out: Path) -> dict[str, Any]:
    """Summarize a run directory (again): ``requests.jsonl``, ``run.json``, the tuner's state.

    Writes ``summary.json``, ``summary.md`` and ``summary.png``; ``tuner bench --analyse``.
    """
    from tuner.bench.render import markdown, plot

    try:
        lines = (out / "requests.jsonl").read_text().splitlines()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{out}: no readable requests.jsonl: {exc}") from exc
    try:
        rows = parse_rows(lines)
    except ValueError as exc:
        raise ConfigError(f"{out}/requests.jsonl {exc}") from exc
    try:
        meta: dict[str, Any] = json.loads((out / "run.json").read_text())
    except (OSError, ValueError):
        meta = {}
    classes: dict[int, str] = {int(r["item"]): str(r["class"]) for r in rows}
    item_classes = [classes.get(i, "?") for i in range(max(classes, default=-1) + 1)]
    final = final_policies(state_dir(out, TUNER))
    challenger = final_policies(state_dir(out, CHALLENGER))
    try:
        summary = summarize(
            rows,
            item_classes,
            final_policies=final,
            challenger_policies=challenger,
            meta=meta,
            seed=int(meta.get("seed", 0)),
        )
    except ValueError as exc:
        raise ConfigError(f"{out}: {exc}") from exc
    if (chosen := load_choice(state_dir(out, TUNER) / CHOICE_FILE)) is not None:
        summary["overall"]["tuner_engine"] = tuner_engine(chosen)
    priced = final_speedups(state_dir(out, TUNER))
    same = summary["overall"].get("tuner_same_work") or {}
    # one request's timing noise: a same-work pair's log ratio carries two requests'
    request_sd = same["sd"] / math.sqrt(2) if same.get("sd") else None
    if (pricing := beliefs(summary["classes"], priced, request_sd=request_sd)) is not None:
        summary["pricing"] = pricing | {"lock_in": lock_in(summary["classes"], priced)}
    write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_atomic(out / "summary.md", markdown(summary))
    plot(summary, rows, out / "summary.png")
    return summary


async def _one(
    http: httpx.AsyncClient,
    step: Step,
    items: Sequence[WorkloadItem],
    item_classes: Sequence[str],
    urls: Mapping[str, str],
    options: BenchOptions,
) -> dict[str, Any]:
    """Send one step: a tuner's (``urls[TUNER]`` or ``urls[CHALLENGER]``), a peer arm's
    (``urls[arm]``) or a static arm's (``urls["matrix"]``, the arm as the model); its row."""
    item = items[step.item]
    row: dict[str, Any] = {
        "arm": step.arm,
        "item": step.item,
        "id": item.id,
        "repeat": step.repeat,
        "class": item_classes[step.item],
        "t": time.time(),
    }
    sent = time.monotonic()
    try:
        if step.arm in (TUNER, CHALLENGER):
            data, headers = await _send(http, urls[step.arm], item, None, options.max_tokens)
            row["variant"] = headers.get("x-spec-variant")
            row["role"] = headers.get("x-spec-role")
            row["daemon_class"] = headers.get("x-spec-class")
        else:  # a peer arm has a server of its own (its flags decide), a static arm is a model
            url, model = (urls[step.arm], None) if is_peer(step.arm) else (urls["matrix"], step.arm)
            data, headers = await _send(http, url, item, model, options.max_tokens)
            row["variant"] = step.arm
        _timings(row, data)
        # what the client waited, model loads and queueing included (the ratios use
        # llama-server's decode time, which has neither)
        row["wall_ms"] = round((time.monotonic() - sent) * 1000, 1)
    except (httpx.HTTPError, UpstreamError, ValueError) as exc:
        row["error"] = str(exc) or type(exc).__name__
    return row


def _report_progress(
    progress: Progress, done: int, total: int, started: float, rows: Sequence[dict[str, Any]]
) -> None:
    elapsed = time.monotonic() - started
    eta = elapsed / done * (total - done)
    errors = sum(1 for r in rows if r.get("error"))
    last = rows[-1]
    what = f"{last['arm']} {last.get('variant') or ''} {last['class']}".strip()
    progress(
        f"[{done}/{total}] {elapsed / 60:.1f} min, about {eta / 60:.1f} min left, "
        f"{errors} errors; last: {what}"
    )
