"""``tuner engines``: the kept measurement as a table or JSON, a clear error before there
is one, and ``--measure`` running the daemon's measurement (faked here) and keeping it.
Measuring the real engines: ``tests/integration/test_engines_real.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.cli.main import main
from tuner.engines.choice import CHOICE_FILE, EngineResult, new_choice, save_choice


def test_the_kept_measurement_prints_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["engines", "--state-dir", str(tmp_path)]) == 2
    assert "tuner engines --measure" in capsys.readouterr().err
    results = (
        EngineResult(
            engine="llama.cpp",
            build="0c1e570",
            tok_s=100.0,
            setting="ngram-mod.match24.max16",
            prompt_tok_s=900.0,
            decode_tok_s=40.0,
        ),
        EngineResult(engine="ik_llama.cpp", unavailable="not built (tuner provision ...)"),
    )
    save_choice(tmp_path / CHOICE_FILE, new_choice("m", "h", results, None))
    assert main(["engines", "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "*llama.cpp" in table and "100.0 (ngram-mod.match24.max16)" in table
    assert "not built" in table and "the only engine that runs here" in table
    assert main(["engines", "--state-dir", str(tmp_path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["engine"] == "llama.cpp"


def test_measure_runs_the_daemons_measurement_and_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.engines import auto
    from tuner.upstream.launch import Prepared

    model = tmp_path / "m.gguf"
    prepared = [Prepared(tmp_path / "llama-server", None, model, None)]  # type: ignore[arg-type]
    measured: list[tuple[Any, ...]] = []

    async def measure_now(settings: Any, built: list[Prepared]) -> Any:
        measured.append((settings.ctx_size, built))
        result = EngineResult(engine="ik_llama.cpp", build="55d3c05", tok_s=90.0, setting="none")
        return new_choice("m", "h", (result,), None)

    monkeypatch.setattr(auto, "prepare_built", lambda settings: prepared)
    monkeypatch.setattr(auto, "measure_now", measure_now)
    monkeypatch.setenv("TUNER_CTX_SIZE", "4096")  # sized already: no model to read
    args = ["engines", "--state-dir", str(tmp_path), "--format", "json"]
    assert main([*args, "--measure"]) == 0
    assert measured == [(4096, prepared)]  # every built engine, at the daemon's context
    assert json.loads(capsys.readouterr().out)["engine"] == "ik_llama.cpp"
    assert main(args) == 0 and len(measured) == 1  # kept: shown without measuring again
    assert json.loads(capsys.readouterr().out)["results"][0]["tok_s"] == 90.0
    monkeypatch.setattr(auto, "prepare_built", lambda settings: [])
    assert main(["engines", "--state-dir", str(tmp_path), "--measure"]) == 2
    assert "tuner provision" in capsys.readouterr().err
