"""``tuner bench``: replay a workload against no speculation, a static matrix, and the tuner.

Two servers run side by side, both on the configured model and build:

- the **matrix**: one llama-server in router mode with a preset per static arm
  (``none`` and every matrix variant), asked directly with ``model`` = the arm;
- the **tuner**: the real daemon (``python -m tuner serve``) from a fresh state dir
  with a fixed seed, learning online from the run's own stream; the proxy's
  ``x-spec-variant``, ``x-spec-role`` and ``x-spec-class`` headers say what it did.

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
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tuner.atomic import write_atomic
from tuner.bench import machine
from tuner.bench.analyse import FinalPolicy, summarize
from tuner.bench.rows import parse_rows
from tuner.bench.schedule import CHALLENGER, TUNER, Step, schedule
from tuner.classify import classify, load_definitions
from tuner.errors import ConfigError, UpstreamError
from tuner.model.gguf_facts import read_facts
from tuner.model.profile import hardware_fingerprint
from tuner.settings import Settings
from tuner.tuning.capacity import instances_that_fit
from tuner.tuning.plan import tuning_config, write_presets
from tuner.tuning.state import POLICY_FILE
from tuner.tuning.variants import BASELINE, Variant, parse_name
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import Prepared, prepare, router_argv
from tuner.upstream.process import ManagedServer, die_with_parent, free_port
from tuner.upstream.provision import Progress, stderr_progress
from tuner.workload import WorkloadItem

__all__ = ["DEFAULT_MATRIX", "BenchOptions", "finish", "matrix_variants", "run_bench"]


BUSY_WARNING = 0.05  # a share of the machine's CPU used by others worth a warning


def _state_dir(workdir: Path, arm: str) -> Path:
    """A tuner arm's daemon state dir inside the run directory (``tuner-state``, ...)."""
    return workdir / f"{arm}-state"


# One or more settings per spec type: each type's build defaults, and a few tuned ones.
DEFAULT_MATRIX = (
    "ngram-simple",
    "ngram-simple.n3.m16",
    "ngram-simple.n12.m48",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-mod.match12.max16",
    "ngram-cache",
    "draft-simple",
    "draft-simple.max8",
)


@dataclass(frozen=True, slots=True)
class BenchOptions:
    out: Path
    requests: int = 500
    repeats: int = 1
    baseline_repeats: int = 1  # baseline requests per item in each matrix repeat
    seed: int = 0
    matrix: tuple[str, ...] = DEFAULT_MATRIX
    explore_share: float | None = None
    max_tokens: int | None = None
    challenger: Path | None = None  # a second tuner's tuning file, run side by side
    # the challenger daemon's own settings (TUNER_* environment variables), e.g. its
    # TUNER_MAX_INSTANCES: daemon settings, not tuning-file keys
    challenger_env: tuple[tuple[str, str], ...] = ()


def matrix_variants(names: Sequence[str], prepared: Prepared) -> list[Variant]:
    """The matrix's variants this build can run (draft types only with a draft model)."""
    out: list[Variant] = []
    for name in names:
        try:
            variant = parse_name(name)
        except ValueError as exc:
            raise ConfigError(f"matrix: {exc}") from exc
        try:
            variant.flags(prepared.capabilities, prepared.draft)
        except ValueError:
            continue  # not in this build, or no draft model
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
async def _matrix_server(
    settings: Settings, prepared: Prepared, variants: Sequence[Variant], workdir: Path
) -> AsyncIterator[str]:
    presets = workdir / "matrix-presets.ini"
    arms = [BASELINE, *variants]
    write_presets(presets, arms, settings, prepared)
    facts = read_facts(prepared.model)
    capacity = instances_that_fit(facts, settings.ctx_size, gpu=prepared.gpu, limit=len(arms))
    port = free_port()
    client = UpstreamClient(f"http://127.0.0.1:{port}", read_timeout_s=settings.request_timeout_s)
    argv = router_argv(
        prepared.binary, settings, prepared.capabilities, presets, capacity.instances, port
    )
    server = ManagedServer(argv, client, log_path=workdir / "matrix-llama-server.log")
    await server.start()
    try:
        await server.wait_ready(settings.startup_timeout_s)
        yield f"http://127.0.0.1:{port}"
    finally:
        await server.stop()
        await client.aclose()


