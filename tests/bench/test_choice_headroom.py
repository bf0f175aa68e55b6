"""``benchmarks/choice_headroom.py``: what a choice per class can earn over one static arm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.choice_headroom import choice_headroom, held_out, priced
from tuner.workload import load_workload


def row(arm: str, pid: str, cls: str, d: int = 0, a: int = 0, c: float = 0.5,
        n: int = 100) -> dict[str, Any]:  # fmt: skip
    """A request of ``n`` tokens on a prompt decoding at 100 tok/s without speculation:
    ``d`` drafted and ``a`` accepted, each drafted token costing ``c`` plain steps."""
    steps = n - a + c * d
    return {"arm": arm, "id": pid, "class": cls, "tokens": n, "ms": 10.0 * steps,
            "variant": arm, "drafted": d, "accepted": a}  # fmt: skip


def run(per_class: int = 20) -> list[dict[str, Any]]:
    """Class ``x`` accepts more with arm ``long``, class ``y`` with arm ``short``; the
    daemons' rows and a failed request are left out of every figure."""
    rows = []
    for cls, (long_a, short_a) in (("x", (60, 30)), ("y", (10, 30))):
        for k in range(per_class):
            pid = f"{cls}-{k}"
            rows += [row("none", pid, cls), row("long", pid, cls, 80, long_a + k % 3)]
            rows += [row("short", pid, cls, 40, short_a + k % 2)]
            rows += [row("tuner", pid, cls, 80, 80)]
    rows.append({"arm": "long", "id": "x-0", "tokens": 0, "ms": 0, "error": "boom"})
    return rows


def test_prompts_are_priced_at_each_arms_measured_cost() -> None:
    prompts, classes = priced(run(2))
    assert sorted(prompts) == ["x-0", "x-1", "y-0", "y-1"]
    assert set(prompts["x-0"]) == {"long", "short"}  # the daemons are not static arms
    assert prompts["x-0"]["long"] == pytest.approx((100, 100 - 60 + 0.5 * 80))
    assert classes["y-1"] == "y"


def test_a_prompt_some_arm_did_not_answer_is_left_out() -> None:
    rows = [r for r in run(2) if not (r["id"] == "y-1" and r["arm"] == "short")]
    assert "y-1" not in priced(rows)[0]


def test_a_choice_per_class_beats_the_single_arm_where_classes_differ() -> None:
    found = choice_headroom(run(), splits=50)
    sample = found["in_sample"]
    assert sample["best_static"] < sample["per_class"] <= sample["per_prompt"]
    assert found["held_out"]["static"]["vs_best_static"] == 1.0
    held = found["held_out"]["class"]
    assert held["low"] > 1.0 and held["vs_best_static"] == pytest.approx(
        sample["per_class"] / sample["best_static"], rel=0.02
    )


def test_a_grouping_that_carries_nothing_earns_nothing_over_the_class() -> None:
    prompts, classes = priced(run())
    by_class = held_out(prompts, classes, classes.__getitem__, 30)
    by_parity = held_out(prompts, classes, lambda p: (classes[p], int(p[2:]) % 2), 30)
    assert sum(by_parity) / 30 == pytest.approx(sum(by_class) / 30, abs=0.01)


def test_the_workload_adds_the_form_and_echo_groupings(tmp_path: Path) -> None:
    workload = tmp_path / "w.jsonl"
    lines = []
    for cls in ("x", "y"):
        for k in range(20):
            text = f"Summarise this note {k}: the quick brown fox."
            item = {"id": f"{cls}-{k}", "max_tokens": 100}
            item |= {"messages": [{"role": "user", "content": text}]} if k % 2 else {"prompt": text}
            lines.append(json.dumps(item))
    workload.write_text("\n".join(lines) + "\n")
    found = choice_headroom(run(), load_workload(workload), splits=20)
    assert set(found["held_out"]) == {"static", "class", "class+form", "class+echo"}


def test_the_workloads_own_kinds_find_what_the_class_hides(tmp_path: Path) -> None:
    """Within one class, prompts of one kind accept more with arm ``long`` and the other
    kind's with ``short``: a choice per class earns nothing over the single arm, a choice
    per kind (the workload's ``class_hint``) earns it, learned on other prompts."""
    rows, lines = [], []
    for k in range(40):
        pid, hint = f"x-{k}", ("echo", "fresh")[k % 2]
        long_a, short_a = (60, 30) if hint == "echo" else (10, 30)
        rows += [row("none", pid, "x"), row("long", pid, "x", 80, long_a + k % 3)]
        rows += [row("short", pid, "x", 40, short_a + k % 2)]
        lines.append(json.dumps({"id": pid, "prompt": f"p {k}", "class_hint": hint}))
    workload = tmp_path / "w.jsonl"
    workload.write_text("\n".join(lines) + "\n")
    held = choice_headroom(rows, load_workload(workload), splits=30)["held_out"]
    assert held["class"]["vs_best_static"] == pytest.approx(1.0, abs=0.01)
    assert held["kind"]["low"] > 1.03, held


def test_no_static_arms_gives_no_figures() -> None:
    assert choice_headroom([row("none", "a", "x"), row("tuner", "a", "x", 10, 5)]) == {"prompts": 0}
