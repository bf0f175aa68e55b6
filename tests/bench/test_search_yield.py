"""``benchmarks/search_yield.py``: which variants earn their trials, over several runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.search_yield import tally
from tests.bench.test_exploration_cost import row

ROOT = Path(__file__).resolve().parents[2]


def _daemon(pid: str, speed: float, role: str, variant: str, cls: str) -> dict[str, Any]:
    return row("tuner", pid, speed, role, variant) | {"class": cls}


def _run(final: str) -> list[dict[str, Any]]:
    """Two prompts of one class; the static arm runs at twice the baseline; the daemon tries
    a map-k variant at the baseline's speed (half the static arm's) and a mod variant at the
    static arm's, then ends on ``final``."""
    rows = []
    for pid in ("a", "b"):
        rows += [row("none", pid, 50.0), row("ngram-mod.s", pid, 100.0)]
    rows += [
        _daemon("a", 50.0, "trial", "ngram-map-k.n4.m48", "code"),
        _daemon("b", 100.0, "trial", "ngram-mod.x", "code"),
        _daemon("a", 100.0, "exploit", "ngram-mod.x", "code"),
        _daemon("b", 100.0, "control", "none", "code"),
        _daemon("b", 100.0, "exploit", final, "code"),
    ]
    return rows


def test_trials_exploits_and_finals_add_up_over_runs() -> None:
    found = tally([_run("ngram-mod.x"), _run("ngram-simple.y")])
    assert found["runs"] == 2
    mapk, mod = found["variants"]["ngram-map-k.n4.m48"], found["variants"]["ngram-mod.x"]
    assert mapk == {"trial_requests": 2, "exploit_requests": 0, "final": 0,
                    "trials_priced": 2, "trial_speed_over_static": 0.5}  # fmt: skip
    assert mod["trial_requests"] == 2 and mod["trial_speed_over_static"] == pytest.approx(1.0)
    assert mod["exploit_requests"] == 3 and mod["final"] == 1  # ended one run's class
    assert found["variants"]["ngram-simple.y"]["final"] == 1
    assert found["variants"]["ngram-simple.y"]["trial_speed_over_static"] is None
    assert "none" not in found["variants"]  # a control is neither a trial nor an exploit
    assert found["spec_types"]["ngram-mod"]["exploit_requests"] == 3


def test_a_run_without_a_static_arm_counts_but_is_not_priced() -> None:
    rows = [r for r in _run("ngram-mod.x") if r["arm"] != "ngram-mod.s"]
    mapk = tally([rows])["spec_types"]["ngram-map-k"]
    assert mapk["trial_requests"] == 1 and mapk["trials_priced"] == 0
    assert mapk["trial_speed_over_static"] is None


def test_the_command_reads_run_directories(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # as the bench writes them: an item index and a class on every row
    rows = [r | {"item": ord(r["id"]) - ord("a"), "class": "code"} for r in _run("none")]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "yield.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.search_yield", str(run), str(tmp_path), "--out",
         str(out)], cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    assert written["run_dirs"] == [str(run)] and written["variants"]["none"]["final"] == 1
    empty = subprocess.run(
        [sys.executable, "-m", "benchmarks.search_yield", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert empty.returncode == 2 and "requests.jsonl" in empty.stderr