def _daemon_env(
    settings: Settings,
    prepared: Prepared,
    state: Path,
    port: int,
    options: BenchOptions,
    tuning: Path | None = None,
) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("TUNER_UPSTREAM_URL", None)
    env.update(
        TUNER_STATE_DIR=str(state),
        TUNER_PORT=str(port),
        TUNER_HOST="127.0.0.1",
        TUNER_SEED=str(options.seed),
        TUNER_TUNE="true",
        TUNER_API_KEYS="",
        TUNER_LOG_FORMAT="json",
        TUNER_LLAMA_SERVER=str(prepared.binary),
        TUNER_MODEL=str(prepared.model),
        TUNER_CACHE_DIR=str(settings.cache_dir),
        TUNER_CTX_SIZE=str(settings.ctx_size),
    )
    if prepared.draft is not None:
        env["TUNER_DRAFT_MODEL"] = str(prepared.draft)
    if settings.spec_args:
        env["TUNER_SPEC_ARGS"] = shlex.join(settings.spec_args)
    if tuning is not None:  # the challenger: its own file decides, explore_share included
        env["TUNER_TUNING_FILE"] = str(tuning)
        env.pop("TUNER_EXPLORE_SHARE", None)
        env.update(options.challenger_env)
    elif options.explore_share is not None:
        env["TUNER_EXPLORE_SHARE"] = str(options.explore_share)
    return env


@asynccontextmanager
async def _tuner_daemon(
    settings: Settings,
    prepared: Prepared,
    options: BenchOptions,
    workdir: Path,
    arm: str = TUNER,
    tuning: Path | None = None,
) -> AsyncIterator[str]:
    """The real daemon from a fresh state dir (``<arm>-state`` under ``workdir``, its log
    ``<arm>-daemon.log``), with ``tuning`` as its tuning file if given; its URL."""
    state = _state_dir(workdir, arm)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / f"{arm}-daemon.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuner", "serve",
        env=_daemon_env(settings, prepared, state, port, options, tuning),
        stdout=log, stderr=log, start_new_session=True,
        # killed with the bench (even by SIGKILL), it still drains and stops its servers
        preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + settings.startup_timeout_s
        async with httpx.AsyncClient(timeout=5.0) as http:
            while True:
                if process.returncode is not None:
                    raise UpstreamError(f"the daemon exited ({process.returncode}); see {log.name}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url + "/ready")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise UpstreamError(f"the daemon was not ready in time; see {log.name}")
                await asyncio.sleep(0.25)
        yield url
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 60)
            except TimeoutError:
                process.kill()
                await process.wait()
        log.close()


