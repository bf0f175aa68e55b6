"""Summarizing a run directory: rows, meta and the tuner's final policies."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.bench.test_analyse import CLASSES, static_rows, tuner_row
from tests.bench.test_render import assert_documented
from tuner.bench.daemons import Quiet, final_policies, final_speedups
from tuner.bench.run import _report_machine, finish
from tuner.bench.schedule import CHALLENGER, TUNER
from tuner.errors import ConfigError
from tuner.tuning.runtime.collectors import ReplayCollector


def write_run(out: Path, policies: dict[str, object] | None) -> None:
    rows = static_rows() + [tuner_row(i % 2, "fast-code") for i in range(6)]
    for row in rows:
        row["class"] = CLASSES[int(row["item"])]
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "run.json").write_text(json.dumps({"model": "m.gguf", "seed": 3}))
    if policies is not None:
        (out / "tuner-state").mkdir()
        (out / "tuner-state" / "policies.json").write_text(json.dumps({"classes": policies}))


def test_finish_writes_the_summary_from_the_directory(tmp_path: Path) -> None:
    policy = {
        "variant": "fast-code",
        "speculation": True,
        "settled": True,
        "reason": "measured 2.00x",
    }
    write_run(tmp_path, {"code": {"policy": policy, "served_by": "code"}})
    summary = finish(tmp_path)
    assert summary["model"] == "m.gguf" and summary["seed"] == 3
    code = summary["classes"]["code"]
    assert code["final_variant"] == "fast-code" and code["converged"]
    assert code["final_reason"] == "measured 2.00x"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "summary.md").is_file() and (tmp_path / "summary.png").is_file()


def test_finish_sets_what_the_tuner_priced_beside_the_static_arms(tmp_path: Path) -> None:
    policy = {"variant": "fast-code", "speculation": True, "settled": True, "reason": "m"}
    speedups = {
        "fast-code": [2.2, 2.0, 2.4],
        "not-a-static-arm": [1.5, 1.4, 1.6],
        "garbled": ["x", 1, 2],
        "short": [1.0],
    }
    write_run(tmp_path, {"code": {"policy": policy, "speedups": speedups}})
    priced = final_speedups(tmp_path / "tuner-state")["code"]
    assert set(priced) == {"fast-code", "not-a-static-arm"}  # the malformed ones left out
    summary = finish(tmp_path)
    measured = summary["classes"]["code"]["arms"]["fast-code"]["ratio"]
    assert summary["pricing"]["pairs"] == 1
    row = summary["pricing"]["rows"][0]
    assert (row["class"], row["variant"], row["predicted"]) == ("code", "fast-code", 2.2)
    assert row["ratio"] == pytest.approx(2.2 / measured, abs=1e-3)
    assert "## Pricing: what the tuner believed" in (tmp_path / "summary.md").read_text()
    assert_documented(summary)


def test_a_class_served_by_its_parent_takes_the_parents_policy(tmp_path: Path) -> None:
    parent = {"variant": "meh", "speculation": True, "settled": True, "reason": "measured"}
    young = {"variant": "none", "speculation": False, "reason": "no evidence yet"}
    state = tmp_path / "tuner-state"
    state.mkdir()
    (state / "policies.json").write_text(
        json.dumps(
            {
                "classes": {
                    "code": {"policy": parent, "served_by": "code"},
                    "code/echo/greedy": {"policy": young, "served_by": "code"},
                    "prose": {"policy": young, "served_by": "prose"},
                    "odd": "not a mapping",
                }
            }
        )
    )
    final = final_policies(state)
    assert final["code/echo/greedy"].variant == "meh" and final["code/echo/greedy"].settled
    assert final["prose"].variant == "none" and not final["prose"].settled
    assert "odd" not in final


def test_no_state_and_broken_state_give_no_policies(tmp_path: Path) -> None:
    assert final_policies(tmp_path / "missing") == {}
    (tmp_path / "policies.json").write_text("{half")
    assert final_policies(tmp_path) == {}


def test_a_directory_without_requests_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"requests\.jsonl"):
        finish(tmp_path)
    (tmp_path / "requests.jsonl").write_text(
        json.dumps({"arm": "x", "item": 0, "class": "c", "tokens": 1, "ms": 1}) + "\n"
    )
    with pytest.raises(ConfigError, match="baseline"):
        finish(tmp_path)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"arm": "none", "class": "c", "tokens": 1, "ms": 1}', "line 2: no 'item'"),
        ('{"arm": "none", "item": "0", "class": "c", "tokens": 1, "ms": 1}', "line 2: 'item'"),
        ("{half", "line 2: not JSON"),
        ("[1]", "line 2: not an object"),
    ],
)
def test_a_broken_request_row_is_a_clear_error_naming_its_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    good = json.dumps({"arm": "none", "item": 0, "class": "c", "tokens": 1, "ms": 1})
    (tmp_path / "requests.jsonl").write_text(f"{good}\n{line}\n")
    with pytest.raises(ConfigError, match=problem):
        finish(tmp_path)


class _Replayer:
    """What the daemon's counterfactual collector reads, set by the test."""

    done = dropped = failed = checked = agreed = mod_simulated = mod_served = 0
    offered = pending = 0


