"""``tuner engines``: the kept measurement as a table or JSON, and a clear error before
there is one. Measuring the real engines: ``tests/integration/test_engines_real.py``."""

from __future__ import annotations

import json
from pathlib import Path

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