def _final_policies(state: Path) -> dict[str, FinalPolicy]:
    """Class key -> its policy when the daemon stopped (it writes the file on the way out).

    A class without a policy of its own is served by its parent's (``served_by``).
    """
    try:
        data = json.loads((state / POLICY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    classes = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(classes, dict):
        return {}

    def own(key: object) -> FinalPolicy | None:
        entry = classes.get(key) if isinstance(key, str) else None
        policy = entry.get("policy") if isinstance(entry, dict) else None
        if not isinstance(entry, dict) or not isinstance(policy, dict):
            return None
        if not isinstance(policy.get("variant"), str):
            return None
        settled = bool(policy.get("settled") or entry.get("converged"))
        return FinalPolicy(policy["variant"], settled, str(policy.get("reason", "")))

    out: dict[str, FinalPolicy] = {}
    for key, entry in classes.items():
        parent = entry.get("served_by") if isinstance(entry, dict) else None
        found = own(parent) if parent and parent != key else own(key)
        if found is not None:
            out[key] = found
    return out


@contextlib.contextmanager
def _cancelled_by_sigterm() -> Iterator[None]:
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
    with _cancelled_by_sigterm():
        return await _run_bench(settings, items, options, progress)


async def _run_bench(
    settings: Settings,
    items: Sequence[WorkloadItem],
    options: BenchOptions,
    progress: Progress,
) -> dict[str, Any]:
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(settings, progress)
    variants = matrix_variants(options.matrix, prepared)
    arms = [BASELINE.name, *(v.name for v in variants)]
    definitions = load_definitions(settings.classes_file)
    item_classes = [classify(i.model_dump(exclude_none=True), definitions).key for i in items]
    challenger = options.challenger if options.requests else None
    steps = schedule(
        len(items), arms, requests=options.requests, repeats=options.repeats, seed=options.seed,
        challenger=challenger is not None, baseline=options.baseline_repeats,
    )  # fmt: skip
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
        "build": prepared.capabilities.commit,
        "hardware": hardware,
        "seed": options.seed,
        "repeats": options.repeats,
        "baseline_repeats": options.baseline_repeats,
        "tuner_requests_planned": options.requests,
        "explore_share": options.explore_share
        if options.explore_share is not None
        else tuning_config(settings).budget.explore_share,
        "max_tokens": options.max_tokens,
    }
    if challenger is not None:
        meta["challenger_tuning"] = str(challenger)
        meta["challenger_env"] = dict(options.challenger_env)
    write_atomic(out / "run.json", json.dumps(meta, indent=2) + "\n")
    rows_path = out / "requests.jsonl"
    rows: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        progress("starting the static-matrix llama-server (router mode)")
        matrix_url = await stack.enter_async_context(
            _matrix_server(settings, prepared, variants, out)
        )
        urls = {"matrix": matrix_url}
        if options.requests:
            progress("starting the tuner daemon from a fresh state")
            urls[TUNER] = await stack.enter_async_context(
                _tuner_daemon(settings, prepared, options, out)
            )
        if challenger is not None:
            progress(
                f"starting the challenger daemon (tuning file {challenger}) from a fresh state"
            )
            urls[CHALLENGER] = await stack.enter_async_context(
                _tuner_daemon(settings, prepared, options, out, CHALLENGER, challenger)
            )
        timeout = settings.request_timeout_s
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout))
        quiet = _Quiet(http, urls)
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
    final = _final_policies(_state_dir(out, TUNER))
    challenger = _final_policies(_state_dir(out, CHALLENGER))
    try:
        summary = summarize(
            rows, item_classes, final_policies=final, challenger_policies=challenger,
            meta=meta, seed=int(meta.get("seed", 0)),
        )  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"{out}: {exc}") from exc
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
    """Send one step: a tuner's (``urls[TUNER]`` or ``urls[CHALLENGER]``) or a static arm's
    (``urls["matrix"]``, the arm as the model); its row."""
    item = items[step.item]
    row: dict[str, Any] = {
        "arm": step.arm, "item": step.item, "id": item.id, "repeat": step.repeat,
        "class": item_classes[step.item], "t": time.time(),
    }  # fmt: skip
    sent = time.monotonic()
    try:
        if step.arm in (TUNER, CHALLENGER):
            data, headers = await _send(http, urls[step.arm], item, None, options.max_tokens)
            row["variant"] = headers.get("x-spec-variant")
            row["role"] = headers.get("x-spec-role")
            row["daemon_class"] = headers.get("x-spec-class")
        else:
            data, headers = await _send(http, urls["matrix"], item, step.arm, options.max_tokens)
            row["variant"] = step.arm
        _timings(row, data)
        # what the client waited, model loads and queueing included (the ratios use
        # llama-server's decode time, which has neither)
        row["wall_ms"] = round((time.monotonic() - sent) * 1000, 1)
    except (httpx.HTTPError, UpstreamError, ValueError) as exc:
        row["error"] = str(exc) or type(exc).__name__
    return row


class _Quiet:
    """After a daemon's request, wait until its background replays are done, so that they
    never run beside another arm's request.

    Reads the daemon's ``/metrics``: done once ``tuner_counterfactual_offered_total`` has
    counted every answered request sent and ``tuner_counterfactual_pending`` is 0 (a daemon
    without replays has neither: nothing to wait for).
    """

    TIMEOUT_S = 10.0

    def __init__(self, http: httpx.AsyncClient, urls: Mapping[str, str]) -> None:
        self.http = http
        self.urls = urls
        self.answered: dict[str, int] = {}

    async def wait(self, arm: str) -> None:
        answered = self.answered[arm] = self.answered.get(arm, 0) + 1
        deadline = time.monotonic() + self.TIMEOUT_S
        while True:
            found = await self._read(arm)
            if found is None:
                return
            offered, pending = found
            if (offered >= answered and pending == 0) or time.monotonic() > deadline:
                return
            await asyncio.sleep(0.02)

    async def _read(self, arm: str) -> tuple[float, float] | None:
        try:
            text = (await self.http.get(self.urls[arm] + "/metrics")).text
            values = {
                sample.name: sample.value
                for family in text_string_to_metric_families(text)
                if family.name.startswith("tuner_counterfactual_")
                for sample in family.samples
            }
        except (httpx.HTTPError, ValueError):
            return None
        if "tuner_counterfactual_offered_total" not in values:
            return None
        return (
            values["tuner_counterfactual_offered_total"],
            values.get("tuner_counterfactual_pending", 0.0),
        )


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
