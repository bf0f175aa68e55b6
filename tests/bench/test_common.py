"""``benchmarks/common.py``: reading a bench run's rows for the analysis scripts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.common import read_requests

GOOD = {"arm": "none", "item": 0, "class": "c", "tokens": 10, "ms": 5.0}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (f"{json.dumps(GOOD)}\n{json.dumps(GOOD | {'item': None})}\n", "line 2: no 'item'"),
        (f"\n{json.dumps(GOOD | {'ms': 'slow'})}\n", "line 2: 'ms' is 'slow'"),
        ("{half\n", "no readable requests.jsonl"),
    ],
)
def test_a_broken_row_is_a_usage_error_naming_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    (tmp_path / "requests.jsonl").write_text(text)
    with pytest.raises(SystemExit) as exit_:
        read_requests(argparse.ArgumentParser(prog="x"), tmp_path)
    assert exit_.value.code == 2 and problem in capsys.readouterr().err


def test_readable_rows_come_back_in_order(tmp_path: Path) -> None:
    rows = [GOOD, GOOD | {"item": 1}, {"arm": "tuner", "item": 1, "class": "c", "error": "x"}]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n\n" for r in rows))
    assert read_requests(argparse.ArgumentParser(), tmp_path) == rows
