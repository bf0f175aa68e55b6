"""Which engine a bench runs on.

Pinned (``--engine``, ``TUNER_ENGINE``, ``TUNER_LLAMA_SERVER``): the matrix and the tuner
on that engine. Not pinned (``auto``, the default) where two engines are built: the bench
measures the engines as the daemon does, the matrix runs on the faster, and the tuner is
the default daemon started with that measurement in its fresh state (as a user's daemon
keeps its own), so it serves on the matrix's engine and its arms are held against that
engine's. Its learning starts cold; the engines' minutes of calibration, once per model,
machine and build, are not measured again nor run beside an arm's request.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tuner.daemon.plan import sized
from tuner.daemon.serve import chooses_engine
from tuner.engines.auto import prepare_built, saved_or_measured
from tuner.engines.choice import CHOICE_FILE, EngineChoice, load_choice
from tuner.errors import UpstreamError
from tuner.settings import Settings
from tuner.upstream.launch import Prepared, prepare
from tuner.upstream.provision import Progress

__all__ = ["BenchEngine", "bench_engine", "engine_settled", "tuner_engine"]

SETTLE_TIMEOUT_S = 1200.0  # the daemon's calibration of two engines and its switch


@dataclass(frozen=True, slots=True)
class BenchEngine:
    prepared: Prepared  # the matrix's engine, and the tuner's where it is pinned
    choice: EngineChoice | None = None  # auto: the measurement the default daemon starts from

    @property
    def tuner_auto(self) -> bool:
        """The tuner is the default daemon (``TUNER_ENGINE=auto``)."""
        return self.choice is not None


async def bench_engine(settings: Settings, progress: Progress) -> BenchEngine:
    """The matrix's engine, and whether the tuner chooses its own."""
    if chooses_engine(settings):
        built = await asyncio.to_thread(prepare_built, settings)
        if len(built) > 1:
            progress("engine auto: measuring the built engines for the matrix (a few minutes)")
            choice = await saved_or_measured(sized(settings, built[0]), built)
            chosen = next(p for p in built if p.capabilities.engine == choice.engine)
            progress(f"engine auto: the matrix and the tuner on {choice.engine} ({choice.why})")
            return BenchEngine(chosen, choice)
    return BenchEngine(await asyncio.to_thread(prepare, settings, progress))


async def engine_settled(
    http: httpx.AsyncClient,
    url: str,
    state: Path,
    timeout_s: float = SETTLE_TIMEOUT_S,
    poll_s: float = 1.0,
) -> str:
    """Wait until a default daemon (at ``url``, its state dir ``state``) has measured its
    engines and serves on the one it chose (or found nothing to choose); that engine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ready = (await http.get(url + "/ready")).json()
        except (httpx.HTTPError, ValueError):
            ready = {}
        serving, selection = ready.get("engine"), str(ready.get("engine_selection", ""))
        choice = load_choice(state / CHOICE_FILE)
        if serving and choice is not None and choice.engine == serving:
            return str(serving)
        if serving and (selection == "one engine" or selection.startswith("failed")):
            return str(serving)
        await asyncio.sleep(poll_s)
    raise UpstreamError(f"the tuner daemon chose no engine in {timeout_s:.0f} s")


def tuner_engine(choice: EngineChoice) -> dict[str, object]:
    """The summary's ``tuner_engine``: what a default daemon measured and chose."""
    return {
        "engine": choice.engine,
        "why": choice.why,
        "tok_s": {r.engine: r.tok_s for r in choice.results if r.measured},
    }