async def test_the_bench_waits_for_a_daemons_replays() -> None:
    """``Quiet`` reads the daemon's real metrics exposition: it polls until every answered
    request was offered and none is pending; a daemon without replay metrics is not waited
    for."""
    replayer = _Replayer()
    registry = CollectorRegistry()
    registry.register(ReplayCollector(replayer))  # type: ignore[arg-type]
    polls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        if request.url.host == "plain":
            return httpx.Response(200, text="# no replays here\n")
        polls += 1
        if polls == 3:  # the replay finishes while the bench polls
            replayer.offered, replayer.pending = 1, 0
        return httpx.Response(200, text=generate_latest(registry).decode())

    replayer.offered, replayer.pending = 0, 1
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:
        quiet = Quiet(http, {TUNER: "http://daemon", CHALLENGER: "http://plain"})
        await quiet.wait(TUNER)
        assert polls == 3
        replayer.offered = 2  # the next request's replay is done at once
        await quiet.wait(TUNER)
        assert polls == 4
        await quiet.wait(CHALLENGER)
        assert polls == 4  # the plain daemon's metrics are read, not polled


@pytest.mark.parametrize(
    ("other", "steal", "warned"), [(0.01, 0.0, False), (0.2, 0.0, True), (0.0, 0.06, True)]
)
def test_a_busy_machine_is_reported_at_the_end(other: float, steal: float, warned: bool) -> None:
    said: list[str] = []
    _report_machine(said.append, {"other_share": other, "steal_share": steal})
    assert bool(said) == warned
    assert not said or f"other processes used {other:.0%} of the machine's CPU" in said[0]


def test_an_engine_with_its_own_autotune_gets_it_as_arms() -> None:
    from tuner.bench.run import autotune_arms
    from tuner.upstream.capabilities import parse_capabilities
    from tuner.upstream.launch import Prepared

    data = Path(__file__).parents[1] / "upstream" / "data"
    ik = parse_capabilities((data / "help-ik-55d3c05.txt").read_text())
    arms = dict(autotune_arms(Prepared(Path("/ik/llama-server"), ik, Path("/m.gguf"), None)))
    assert arms == {
        "peer:autotune-ngram-mod": ("--spec-type", "ngram-mod", "--spec-autotune"),
        "peer:autotune-ngram-simple": ("--spec-type", "ngram-simple", "--spec-autotune"),
    }
    mainline = parse_capabilities((data / "help-0c1e570.txt").read_text())
    assert autotune_arms(Prepared(Path("/l/llama-server"), mainline, Path("/m.gguf"), None)) == ()
