"""Measuring the engines side by side on this machine and model.

Each setting (no speculation, and the n-gram settings the tuner settles on most often) is
started on every engine that has it, at once, and the calibration prompts go to them in
turn, so both engines see the same load from whatever else the machine does (the daemon
may be serving meanwhile). An engine's figure is its best setting's generated tokens over
prefill and decode time: what a client waits for. Then the same prompts again from
``LOADED_CLIENTS`` clients at once, each engine in turn: generated tokens over the wall
time, with each engine's instances as the daemon runs them (mainline's slots batch the
clients, ik_llama.cpp's one slot takes them in turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.calibrate import post_json, temporary_server
from tuner.engines.choice import LOADED_CLIENTS, EngineResult
from tuner.errors import TunerError
from tuner.logs import get_logger
from tuner.settings import Settings
from tuner.tuning.variants import BASELINE, Variant, parse_name
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import Prepared
from tuner.upstream.sources import ENGINES
from tuner.workload import DEFAULT_WORKLOAD, WorkloadItem, load_workload

__all__ = ["CANDIDATES", "calibration_prompts", "measure_engines"]

log = get_logger(__name__)

# the n-gram settings the tuner settles on most on real text (docs/benchmarks.md)
CANDIDATES = ("ngram-simple.n3.m16", "ngram-mod.match24.max16")
MAX_TOKENS = 96


@dataclass
class _Totals:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0

    def add(self, timings: dict[str, float]) -> None:
        self.prompt_n += int(timings.get("prompt_n", 0))
        self.prompt_ms += float(timings.get("prompt_ms", 0.0))
        self.predicted_n += int(timings.get("predicted_n", 0))
        self.predicted_ms += float(timings.get("predicted_ms", 0.0))

    @property
    def tok_s(self) -> float:
        return 1000 * self.predicted_n / max(self.prompt_ms + self.predicted_ms, 1e-9)


@dataclass
class _Engine:
    prepared: Prepared
    totals: dict[str, _Totals] = field(default_factory=dict)
    loaded: dict[str, tuple[int, float]] = field(default_factory=dict)  # tokens, wall seconds
    failed: str | None = None

    def add_loaded(self, setting: str, tokens: int, seconds: float) -> None:
        had_tokens, had_seconds = self.loaded.get(setting, (0, 0.0))
        self.loaded[setting] = (had_tokens + tokens, had_seconds + seconds)

    @property
    def name(self) -> str:
        return self.prepared.capabilities.engine


def calibration_prompts(path: Path = DEFAULT_WORKLOAD) -> list[WorkloadItem]:
    """One prompt of each kind in the shipped dev set: short, fixed, greedy."""
    seen: dict[str, WorkloadItem] = {}
    for item in load_workload(path):
        if item.prompt is not None:
            seen.setdefault(item.class_hint or item.id, item)
    return list(seen.values())


async def measure_engines(
    prepared: Sequence[Prepared], settings: Settings, prompts: Sequence[WorkloadItem]
) -> tuple[EngineResult, ...]:
    """Every engine of ``prepared`` measured on ``prompts`` under each setting it has, and
    the engines not among them as not built."""
    engines = [_Engine(p) for p in prepared]
    for variant in (BASELINE, *(parse_name(n) for n in CANDIDATES)):
        runnable = [e for e in engines if e.failed is None and _runs(e.prepared, variant)]
        if runnable:
            await _measure_setting(runnable, variant, settings, prompts)
    found = tuple(_result(e) for e in engines)
    named = {r.engine for r in found}
    missing = tuple(
        EngineResult(engine=e, unavailable=f"not built (tuner provision --engine {e})")
        for e in ENGINES
        if e not in named
    )
    return found + missing


def _runs(prepared: Prepared, variant: Variant) -> bool:
    return not variant.speculative or prepared.capabilities.supports_spec_type(variant.spec_type)


async def _measure_setting(
    engines: list[_Engine], variant: Variant, settings: Settings, prompts: Sequence[WorkloadItem]
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        clients: list[tuple[_Engine, UpstreamClient]] = []
        for engine in engines:
            caps = engine.prepared.capabilities
            try:
                flags = variant.flags(caps) if variant.speculative else []
                client = await stack.enter_async_context(
                    temporary_server(
                        engine.prepared.binary,
                        settings,
                        caps,
                        engine.prepared.model,
                        flags,
                        f"engine-{engine.name}-{variant.name}",
                    )
                )
                await _complete(client, "Hello", 4)  # the first request pays for warm-up
            except (TunerError, OSError, ValueError) as exc:
                if variant == BASELINE:  # the engine does not run this model at all
                    engine.failed = f"cannot serve this model: {exc}"[:300]
                log.warning("engine_measure_failed", engine=engine.name, variant=variant.name)
                continue
            clients.append((engine, client))
        for item in prompts:  # in turn, so both see the same background load
            for engine, client in clients:
                assert item.prompt is not None
                timings = await _complete(client, item.prompt, min(item.max_tokens, MAX_TOKENS))
                engine.totals.setdefault(variant.name, _Totals()).add(timings)
        for start in range(0, len(prompts), LOADED_CLIENTS):  # clients at once, in turn
            group = prompts[start : start + LOADED_CLIENTS]
            for engine, client in clients:
                began = time.perf_counter()
                answers = await asyncio.gather(
                    *(
                        _complete(client, i.prompt or "", min(i.max_tokens, MAX_TOKENS))
                        for i in group
                    )
                )
                tokens = sum(int(t.get("predicted_n", 0)) for t in answers)
                engine.add_loaded(variant.name, tokens, time.perf_counter() - began)


async def _complete(client: UpstreamClient, prompt: str, n: int) -> dict[str, float]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0, "cache_prompt": False}
    answer = await asyncio.wait_for(post_json(client, "/completion", body), 300)
    timings: dict[str, float] = answer.get("timings") or {}
    return timings


def _result(engine: _Engine) -> EngineResult:
    caps = engine.prepared.capabilities
    build = caps.commit
    if engine.failed is not None or BASELINE.name not in engine.totals:
        return EngineResult(
            engine=caps.engine, build=build, unavailable=engine.failed or "not measured"
        )
    by_setting = {name: round(t.tok_s, 2) for name, t in engine.totals.items()}
    best = max(by_setting, key=by_setting.__getitem__)
    plain = engine.totals[BASELINE.name]
    loaded = {name: round(n / max(sec, 1e-9), 2) for name, (n, sec) in engine.loaded.items()}
    loaded_best = max(loaded, key=loaded.__getitem__) if loaded else None
    return EngineResult(
        engine=caps.engine,
        build=build,
        tok_s=by_setting[best],
        setting=best,
        loaded_tok_s=loaded[loaded_best] if loaded_best else None,
        loaded_setting=loaded_best,
        prompt_tok_s=round(1000 * plain.prompt_n / max(plain.prompt_ms, 1e-9), 1),
        decode_tok_s=round(1000 * plain.predicted_n / max(plain.predicted_ms, 1e-9), 1),
        settings=by_setting,
    )
