"""Logs are JSON lines when not on a terminal, uvicorn's included; httpx and apscheduler
stay quiet."""

from __future__ import annotations

import json
import logging

import pytest
import structlog

from tuner.logs import configure_logging, get_logger


def test_json_lines_for_ours_and_stdlib(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "info")
    structlog.contextvars.bind_contextvars(request_id="req_1")
    get_logger("tuner.x").info("request", status=200)
    structlog.contextvars.clear_contextvars()
    logging.getLogger("uvicorn.error").info("Uvicorn running")
    logging.getLogger("httpx").info("HTTP Request: GET /health")
    logging.getLogger("apscheduler.executors.default").info('Running job "sync"')
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0] == {**lines[0], "event": "request", "status": 200, "request_id": "req_1"}
    assert lines[1]["event"] == "Uvicorn running" and lines[1]["logger"] == "uvicorn.error"
    assert len(lines) == 2  # the INFO lines of httpx and apscheduler were dropped


def test_level_filters(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "warning")
    get_logger("tuner.x").info("hidden")
    get_logger("tuner.x").warning("shown")
    assert [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()] == ["shown"]


class _Full:
    """An output that refuses every write, like a file on a full disk."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")


def test_unwritable_output_drops_lines_without_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    configure_logging("json", "info")
    monkeypatch.setattr("sys.stderr", _Full())
    get_logger("tuner.x").info("request", status=200)  # raised OSError before
    logging.getLogger("uvicorn.error").error("lost too")
