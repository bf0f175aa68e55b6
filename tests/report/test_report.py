"""``tuner report`` on state written by the real engine (driven by the simulated upstream)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tuning.sim import CODE, HELP, PROSE, SimUpstream, config, drive, make, schedule, truth
from tuner.cli.main import main
from tuner.errors import TunerError
from tuner.model.envelope import cost_model
from tuner.report.data import SCHEMA, build_report, load_history, load_report
from tuner.report.render import as_json, as_markdown, as_table
from tuner.tuning.config import Override
from tuner.tuning.runtime.policy_file import POLICY_FILE, save_policies
from tuner.upstream.capabilities import parse_capabilities

FEW = "code/fresh/greedy"  # a class with too few requests: it borrows its parent's policy
FRESH = "code/fresh/greedy"  # no echo: on a small-active MoE nothing is predicted to pay
FORCED = "math/greedy"  # forced off by an override
META = {
    "model": "sim-model",
    "model_key": "sim",
    "build": "0c1e570",
    "hardware": {"cpu": "Sim CPU", "cores": 2, "ram_gib": 24, "gpus": []},
    "hardware_key": "",
}


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir after 1,200 requests: code edits learned a variant, prose is off."""
    state = tmp_path_factory.mktemp("state")
    cfg = config(explore_share=0.5)
    cfg = cfg.model_copy(update={"overrides": {FORCED: Override(off=True)}})
    engine = make(state, cfg, parse_capabilities(HELP.read_text()), scope="sim@")  # as META
    sim = SimUpstream(truth(list(engine.variants.values())))
    sim.speedups |= {FEW: sim.speedups[CODE], FORCED: sim.speedups[PROSE]}
    drive(engine, sim, schedule(1200) + [FEW] * 3 + [FORCED] * 5)
    save_policies(state / POLICY_FILE, META, engine.snapshot())
    return state


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir where the speedup model switched speculation off before any data."""
    state = tmp_path_factory.mktemp("moe")
    engine = make(
        state,
        config(),
        parse_capabilities(HELP.read_text()),
        cost=cost_model(experts=256, active=8, expert_fraction=0.7),
    )
    engine.route(FRESH)
    save_policies(state / POLICY_FILE, META, engine.snapshot())
    return state


def test_json_schema_and_values_follow_the_engine(learned: Path) -> None:
    document = json.loads(as_json(load_report(learned)))
    assert document["schema"] == SCHEMA and document["found"] is True
    assert document["model"] == "sim-model" and document["build"] == "0c1e570"
    rows = {row["class"]: row for row in document["classes"]}
    required = {
        "class",
        "variant",
        "speculation",
        "reason",
        "alpha",
        "speedup",
        "speedup_low",
        "speedup_high",
        "predicted_speedup",
        "requests",
    }
    assert all(required <= set(row) for row in rows.values())
    policies = json.loads((learned / POLICY_FILE).read_text())["classes"]

    code = rows[CODE]
    assert code["speculation"] is True and code["variant"].startswith("ngram-simple.n3")
    assert code["variant"] == policies[CODE]["policy"]["variant"]
    assert code["speedup_low"] > 1.0 and code["speedup_low"] <= code["speedup"]
    assert code["speedup"] <= code["speedup_high"]
    # the simulator accepts what makes 1.45x: (64 + 0.45 * 48 - 64 / 1.45) / 48 of 48 drafts
    assert code["alpha"] == pytest.approx(0.864, abs=0.05) and code["predicted_speedup"] > 0
    assert code["requests"] == policies[CODE]["seen"] and code["requests"] > 400
    assert 0 < code["exploration_share"] <= 0.5 + 1e-9
    assert 0 <= code["exploration_cost"] <= 0.5 * 1.1 + 1 / code["requests"]

    prose = rows[PROSE]
    assert prose["speculation"] is False and prose["variant"] == "none"
    assert prose["kill_switch"] is True and "no variant beats baseline" in prose["reason"]
    assert prose["speedup"] is None

    assert rows[FEW]["served_by"] != FEW and rows[FEW]["requests"] == 3
    assert rows[FORCED]["override"] is True and rows[FORCED]["speculation"] is False
    # Every class is counted once at the speedup of the policy that serves it.
    overall = document["overall"]
    assert overall["requests"] == 1208
    assert 1.0 < overall["expected_speedup"] < code["speedup"]


def test_table_shows_decisions_reasons_and_header(learned: Path) -> None:
    text = as_table(load_report(learned))
    assert "model: sim-model  engine: llama.cpp  build: 0c1e570" in text
    assert "Sim CPU, 2 cores, 24 GiB RAM, no GPU" in text
    assert "expected speedup of the current policies" in text
    # the interval the engine stores with a policy's acceptance: Wilson's, at 95 %
    assert "alpha [95% Wilson]" in text and "speedup [90%]" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line[:1].isalpha()}
    assert "ngram-simple.n3" in lines[CODE] and "x [" in lines[CODE]
    assert "speculation off" in lines[PROSE] and "no variant beats baseline" in lines[PROSE]
    assert "(override)" in lines[FORCED] and "forced off by override" in lines[FORCED]


def test_markdown_has_one_row_per_class(learned: Path) -> None:
    report = load_report(learned)
    text = as_markdown(report)
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(report.classes)  # the header row, then the classes
    assert text.startswith("# spec-tuner report")


def test_kill_switch_before_data_shows_the_predicted_reason(moe: Path) -> None:
    report = load_report(moe)
    row = next(r for r in report.classes if r.class_key == FRESH)
    assert row.kill_switch and not row.speculation
    assert "cannot pay" in row.reason and "MoE" in row.reason
    assert row.predicted_speedup is not None and row.predicted_speedup < 1.0
    assert "cannot pay" in as_table(report)
    assert report.expected_speedup == 1.0


def test_empty_state_renders_in_every_format(tmp_path: Path) -> None:
    report = load_report(tmp_path)
    assert not report.found and report.classes == [] and report.expected_speedup is None
    assert "no policies yet" in as_table(report)
    assert "no policies yet" in as_markdown(report)
    document = json.loads(as_json(report))
    assert document["classes"] == [] and document["overall"]["requests"] == 0
    assert load_history(tmp_path, CODE) == []


def test_damaged_state_files_are_reported_not_raised(tmp_path: Path) -> None:
    (tmp_path / POLICY_FILE).write_text("{broken")
    (tmp_path / "studies.db").write_text("not a database")
    report = load_report(tmp_path)
    assert report.unreadable and not report.found
    assert "could not be read" in as_table(report)
    assert json.loads(as_json(report))["unreadable"] is True
    with pytest.raises(TunerError, match="cannot read the Optuna studies"):
        load_history(tmp_path, CODE)
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "report", "--state-dir", str(tmp_path), "--class", CODE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and "tuner: error: cannot read the Optuna studies" in done.stderr


def test_abandoned_requests_are_counted_from_the_records(tmp_path: Path) -> None:
    from tuner.records import CLIENT_GONE, RequestRecord

    def record(n: int, error: str | None, tokens: int | None) -> str:
        timings = {"predicted_n": tokens} if tokens is not None else None
        return RequestRecord(
            id=f"r{n}", ts=0.0, endpoint="/v1/completions", stream=True, status=200,
            error=error, proxy_ms=1.0, timings=timings,
        ).model_dump_json()  # fmt: skip

    (tmp_path / "records").mkdir()
    lines = [record(0, CLIENT_GONE, None), record(1, f"{CLIENT_GONE} before the stream", 7),
             record(2, None, 9), record(3, "upstream died", 3)]  # fmt: skip
    (tmp_path / "records" / "records-0.jsonl").write_text("\n".join(lines) + "\n")
    report = load_report(tmp_path)
    assert (report.abandoned, report.abandoned_tokens) == (2, 7)
    assert json.loads(as_json(report))["overall"]["abandoned"] == 2
    assert "abandoned: 2 requests" in as_table(report)


def test_odd_documents_do_not_crash() -> None:
    odd = {"classes": {"x": {"policy": {"speedup": "fast", "since": None}, "arms": {}}}}
    report = build_report(odd)
    assert report.classes[0].speedup is None and report.classes[0].reason == "no policy yet"
    assert as_table(report) and as_json(report)


def test_class_history_comes_from_the_optuna_study(learned: Path) -> None:
    trials = load_history(learned, CODE)
    assert len(trials) >= 4
    assert {t.state for t in trials} <= {"complete", "pruned", "fail", "running"}
    best = max((t for t in trials if t.value is not None), key=lambda t: t.value or 0)
    assert best.variant.startswith("ngram-simple.n3") and best.value is not None
    assert best.value > 1.2
    assert load_history(learned, "no/such/class") == []


def test_cli_formats_history_and_plot(
    learned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "report.png"
    assert main(["report", "--state-dir", str(learned), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert CODE in out and "speculation off" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 50_000

    assert main(["report", "--state-dir", str(learned), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema"] == SCHEMA

    assert main(["report", "--state-dir", str(learned), "--class", CODE]) == 0
    out = capsys.readouterr().out
    assert f"trials of class {CODE}" in out and "ngram-simple" in out

    assert main(["report", "--state-dir", str(learned), "--class", CODE, "--format", "json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert history["class"] == CODE and len(history["trials"]) >= 4


def test_plot_of_empty_state_is_still_a_picture(tmp_path: Path) -> None:
    from tuner.report.plot import plot_report

    path = plot_report(load_report(tmp_path), {}, tmp_path / "empty.png")
    assert path.stat().st_size > 10_000


def test_the_docs_document_every_json_field(learned: Path) -> None:
    readme = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    table = readme.split("| field | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = {
        name
        for line in table.splitlines()[2:]
        for name in re.findall(r"`(\w+)`", line.split("|")[1])
    }
    row = json.loads(as_json(load_report(learned)))["classes"][0]
    assert documented == set(row)


def test_one_variant_at_a_time_is_reported(tmp_path: Path) -> None:
    """With one instance, the report names the variant serving all traffic and its gain."""
    from tests.tuning.runtime.test_single import mix, reloading, run

    caps = parse_capabilities(HELP.read_text())
    upstream, single = reloading(tmp_path, caps, 2.0, guess=5.0)
    engine = single.engine
    run(single, upstream, mix(900, 0.8))
    save_policies(tmp_path / POLICY_FILE, META, engine.snapshot(), extra=single.describe())

    report = load_report(tmp_path)
    assert report.single is not None and report.single["active"] == single.active
    assert single.active.startswith("ngram-simple")
    assert report.expected_speedup == pytest.approx(single.gains[single.active], abs=1e-4)
    assert f"{single.active} serves all traffic" in as_table(report)
    document = json.loads(as_json(report))
    assert document["single"]["switches"] == single.switches >= 1
    assert json.loads(as_json(build_report({"classes": {}})))["single"] is None


def test_replayed_evidence_shows_per_arm(tmp_path: Path) -> None:
    """A variant only ever replayed (never served) has its acceptance, its measured speedup
    and how many requests it was replayed on."""
    engine = make(tmp_path, config(), parse_capabilities(HELP.read_text()), scope="sim@")
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, [CODE] * 6)  # baseline requests: the class's speed
    for _ in range(6):
        engine.observe_replayed(CODE, "none", {"ngram-simple.n3.m48": (64, 40, 36)})
    save_policies(tmp_path / POLICY_FILE, META, engine.snapshot())
    row = next(r for r in load_report(tmp_path).classes if r.class_key == CODE)
    arm = next(a for a in row.arms if a.variant == "ngram-simple.n3.m48")
    assert arm.requests == 0 and arm.replayed == 6
    assert arm.alpha == pytest.approx(0.9, abs=0.01)
    assert arm.speedup is not None and arm.speedup > 1.0


def test_the_engine_measurement_is_in_the_report(tmp_path: Path) -> None:
    from tuner.engines.choice import CHOICE_FILE, EngineResult, new_choice, save_choice

    results = (
        EngineResult(engine="llama.cpp", build="0c1e570", tok_s=100.0, setting="none"),
        EngineResult(engine="ik_llama.cpp", build="55d3c05", tok_s=150.0, setting="none"),
    )
    save_choice(tmp_path / CHOICE_FILE, new_choice("m", "h", results, "llama.cpp"))
    document = json.loads(as_json(load_report(tmp_path)))
    assert document["engine"] == "ik_llama.cpp"  # no policies yet: the engine chosen
    assert [r["tok_s"] for r in document["engines"]["results"]] == [100.0, 150.0]
    assert "measured fastest" in document["engines"]["why"]
