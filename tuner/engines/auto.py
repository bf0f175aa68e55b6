"""``TUNER_ENGINE=auto``: the daemon serves on one engine at once and finds the faster.

At start it serves on the engine the last measurement chose, else on one already built
(mainline first), else it builds mainline as before. In the background it then builds the
engines that are missing, measures them side by side when the model, the machine or a
build changed since the last measurement (``engines.json``), and, where another engine is
clearly faster, asks for the topology to be replaced by one on that engine: requests keep
flowing meanwhile (``daemon/deployment.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.engines.choice import (
    CHOICE_FILE,
    LOADED_CLIENTS,
    EngineChoice,
    EngineResult,
    load_choice,
    new_choice,
    only_engine_for,
    save_choice,
)
from tuner.engines.measure import calibration_prompts, measure_engines
from tuner.errors import TunerError
from tuner.logs import get_logger
from tuner.model.gguf_facts import draft_type, read_facts
from tuner.profiles import fingerprint_key, hardware_fingerprint, model_key
from tuner.settings import Settings
from tuner.upstream.launch import Prepared, prepare
from tuner.upstream.provision import built_engines, locate_llama_server
from tuner.upstream.sources import ENGINES, EngineName

__all__ = [
    "EngineSelector",
    "first_engine",
    "measure_now",
    "measurement_keys",
    "prepare_built",
    "saved_or_measured",
]

log = get_logger(__name__)


def first_engine(settings: Settings) -> EngineName:
    """The engine to start serving on: the measured choice where it is built, else one
    that is built (mainline first), else mainline, built now."""
    built = built_engines(settings.cache_dir, settings.llama_cuda)
    choice = load_choice(settings.state_dir / CHOICE_FILE)
    if choice is not None and choice.engine in built:
        return choice.engine
    return built[0] if built else ENGINES[0]


class EngineSelector(Collector):
    """The background build, measurement and switch; ``status`` for ``/ready``.

    ``serving``: the engine serving now; ``switch``: ask for a topology on an engine
    (False when a replacement is already under way)."""

    def __init__(
        self,
        settings: Settings,
        serving: Callable[[], str | None],
        switch: Callable[[EngineName], bool],
    ) -> None:
        self.settings = settings
        self.path = settings.state_dir / CHOICE_FILE
        self.serving = serving
        self.switch = switch
        self.choice = load_choice(self.path)
        self.state = "starting"
        self.building: dict[str, str] = {}  # engine: its build's last progress line
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="engine-select")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- what it shows ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """``/ready``'s ``engines``: each engine's measured tok/s or why it has none."""
        engines: dict[str, Any] = {}
        results = {r.engine: r for r in self.choice.results} if self.choice else {}
        for name in ENGINES:
            if name in self.building:
                engines[name] = {"status": "building", "progress": self.building[name]}
            elif (result := results.get(name)) is not None and result.measured:
                engines[name] = {"tok_s": result.tok_s, "setting": result.setting}
                if result.loaded_tok_s is not None:
                    engines[name]["loaded_tok_s"] = result.loaded_tok_s
            elif result is not None and result.unavailable is not None:
                engines[name] = {"unavailable": result.unavailable}
            else:
                engines[name] = {"status": self.state}
        found: dict[str, Any] = {"engines": engines, "engine_selection": self.state}
        if self.choice is not None:
            found["engine_why"] = self.choice.why
        return found

    def collect(self) -> Iterator[Metric]:
        speed = GaugeMetricFamily(
            "tuner_engine_tokens_per_second",
            "each engine's calibration tok/s at its best setting (TUNER_ENGINE=auto)",
            labels=["engine", "setting"],
        )
        loaded = GaugeMetricFamily(
            "tuner_engine_loaded_tokens_per_second",
            f"each engine's calibration tok/s with {LOADED_CLIENTS} clients at once, at its "
            "best setting then",
            labels=["engine", "setting"],
        )
        for result in self.choice.results if self.choice else ():
            if result.measured and result.tok_s is not None:
                speed.add_metric([result.engine, result.setting or ""], result.tok_s)
            if result.measured and result.loaded_tok_s is not None:
                loaded.add_metric([result.engine, result.loaded_setting or ""], result.loaded_tok_s)
        yield speed
        yield loaded

    # -- the background work ----------------------------------------------------------

    async def _run(self) -> None:
        try:
            self.state = "building"
            await asyncio.to_thread(self._build_missing)
            prepared = await asyncio.to_thread(prepare_built, self.settings)
            if len(prepared) < 2:  # nothing to choose between
                self.state = "one engine"
                return
            keys = await asyncio.to_thread(measurement_keys, prepared[0].model)
            builds = {p.capabilities.engine: p.capabilities.commit for p in prepared}
            forced = await asyncio.to_thread(_forced, prepared)
            if forced is not None:  # nothing to measure: only one engine runs the model's head
                self.choice = _forced_choice(*forced, keys, prepared)
                await asyncio.to_thread(save_choice, self.path, self.choice)
            elif self.choice is None or not self.choice.valid_for(*keys, builds):
                self.state = "measuring"
                log.info("engines_measuring", engines=list(builds))
                self.choice = await self._measure(prepared, keys)
            self.state = "done"
            chosen = self.choice.engine
            log.info("engine_chosen", engine=chosen, why=self.choice.why)
            if chosen != self.serving() and self.switch(chosen):
                log.info("engine_switching", to=chosen, serving=self.serving())
        except (TunerError, OSError, ValueError) as exc:
            self.state = f"failed: {exc}"[:300]
            log.error("engine_selection_failed", error=str(exc)[:300])

    def _build_missing(self) -> None:
        built = built_engines(self.settings.cache_dir, self.settings.llama_cuda)
        for engine in ENGINES:
            if engine in built:
                continue
            self.building[engine] = "starting"

            def progress(message: str, engine: str = engine) -> None:
                self.building[engine] = message.strip()
                log.info("engine_build_progress", engine=engine, progress=message.strip())

            try:
                locate_llama_server(
                    None,
                    self.settings.cache_dir,
                    engine=engine,
                    cuda=self.settings.llama_cuda,
                    progress=progress,
                )
            except TunerError as exc:
                log.error("engine_build_failed", engine=engine, error=str(exc)[:300])
            finally:
                del self.building[engine]

    async def _measure(self, prepared: list[Prepared], keys: tuple[str, str]) -> EngineChoice:
        results = await measure_engines(prepared, self.settings, calibration_prompts())
        choice = new_choice(*keys, results, _engine(self.serving()))
        await asyncio.to_thread(save_choice, self.path, choice)
        for result in choice.results:
            log.info("engine_measured", **result.model_dump(exclude={"settings"}))
        return choice


def _forced(prepared: list[Prepared]) -> tuple[EngineName, str] | None:
    """The engine the model's own heads or its draft's kind need, where only one has it."""
    facts = read_facts(prepared[0].model)
    needs = {"draft-mtp": "the model has MTP (next-n) layers"} if facts.nextn_layers else {}
    draft = prepared[0].draft
    if draft is not None:
        kind = draft_type(read_facts(draft).architecture)
        needs[kind] = f"the draft model is run as {kind}"
    supports = {p.capabilities.engine: p.capabilities.spec_types for p in prepared}
    return only_engine_for(needs, supports)


def _forced_choice(
    engine: EngineName, why: str, keys: tuple[str, str], prepared: list[Prepared]
) -> EngineChoice:
    results = tuple(
        EngineResult(
            engine=p.capabilities.engine,
            build=p.capabilities.commit,
            unavailable=None if p.capabilities.engine == engine else why,
        )
        for p in prepared
    )
    return new_choice(*keys, results, None, decided=(engine, why))


def _engine(name: str | None) -> EngineName | None:
    return next((e for e in ENGINES if e == name), None)


def prepare_built(settings: Settings) -> list[Prepared]:
    """Every engine built here, prepared for the configured model (none is built now)."""
    found = []
    for engine in built_engines(settings.cache_dir, settings.llama_cuda):
        try:
            found.append(prepare(settings.model_copy(update={"engine": engine}), lambda _: None))
        except TunerError as exc:
            log.warning("engine_unusable", engine=engine, error=str(exc)[:300])
    return found


def measurement_keys(model: Path) -> tuple[str, str]:
    """What a measurement is valid for: the model file and the machine."""
    return model_key(model), fingerprint_key(hardware_fingerprint())


async def measure_now(settings: Settings, prepared: list[Prepared]) -> EngineChoice:
    """``prepared``'s engines measured now (``settings`` sized as the daemon's are)."""
    results = await measure_engines(prepared, settings, calibration_prompts())
    return new_choice(*measurement_keys(prepared[0].model), results, None)


async def saved_or_measured(settings: Settings, prepared: list[Prepared]) -> EngineChoice:
    """The state dir's measurement where it still holds for this model, machine and these
    builds; else one made now (not saved: the daemon keeps its own)."""
    keys = await asyncio.to_thread(measurement_keys, prepared[0].model)
    builds = {p.capabilities.engine: p.capabilities.commit for p in prepared}
    saved = load_choice(settings.state_dir / CHOICE_FILE)
    if saved is not None and saved.valid_for(*keys, builds):
        return saved
    return await measure_now(settings, prepared)
