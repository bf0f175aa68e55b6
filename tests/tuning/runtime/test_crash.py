"""kill -9 in the middle of policy and study writes: what was persisted stays readable.

A child process writes ``policies.json`` (atomic write + fsync) and Optuna trials
(SQLite, WAL) as fast as it can; the test kills it with SIGKILL at random moments,
five times on the same files, and checks after each kill that both open and hold at
least what the previous round saw.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tuner.tuning.runtime.policy_file import POLICY_FILE, load_policies, read_document

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tuner.tuning.runtime.policy_file import save_policies
    from tuner.tuning.search.studies import StudyBook
    state = Path(sys.argv[1])
    book = StudyBook(state / "studies.db", "crash")
    space = {"ngram-simple": {"size_n": [3, 4, 6], "size_m": [8, 16]}}
    arms = {"samples": [float(i) for i in range(256)], "requests": 256}
    study = book.open("code/echo/greedy", space)
    n = 0
    print("started", flush=True)
    while True:
        n += 1
        classes = {f"class{i}": {"seen": n, "arms": {"none": arms}} for i in range(16)}
        save_policies(state / "policies.json", {"model_key": "m", "round": n}, classes)
        number, _ = study.next()
        study.tell(number, 1.0 + n / 1000)
    """
)


def intact_trials(db: Path) -> int:
    """Trials in an Optuna SQLite file, after checking the file's integrity."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return int(conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0])


@pytest.mark.parametrize("seed", [1])
def test_kill_9_during_writes_leaves_policies_and_studies_intact(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    rounds, trials = 0, 0
    for _ in range(5):
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as child:
            assert child.stdout is not None and child.stdout.readline().strip() == "started"
            time.sleep(rng.uniform(0.3, 1.0))  # mid-write, most likely: it writes all the time
            child.send_signal(signal.SIGKILL)
            _, err = child.communicate(timeout=10)
        assert child.returncode == -signal.SIGKILL, err

        document = read_document(tmp_path / POLICY_FILE)
        assert document is not None, (tmp_path / POLICY_FILE).read_text()[:200]
        assert len(document["classes"]) == 16
        json.dumps(document)  # whole, not truncated
        assert document["round"] >= 1
        rounds = document["round"]
        now = intact_trials(tmp_path / "studies.db")
        assert now >= trials  # committed trials never disappear
        trials = now
    assert rounds >= 1 and trials >= 5
    # A kill mid-write can leave a temporary file beside the policy file; loading removes them.
    assert len(list(tmp_path.glob(".policies-*.tmp"))) <= 5
    assert load_policies(tmp_path / POLICY_FILE, {"model_key": "m"})
    assert list(tmp_path.glob(".policies-*.tmp")) == []

    # Optuna itself opens the study after the kills and continues it.
    from tuner.tuning.search.studies import StudyBook

    book = StudyBook(tmp_path / "studies.db", "crash")
    history = book.history("code/echo/greedy")
    assert len(history) >= trials - 5  # at most one running trial per kill is not complete
    space = {"ngram-simple": {"size_n": [3, 4, 6], "size_m": [8, 16]}}
    assert book.open("code/echo/greedy", space).fail_running() <= 5  # type: ignore[arg-type]
