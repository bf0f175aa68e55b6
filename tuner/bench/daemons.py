"""The bench's daemons: the tuner (and a challenger) as real ``python -m tuner serve``
processes from fresh state dirs, what they decided at the end, and waiting for their
background replays so they never run beside another arm's request.
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
import tomllib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tuner.bench.analyse import FinalPolicy
from tuner.bench.engine import engine_settled
from tuner.bench.schedule import TUNER
from tuner.engines.choice import CHOICE_FILE, EngineChoice, save_choice
from tuner.errors import UpstreamError
from tuner.settings import Settings
from tuner.tuning.config import tuning_text
from tuner.tuning.runtime.policy_file import POLICY_FILE
from tuner.upstream.launch import Prepared
from tuner.upstream.process import die_with_parent, free_port


def state_dir(workdir: Path, arm: str) -> Path:
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
    max_tokens: int | None = None
    challenger: Path | None = None  # a second tuner's tuning file, run side by side
    # the challenger daemon's own settings (TUNER_* environment variables), e.g. its
    # TUNER_MAX_INSTANCES: daemon settings, not tuning-file keys
    challenger_env: tuple[tuple[str, str], ...] = ()
    # a checkout whose tuner package the challenger runs (a worktree of an earlier commit):
    # a code change measured side by side, with no setting added to keep the old way
    challenger_code: Path | None = None
    peer: Path | None = None  # another build's llama-server, its arms beside the matrix
    peer_arms: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ("peer:NAME", its flags)
    # the tuner is the default daemon (TUNER_ENGINE=auto), started from this measurement of
    # the engines (the bench's own: ``tuner.bench.engine``)
    engines: EngineChoice | None = None


def daemon_env(
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
        TUNER_TUNE="true",
        TUNER_API_KEYS="",
        TUNER_LOG_FORMAT="json",
        TUNER_MODEL=str(prepared.model),
        TUNER_CACHE_DIR=str(settings.cache_dir),
        TUNER_CTX_SIZE=str(settings.ctx_size),
    )
    if options.engines is not None and tuning is None:  # the default daemon: engine auto
        env.pop("TUNER_LLAMA_SERVER", None)
        env["TUNER_ENGINE"] = "auto"
    else:
        env["TUNER_LLAMA_SERVER"] = str(prepared.binary)
    if prepared.draft is not None:
        env["TUNER_DRAFT_MODEL"] = str(prepared.draft)
    if settings.spec_args:
        env["TUNER_SPEC_ARGS"] = shlex.join(settings.spec_args)
    source = tuning or settings.tuning_file
    if tuning is not None and options.challenger_code is not None:
        # code from before 0.2.0 reads its seed from TUNER_SEED and refuses one in the file
        env.update(TUNER_TUNING_FILE=str(tuning), TUNER_SEED=str(options.seed))
    else:
        env["TUNER_TUNING_FILE"] = str(seeded_tuning(state, source, options.seed))
    if tuning is not None:  # the challenger: its own file and settings
        env.update(options.challenger_env)
        named = dict(options.challenger_env)
        if "TUNER_ENGINE" in named and "TUNER_LLAMA_SERVER" not in named:
            env.pop("TUNER_LLAMA_SERVER", None)  # the engine it names, not the matrix's binary
        if options.challenger_code is not None:
            env["PYTHONPATH"] = str(options.challenger_code)
    return env


def seeded_tuning(state: Path, source: Path | None, seed: int) -> Path:
    """A copy of the tuning file (default: the shipped one) in the state dir, with the
    bench's seed where the file sets none: the daemon's search is reproducible."""
    text = tuning_text(source)
    if "seed" not in tomllib.loads(text):
        text = f"seed = {seed}  # tuner bench --seed\n{text}"
    path = state / "tuning.toml"
    path.write_text(text)
    return path


@asynccontextmanager
async def tuner_daemon(
    settings: Settings,
    prepared: Prepared,
    options: BenchOptions,
    workdir: Path,
    arm: str = TUNER,
    tuning: Path | None = None,
) -> AsyncIterator[str]:
    """The real daemon from a fresh state dir (``<arm>-state`` under ``workdir``, its log
    ``<arm>-daemon.log``), with ``tuning`` as its tuning file if given; its URL."""
    state = state_dir(workdir, arm)
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    if options.engines is not None and tuning is None:
        save_choice(state / CHOICE_FILE, options.engines)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (workdir / f"{arm}-daemon.log").open("ab")
    # ``-m`` imports from the working directory first: the challenger's code runs from its own
    code = options.challenger_code if tuning is not None else None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tuner",
        "serve",
        cwd=code,
        env=daemon_env(settings, prepared, state, port, options, tuning),
        stdout=log,
        stderr=log,
        start_new_session=True,
        # killed with the bench (even by SIGKILL), it still drains and stops its servers
        preexec_fn=functools.partial(die_with_parent, signal.SIGTERM),
    )
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
            if options.engines is not None and tuning is None:  # on the engine it chose
                await engine_settled(http, url, state)
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


def _saved_classes(state: Path) -> dict[str, Any]:
    """The ``classes`` of the daemon's policy file (it writes the file on the way out);
    empty without a readable one."""
    try:
        data = json.loads((state / POLICY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    classes = data.get("classes") if isinstance(data, dict) else None
    return classes if isinstance(classes, dict) else {}


def final_policies(state: Path) -> dict[str, FinalPolicy]:
    """Class key -> its policy when the daemon stopped.

    A class without a policy of its own is served by its parent's (``served_by``).
    """
    classes = _saved_classes(state)

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


def final_speedups(state: Path) -> dict[str, dict[str, list[float]]]:
    """Class key -> variant -> the speedup the daemon priced it at when it stopped
    (``[value, low, high]``); empty without a readable policy file."""
    out: dict[str, dict[str, list[float]]] = {}
    for key, entry in _saved_classes(state).items():
        priced = entry.get("speedups") if isinstance(entry, dict) else None
        if isinstance(priced, dict):
            out[key] = {
                v: [float(x) for x in s]
                for v, s in priced.items()
                if isinstance(s, list)
                and len(s) == 3
                and all(isinstance(x, int | float) for x in s)
            }
    return out


class Quiet:
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
