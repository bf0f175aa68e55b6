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


def test_the_install_step_makes_the_files_with_their_modes(tmp_path: Path) -> None:
    """``deploy/install.sh --root``: the unit, the system user's sysusers entry (no login
    shell), and /etc/spec-tuner readable by the service group only (the env file holds
    the API keys and a database URL); an edited file is kept on a second install."""
    script = DEPLOY / "install.sh"
    run = [str(script), "--root", str(tmp_path), "--no-provision"]
    subprocess.run(run, check=True, capture_output=True, text=True)
    modes = {
        "etc/systemd/system/spec-tuner.service": 0o644,
        "usr/lib/sysusers.d/spec-tuner.conf": 0o644,
        "etc/spec-tuner": 0o750,
        "etc/spec-tuner/spec-tuner.env": 0o640,
        "etc/spec-tuner/spec-tuner.toml": 0o640,
    }
    for path, mode in modes.items():
        assert (tmp_path / path).stat().st_mode & 0o777 == mode, path
    sysusers = (tmp_path / "usr/lib/sysusers.d/spec-tuner.conf").read_text()
    assert "/usr/sbin/nologin" in sysusers
    env = tmp_path / "etc/spec-tuner/spec-tuner.env"
    assert "TUNER_CONFIG=/etc/spec-tuner/spec-tuner.toml" in env.read_text().splitlines()
    env.write_text("TUNER_API_KEYS=mine\n")
    subprocess.run(run, check=True, capture_output=True, text=True)
    assert env.read_text() == "TUNER_API_KEYS=mine\n"


def test_the_unit_keeps_downloads_out_of_the_state_dir_and_runs_in_it() -> None:
    text = (DEPLOY / "spec-tuner.service").read_text()
    assert "\nWorkingDirectory=/var/lib/spec-tuner\n" in text  # not the read-only /
    assert "\nEnvironment=HOME=/var/cache/spec-tuner\n" in text  # the default model's cache
    assert "\nAfter=network-online.target\n" in text and "\nWants=network-online.target\n" in text
    toml = (DEPLOY / "spec-tuner.toml.example").read_text()
    assert "systemctl reload" in toml
