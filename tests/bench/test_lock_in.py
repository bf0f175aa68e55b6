"""``benchmarks/lock_in.py``: classes two daemons chose apart, and how each rated both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.lock_in import compare


def _policies(classes: dict[str, tuple[str, int, dict[str, list[float]]]]) -> dict[str, Any]:
    """A ``policies.json``: per class its chosen variant, requests seen and speedups."""
    return {
        "classes": {
            key: {"policy": {"variant": variant}, "seen": seen, "speedups": speedups}
            for key, (variant, seen, speedups) in classes.items()
        }
    }


TUNER = _policies(
    {
        "all": ("m8", 0, {"m8": [1.5, 1.4, 1.6]}),  # a level: serves nothing itself
        "chat": ("m8", 40, {"m8": [1.5, 1.4, 1.6], "m16": [1.3, 1.2, 1.4]}),
        "code": ("m16", 30, {"m16": [1.8, 1.7, 1.9], "m8": [1.7, 1.6, 1.8]}),
        "data": ("none", 20, {"m8": [1.01, 0.98, 1.04]}),
        "text": ("m8", 10, {"m8": [1.2, 1.1, 1.3]}),
    }
)
CHALLENGER = _policies(
    {
        "all": ("m16", 0, {}),
        "chat": ("m16", 40, {"m16": [1.6, 1.5, 1.7], "m8": [1.4, 1.3, 1.5]}),  # both own
        "code": ("m16", 30, {"m16": [1.8, 1.7, 1.9]}),  # the same choice
        "data": ("m8", 20, {"m8": [1.05, 1.01, 1.09]}),  # the tuner's none: guard, not value
    }
)


def _row(arm: str, item: int, cls: str, variant: str, ms: float) -> dict[str, Any]:
    return {"arm": arm, "item": item, "id": f"p{item}", "class": cls, "daemon_class": cls,
            "variant": variant, "tokens": 100, "ms": ms}  # fmt: skip


def _rows() -> list[dict[str, Any]]:
    """Two chat prompts: the static arm 1 s each, the tuner's m8 1.25 s, the challenger's
    m16 0.8 s (and a failed request, left out)."""
    rows = []
    for item in (1, 2):
        rows += [_row("none", item, "chat", "none", 2000.0)]
        rows += [_row("static.x", item, "chat", "static.x", 1000.0)]
        rows += [_row("tuner", item, "chat", "m8", 1250.0)]
        rows += [_row("challenger", item, "chat", "m16", 800.0)]
    failed = {"arm": "tuner", "id": "p3", "item": 3, "class": "chat", "tokens": 0, "error": "x"}
    return [*rows, failed]


def test_classes_chosen_apart_and_both_ratings_of_each() -> None:
    found = compare({"tuner": TUNER, "challenger": CHALLENGER})
    assert found["classes_both_served"] == 3  # "all" served nothing, "text" only the tuner
    assert found["chose_differently"] == 2 and found["lock_in"] == 1
    chat, data = found["classes"]
    assert chat["class"] == "chat" and chat["lock_in"]
    assert chat["rates"]["tuner"] == {"m8": [1.5, 1.4, 1.6], "m16": [1.3, 1.2, 1.4]}
    assert chat["rates"]["challenger"] == {"m16": [1.6, 1.5, 1.7], "m8": [1.4, 1.3, 1.5]}
    assert data["prefers_own"] == {"tuner": False, "challenger": True} and not data["lock_in"]
    assert data["rates"]["tuner"]["none"] == [1.0, 1.0, 1.0]
    assert "over_static" not in chat  # no requests given


def test_each_choice_is_timed_against_the_best_static_arm_on_the_same_prompts() -> None:
    found = compare({"tuner": TUNER, "challenger": CHALLENGER}, _rows())
    chat = found["classes"][0]
    assert chat["over_static"]["tuner"] == {"ratio": pytest.approx(0.8), "requests": 2}
    assert chat["over_static"]["challenger"] == {"ratio": pytest.approx(1.25), "requests": 2}


def test_the_command_line_reads_a_run_and_a_missing_state_is_a_usage_error(
    tmp_path: Path,
) -> None:
    for daemon, policies in (("tuner", TUNER), ("challenger", CHALLENGER)):
        (tmp_path / f"{daemon}-state").mkdir()
        (tmp_path / f"{daemon}-state" / "policies.json").write_text(json.dumps(policies))
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    command = [sys.executable, "-m", "benchmarks.lock_in", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["lock_in"] == 1
    (tmp_path / "challenger-state" / "policies.json").write_text("[1, 2]")
    failed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and "not a policies file" in failed.stderr
    (tmp_path / "challenger-state" / "policies.json").unlink()
    failed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert failed.returncode == 2 and "challenger-state" in failed.stderr
