"""``benchmarks/workloads/make_fresh.py``: 520 distinct prompts of every kind and form."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.workloads.make_fresh import CHAT, KINDS, PER_KIND, SAMPLED, workload
from tuner.classify import classify, load_definitions
from tuner.workload import load_workload

FRESH = Path(__file__).resolve().parents[2] / "benchmarks/workloads/fresh.jsonl"


def _text(row: dict[str, object]) -> str:
    return json.dumps(row.get("prompt") or row.get("messages"))


def test_every_prompt_is_new_and_every_kind_comes_in_both_forms_and_both_modes() -> None:
    rows = workload(0)
    assert len(rows) == PER_KIND * len(KINDS) == 520
    assert len({_text(r) for r in rows}) == len(rows)
    assert len({r["id"] for r in rows}) == len(rows)
    kinds = Counter(str(r["class_hint"]) for r in rows)
    assert set(kinds.values()) == {PER_KIND}
    for kind in KINDS:
        mine = [r for r in rows if r["class_hint"] == kind]
        assert sum("messages" in r for r in mine) == CHAT
        assert sum(r["temperature"] != 0 for r in mine) == SAMPLED


def test_the_committed_file_is_what_the_generator_writes_and_the_bench_loads_it() -> None:
    rows = [json.loads(line) for line in FRESH.read_text().splitlines()]
    assert rows == workload(0)
    assert workload(1) != rows  # the seed matters
    assert len(load_workload(FRESH)) == 520


def test_a_longer_workload_keeps_every_prompt_new_and_the_same_share_of_forms() -> None:
    rows = workload(1, per_kind=130)
    assert len(rows) == 1040 and len({_text(r) for r in rows}) == 1040
    assert len({r["id"] for r in rows}) == 1040
    for kind in KINDS:
        mine = [r for r in rows if r["class_hint"] == kind]
        assert len(mine) == 130
        assert sum("messages" in r for r in mine) == 26
        assert sum(r["temperature"] != 0 for r in mine) == 26
    long = FRESH.with_name("fresh1040.jsonl").read_text()
    committed = [json.loads(line) for line in long.splitlines()]
    assert committed == rows
    with pytest.raises(ValueError):
        workload(0, per_kind=0)
    with pytest.raises(ValueError, match="code-gen: its template gave only 132"):
        workload(0, per_kind=200)  # asks for more than the template has


def test_the_prompts_land_in_many_classes() -> None:
    definitions = load_definitions()
    classes = Counter(
        classify(item.model_dump(exclude_none=True), definitions).key
        for item in load_workload(FRESH)
    )
    assert len(classes) >= 10
    assert max(classes.values()) < 0.25 * 520
