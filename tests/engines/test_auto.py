"""TUNER_ENGINE=auto's background work, with the builds, engines and measurement faked:
it builds what is missing, measures when nothing valid is kept, keeps the result, and
asks for a switch only to a different engine. The real engines' run is
``tests/integration/test_engines_real.py``."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.engines import auto
from tuner.engines.auto import EngineSelector, first_engine
from tuner.engines.choice import CHOICE_FILE, EngineResult, load_choice, new_choice, save_choice
from tuner.settings import Settings
from tuner.upstream.capabilities import parse_capabilities
from tuner.upstream.launch import Prepared
from tuner.upstream.sources import EngineName

DATA = Path(__file__).parents[1] / "upstream" / "data"
CAPS = {
    "llama.cpp": parse_capabilities(
        (DATA / "help-0c1e570.txt").read_text(), (DATA / "version-0c1e570.txt").read_text()
    ),
    "ik_llama.cpp": parse_capabilities(
        (DATA / "help-ik-55d3c05.txt").read_text(), (DATA / "version-ik-55d3c05.txt").read_text()
    ),
}
SPEEDS = {"llama.cpp": 100.0, "ik_llama.cpp": 150.0}


class _World:
    """What is built, what builds cost, and what each measurement finds."""

    def __init__(self, built: list[EngineName], mtp_layers: int = 0) -> None:
        self.built = built
        self.builds: list[str] = []
        self.measured = 0
        self.facts = SimpleNamespace(nextn_layers=mtp_layers, architecture="gemma3")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(auto, "built_engines", lambda *a: list(self.built))
        monkeypatch.setattr(auto, "measurement_keys", lambda model: ("gemma-abc", "hw1"))
        monkeypatch.setattr(auto, "prepare_built", self.prepare_built)
        monkeypatch.setattr(auto, "measure_engines", self.measure)
        monkeypatch.setattr(auto, "locate_llama_server", self.build)
        monkeypatch.setattr(auto, "read_facts", lambda path: self.facts)

    def prepare_built(self, settings: Settings) -> list[Prepared]:
        return [Prepared(Path(f"/{e}"), CAPS[e], Path("/m.gguf"), None) for e in self.built]

    def build(self, explicit: Any, cache: Path, *, engine: EngineName, **kw: Any) -> Path:
        kw["progress"]("[spec-tuner]    50% built")
        self.builds.append(engine)
        self.built.append(engine)
        return Path(f"/{engine}")

    async def measure(self, prepared: list[Prepared], *a: Any) -> tuple[EngineResult, ...]:
        self.measured += 1
        return tuple(
            EngineResult(
                engine=p.capabilities.engine,
                build=p.capabilities.commit,
                tok_s=SPEEDS[p.capabilities.engine],
                setting="ngram-simple.n3.m16",
            )
            for p in prepared
        )


def _selector(tmp_path: Path, serving: str) -> tuple[EngineSelector, list[str]]:
    switched: list[str] = []

    def switch(engine: EngineName) -> bool:
        switched.append(engine)
        return True

    settings = Settings(state_dir=tmp_path, cache_dir=tmp_path / "cache")  # type: ignore[call-arg]
    return EngineSelector(settings, lambda: serving, switch), switched


async def _run(selector: EngineSelector) -> None:
    await selector.start()
    assert selector._task is not None
    await asyncio.wait_for(selector._task, 5)


async def test_it_builds_the_missing_engine_measures_both_and_switches_to_the_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _World(["llama.cpp"])
    world.install(monkeypatch)
    selector, switched = _selector(tmp_path, "llama.cpp")
    assert selector.status()["engines"]["ik_llama.cpp"] == {"status": "starting"}
    await _run(selector)
    assert world.builds == ["ik_llama.cpp"] and world.measured == 1
    assert switched == ["ik_llama.cpp"]
    kept = load_choice(tmp_path / CHOICE_FILE)
    assert kept is not None and kept.engine == "ik_llama.cpp"
    status = selector.status()
    assert status["engines"]["ik_llama.cpp"] == {"tok_s": 150.0, "setting": "ngram-simple.n3.m16"}
    assert status["engines"]["llama.cpp"]["tok_s"] == 100.0
    assert "measured fastest" in status["engine_why"] and status["engine_selection"] == "done"
    metrics = {s.labels["engine"]: s.value for m in selector.collect() for s in m.samples}
    assert metrics == {"llama.cpp": 100.0, "ik_llama.cpp": 150.0}


async def test_a_valid_kept_choice_is_not_measured_again_and_no_switch_to_the_serving_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _World(["llama.cpp", "ik_llama.cpp"])
    world.install(monkeypatch)
    results = await world.measure(world.prepare_built(Settings()))  # type: ignore[call-arg]
    save_choice(tmp_path / CHOICE_FILE, new_choice("gemma-abc", "hw1", results, None))
    world.measured = 0
    selector, switched = _selector(tmp_path, "ik_llama.cpp")
    await _run(selector)
    assert world.measured == 0 and switched == []
    # a build changed: measured again
    monkeypatch.setitem(CAPS, "ik_llama.cpp", replace(CAPS["ik_llama.cpp"], commit="8337e4c"))
    selector, switched = _selector(tmp_path, "ik_llama.cpp")
    await _run(selector)
    assert world.measured == 1 and switched == []


async def test_with_one_engine_there_is_nothing_to_choose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = _World(["llama.cpp"])
    world.install(monkeypatch)
    monkeypatch.setattr(
        auto,
        "locate_llama_server",
        lambda *a, **kw: (_ for _ in ()).throw(auto.TunerError("cmake failed")),
    )
    selector, switched = _selector(tmp_path, "llama.cpp")
    await _run(selector)
    assert world.measured == 0 and switched == [] and selector.state == "one engine"


def test_the_first_engine_is_the_kept_choice_where_built_else_the_first_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(state_dir=tmp_path, cache_dir=tmp_path / "cache")  # type: ignore[call-arg]
    built: list[EngineName] = []
    monkeypatch.setattr(auto, "built_engines", lambda *a: built)
    assert first_engine(settings) == "llama.cpp"  # nothing built: mainline, built at start
    built.append("ik_llama.cpp")
    assert first_engine(settings) == "ik_llama.cpp"
    built.insert(0, "llama.cpp")
    assert first_engine(settings) == "llama.cpp"
    results = (
        EngineResult(engine="llama.cpp", build="a", tok_s=100.0),
        EngineResult(engine="ik_llama.cpp", build="b", tok_s=150.0),
    )
    save_choice(tmp_path / CHOICE_FILE, new_choice("m", "h", results, None))
    assert first_engine(settings) == "ik_llama.cpp"
    built.remove("ik_llama.cpp")  # chosen, but gone from the cache
    assert first_engine(settings) == "llama.cpp"


async def test_a_model_whose_heads_only_one_engine_drafts_with_goes_to_it_unmeasured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MTP (next-n) layers: mainline drafts with them, ik_llama.cpp 55d3c05 cannot, so the
    daemon serves on mainline without measuring, and says why."""
    world = _World(["llama.cpp", "ik_llama.cpp"], mtp_layers=1)
    world.install(monkeypatch)
    selector, switched = _selector(tmp_path, "ik_llama.cpp")
    await _run(selector)
    assert world.measured == 0 and switched == ["llama.cpp"]
    status = selector.status()
    assert "MTP (next-n) layers, which only llama.cpp drafts with" in status["engine_why"]
    assert status["engines"]["ik_llama.cpp"]["unavailable"] == status["engine_why"]
    kept = load_choice(tmp_path / CHOICE_FILE)
    assert kept is not None and kept.engine == "llama.cpp"
