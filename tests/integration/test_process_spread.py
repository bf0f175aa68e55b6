"""``benchmarks/process_spread.py`` (and ``benchmarks.common.start_llama_server``) against
the real llama-server and the default model."""

from __future__ import annotations

import pytest

from benchmarks.process_spread import run

pytestmark = pytest.mark.llama


def test_identical_processes_are_timed_against_each_other() -> None:
    found = run(processes=2, rounds=4, max_tokens=8)
    assert found["processes"] == 2 and len(found["ms_per_token"]) == 2
    assert all(ms > 0 for ms in found["ms_per_token"])
    assert len(found["spread_by_quarter"]) == 2
    for quarter in range(4):  # relative to the two's mean: they average to 1
        pair = [p[quarter] for p in found["spread_by_quarter"]]
        assert sum(pair) / 2 == pytest.approx(1.0, abs=0.01)
