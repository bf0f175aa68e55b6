"""The shipped systemd unit passes systemd's own checker, where systemd is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze absent")
def test_unit_file_verifies(tmp_path: Path) -> None:
    unit = tmp_path / "spec-tuner.service"
    text = (DEPLOY / "spec-tuner.service").read_text()
    # Point ExecStart at an executable that exists here; verify checks it.
    unit.write_text(text.replace("/opt/spec-tuner/.venv/bin/tuner", shutil.which("true") or ""))
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    problems = [
        line
        for line in result.stderr.splitlines()
        if str(unit) in line or "spec-tuner.service" in line
    ]
    assert result.returncode == 0 and not problems, result.stderr


def test_unit_stops_children_itself_and_uses_the_env_file() -> None:
    text = (DEPLOY / "spec-tuner.service").read_text()
    assert "KillMode=mixed" in text
    # readiness and watchdog come from the daemon (tuner.systemd), reload is SIGHUP
    for line in (
        "Type=notify",
        "NotifyAccess=main",
        "WatchdogSec=30",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "ProtectSystem=strict",
        "NoNewPrivileges=true",
        "StateDirectory=spec-tuner",
    ):
        assert f"\n{line}\n" in text, line
    assert "EnvironmentFile=-/etc/spec-tuner/spec-tuner.env" in text
    assert (DEPLOY / "spec-tuner.env.example").is_file()
