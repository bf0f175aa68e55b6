"""Plots and the fleet are extras: without them the daemon runs, and the feature that needs
one says which to install and exits 2."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli.main import main


def test_a_missing_extra_is_named_with_its_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("matplotlib", "psycopg") else found(name, *a),
    )
    code = main(["report", "--state-dir", str(tmp_path), "--plot", str(tmp_path / "p.png")])
    assert code == 2
    assert "pip install 'spec-tuner[plot]'" in capsys.readouterr().err
    assert main(["report", "--storage-url", "postgresql://x@nowhere/db"]) == 2
    assert "pip install 'spec-tuner[fleet]'" in capsys.readouterr().err


def test_the_daemon_imports_without_either_extra() -> None:
    blocker = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('psycopg', 'matplotlib'):\n"
        "            raise ImportError('not installed')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import tuner.daemon.serve, tuner.cli.main, tuner.report.data, tuner.bench.run\n"
    )
    subprocess.run([sys.executable, "-c", blocker], check=True)
