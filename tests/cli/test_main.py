"""The CLI commands, called as functions with argv (and once as a process, for its pipe)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli.main import main
from tuner.records import RecordStore, RequestRecord, Timings


def write_records(state: Path) -> None:
    store = RecordStore(state / "records")
    rows = []
    for i in range(8):
        for variant, tps, drafted, accepted in (("none", 60 + i, 0, 0), ("ngs", 90 + i, 50, 40)):
            timings = Timings(
                predicted_n=100,
                predicted_per_second=tps,
                draft_n=drafted or None,
                draft_n_accepted=accepted or None,
            )
            rows.append(
                RequestRecord(
                    id=f"{variant}{i}",
                    ts=i,
                    endpoint="/v1/completions",
                    stream=False,
                    status=200,
                    proxy_ms=1,
                    timings=timings,
                    class_key="code/echo/greedy",
                    variant=variant,
                )
            )
    store._write(rows)


def test_measure_shows_alpha_and_speedup_against_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_records(tmp_path)
    assert main(["measure", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(row for row in out.splitlines() if "ngs" in row)
    assert "0.80 [" in line  # alpha 40/50
    assert "1.47 [" in line  # 93.5 / 63.5 tok/s


def test_measure_on_empty_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measure", "--state-dir", str(tmp_path)]) == 0
    assert "no successful requests" in capsys.readouterr().out


def test_predict_prints_two_decimals(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--alpha", "0.55", "--gamma", "4", "--c", "0.2"]) == 0
    assert capsys.readouterr().out.strip() == "1.17"


def test_predict_refuses_impossible_alpha() -> None:
    with pytest.raises(SystemExit) as caught:
        main(["predict", "--alpha", "1.5"])
    assert caught.value.code == 2


def test_classify_jsonl_has_id_and_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"id": "a", "prompt": "Why is the sky blue?"}) + "\n")
    assert main(["classify", str(workload), "--format", "jsonl"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["id"] == "a" and row["class"] == "chat/fresh/greedy"


def test_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert main(["classify", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("tuner: error:")
    assert main(["inspect", "--model", str(bad)]) == 2


def test_a_reader_that_stops_early_is_not_an_error(tmp_path: Path) -> None:
    """``tuner classify FILE | head -1``: the closed pipe ends the command quietly."""
    workload = tmp_path / "w.jsonl"
    row = json.dumps({"id": "a", "prompt": "Why is the sky blue? " * 20})
    workload.write_text((row + "\n") * 2000)  # far more output than a pipe buffers
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "classify", str(workload), "--format", "jsonl"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["id"] == "a"
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_the_command_line_speaks_to_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    from tuner import __version__

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"tuner {__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    assert "speculative-decoding" in top and "tests call" not in top
    listed = {line.split()[0] for line in top.splitlines() if line.startswith("    ")}
    assert {"serve", "report", "policies", "engines"} <= listed
    assert not listed & {"synth-moe", "derive-draft", "calibrate"}  # named in the epilog
    assert "synth-moe" in top
    with pytest.raises(SystemExit):
        main(["policies", "export", "--help"])
    assert "the JSON file to write" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    serve = capsys.readouterr().out
    for option in ("--engine", "--model", "--draft-model", "--config", "docs/configuration.md"):
        assert option in serve


def test_config_is_taken_before_or_after_the_command(tmp_path: Path) -> None:
    from tuner.cli.commands import settings_from_args
    from tuner.cli.main import build_parser

    config = tmp_path / "spec-tuner.toml"
    config.write_text("port = 9191\n")
    for argv in (["--config", str(config), "serve"], ["serve", "--config", str(config)]):
        assert settings_from_args(build_parser().parse_args(argv)).port == 9191, argv


def test_report_on_a_state_dir_that_is_not_there_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--state-dir", str(tmp_path / "nowhere")]) == 2
    assert "no state dir at" in capsys.readouterr().err


def test_report_on_an_empty_state_says_what_the_daemon_will_start_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TUNER_TUNE", raising=False)
    assert main(["report", "--state-dir", str(tmp_path), "--format", "json"]) == 0
    outlook = json.loads(capsys.readouterr().out)["outlook"]
    assert outlook["tuning_off"] is None and "code/echo/greedy" in outlook["classes"]
    assert outlook["own_policy_after"] == 8 and outlook["explore_share"] == 0.01
    assert main(["report", "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "tuning is on, over 16 classes" in table and "after 8 measured requests" in table
    monkeypatch.setenv("TUNER_TUNE", "false")
    assert main(["report", "--state-dir", str(tmp_path)]) == 0
    assert "tuning is off (TUNER_TUNE=false" in capsys.readouterr().out


def test_report_of_a_class_that_is_none_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--state-dir", str(tmp_path), "--class", "prose"]) == 2
    assert "no class 'prose'" in capsys.readouterr().err
    assert main(["report", "--state-dir", str(tmp_path), "--class", "code/echo"]) == 0
    assert "no trials recorded for class 'code/echo'" in capsys.readouterr().out


def test_every_option_of_every_command_says_what_it_does() -> None:
    import argparse

    from tuner.cli.main import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bare = [
        f"{name} {action.option_strings or action.dest}"
        for name, command in commands.choices.items()
        for action in command._actions
        if action.help is None and action.dest != "help"
    ]
    assert bare == []
