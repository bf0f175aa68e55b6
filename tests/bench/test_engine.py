"""Which engine a bench runs on: pinned, the matrix and the tuner on it; not pinned with two
engines built, the matrix runs on the engine measured faster and the tuner is the default
daemon, started with that measurement in its state; a challenger that names an engine runs
on it, not on the matrix's binary. The builds and the measurement are faked here; the real
daemon's choice is ``tests/integration/test_engines_real.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.engines.test_auto import CAPS
from tuner.bench import engine as bench_engine_module
from tuner.bench.daemons import BenchOptions, daemon_env
from tuner.bench.engine import bench_engine, engine_settled, tuner_engine
from tuner.bench.render import markdown
from tuner.engines.choice import CHOICE_FILE, EngineResult, new_choice, save_choice
from tuner.errors import UpstreamError
from tuner.settings import Settings
from tuner.upstream.launch import Prepared
from tuner.upstream.sources import EngineName

MODEL = Path("/m.gguf")


def _prepared(engine: EngineName) -> Prepared:
    return Prepared(Path(f"/{engine}/llama-server"), CAPS[engine], MODEL, None)


def _choice(engine: EngineName, why: str = "measured faster") -> Any:
    results = tuple(
        EngineResult(engine=e, build="b", tok_s=s, setting="ngram-mod")
        for e, s in (("llama.cpp", 36.5), ("ik_llama.cpp", 53.8))
    )
    return new_choice("m", "hw", results, None, decided=(engine, why))


def _settings(tmp_path: Path, **kw: Any) -> Settings:
    kw.setdefault("ctx_size", 4096)  # sized already: no model to read
    return Settings(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache", **kw)


@pytest.fixture
def two_built(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    measured: list[Settings] = []

    async def measure(settings: Settings, prepared: list[Prepared]) -> Any:
        measured.append(settings)
        return _choice("ik_llama.cpp")

    monkeypatch.setattr(
        bench_engine_module,
        "prepare_built",
        lambda s: [_prepared("llama.cpp"), _prepared("ik_llama.cpp")],
    )
    monkeypatch.setattr(bench_engine_module, "saved_or_measured", measure)
    monkeypatch.setattr(bench_engine_module, "prepare", lambda s, p: _prepared("llama.cpp"))
    return measured


async def test_not_pinned_the_matrix_runs_on_the_faster_and_the_tuner_chooses(
    tmp_path: Path, two_built: list[Settings]
) -> None:
    found = await bench_engine(_settings(tmp_path), lambda _: None)
    assert found.tuner_auto and found.prepared.capabilities.engine == "ik_llama.cpp"
    assert found.choice is not None and found.choice.why == "measured faster"
    assert len(two_built) == 1 and two_built[0].ctx_size == 4096  # measured at the daemon's


@pytest.mark.parametrize(
    "pin", [{"engine": "llama.cpp"}, {"llama_server": Path("/somewhere/llama-server")}]
)
async def test_a_pinned_engine_runs_the_matrix_and_the_tuner(
    tmp_path: Path, two_built: list[Settings], pin: dict[str, Any]
) -> None:
    found = await bench_engine(_settings(tmp_path, **pin), lambda _: None)
    assert not found.tuner_auto and found.prepared.capabilities.engine == "llama.cpp"
    assert two_built == []  # nothing measured


async def test_with_one_engine_built_nothing_is_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_built: list[Settings]
) -> None:
    monkeypatch.setattr(bench_engine_module, "prepare_built", lambda s: [_prepared("llama.cpp")])
    found = await bench_engine(_settings(tmp_path), lambda _: None)
    assert not found.tuner_auto and two_built == []


def test_the_default_tuner_names_no_binary_and_a_challenger_runs_the_engine_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNER_LLAMA_SERVER", raising=False)
    settings, ik = _settings(tmp_path), _prepared("ik_llama.cpp")
    state, tuning = tmp_path / "s", tmp_path / "t.toml"
    tuning.write_text("")
    state.mkdir()
    auto = BenchOptions(out=tmp_path, engines=_choice("ik_llama.cpp"))
    env = daemon_env(settings, ik, state, 1, auto)
    assert env["TUNER_ENGINE"] == "auto" and "TUNER_LLAMA_SERVER" not in env
    pinned = daemon_env(settings, ik, state, 1, BenchOptions(out=tmp_path))
    assert pinned["TUNER_LLAMA_SERVER"] == str(ik.binary)

    named = BenchOptions(out=tmp_path, challenger_env=(("TUNER_ENGINE", "llama.cpp"),))
    challenger = daemon_env(settings, ik, state, 1, named, tuning)
    assert challenger["TUNER_ENGINE"] == "llama.cpp" and "TUNER_LLAMA_SERVER" not in challenger
    both = (("TUNER_ENGINE", "llama.cpp"), ("TUNER_LLAMA_SERVER", "/mine"))
    # a challenger that names no engine runs on the matrix's binary, beside a default tuner
    assert daemon_env(settings, ik, state, 1, auto, tuning)["TUNER_LLAMA_SERVER"] == str(ik.binary)
    mine = daemon_env(
        settings, ik, state, 1, BenchOptions(out=tmp_path, challenger_env=both), tuning
    )
    assert mine["TUNER_LLAMA_SERVER"] == "/mine"


async def test_the_bench_waits_until_the_default_daemon_serves_on_its_choice(
    tmp_path: Path,
) -> None:
    """Mainline serves while the daemon measures; the choice is saved; then the switch."""
    polls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        if len(polls) == 1:
            return httpx.Response(503, json={"status": "starting"})
        if len(polls) == 3:  # the measurement is done: the daemon saved its choice
            save_choice(tmp_path / CHOICE_FILE, _choice("ik_llama.cpp"))
        serving = "ik_llama.cpp" if len(polls) >= 5 else "llama.cpp"
        return httpx.Response(200, json={"engine": serving, "engine_selection": "measuring"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        chosen = await engine_settled(http, "http://d", tmp_path, timeout_s=5, poll_s=0)
    assert chosen == "ik_llama.cpp" and len(polls) == 5


async def test_one_engine_settles_at_once_and_no_choice_in_time_is_an_error(
    tmp_path: Path,
) -> None:
    selection = "one engine"

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"engine": "llama.cpp", "engine_selection": selection})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        assert await engine_settled(http, "http://d", tmp_path, poll_s=0) == "llama.cpp"
        selection = "measuring"
        with pytest.raises(UpstreamError, match="chose no engine"):
            await engine_settled(http, "http://d", tmp_path, timeout_s=0.05, poll_s=0.01)


def test_the_summary_says_what_the_default_daemon_chose() -> None:
    from tests.bench.test_analyse import CLASSES, static_rows, tuner_row
    from tuner.bench.analyse import summarize

    rows = static_rows() + [tuner_row(i % 4, "meh") for i in range(8)]
    summary = summarize(rows, CLASSES, meta={"model": "m.gguf", "workload": 4})
    summary["overall"]["tuner_engine"] = tuner_engine(_choice("ik_llama.cpp"))
    assert summary["overall"]["tuner_engine"]["tok_s"] == {
        "llama.cpp": 36.5,
        "ik_llama.cpp": 53.8,
    }
    assert "served on ik_llama.cpp: measured faster" in markdown(summary)
