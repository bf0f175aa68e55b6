"""The tuner on hybrid recurrent MoE targets with an MTP head, on the real llama-server.

Random weights write noise, so acceptance is forced (``--spec-synth-rates``, fitted to each
variant's draft length): where every ``draft-mtp`` setting loses, the kill switch keeps the
class off; where one pays, the tuner finds it and serves it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.conftest import require, start_daemon
from tests.integration.test_bench import tuner
from tuner.settings import load_settings
from tuner.upstream.provision import default_vocab
from tuner.workload import WorkloadItem

pytestmark = pytest.mark.llama

# Every request explores until three trials are done: seconds, not the default budget's hours.
MTP_ONLY = """
seed = 7
[budget]
explore_share = 1.0
trial_requests = 3
min_trial_requests = 2
max_trials = 3
min_class_requests = 2
[search.draft-mtp]
n_max = [1, {longest}]
"""
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _hybrid(tmp_path: Path, *size: str) -> Path:
    path = tmp_path / "hybrid.gguf"
    made = tuner(
        "synth-moe", str(path), "--arch", "qwen35moe", "--mtp-layers", "1", *size, state=tmp_path
    )
    assert made.returncode == 0, made.stderr[-2000:]
    return path


def _serve(
    tmp_path: Path, model: Path, rates: str, requests: int, longest: int
) -> tuple[list[str], Any]:
    """The daemon on ``model`` at forced acceptance, choosing between MTP drafts of one and
    ``longest`` tokens: the variant of each answer, and the class's saved policy."""
    require("draft-mtp", "--spec-synth-rates")
    (tmp_path / "tuning.toml").write_text(MTP_ONLY.format(longest=longest))
    state = tmp_path / "state"
    state.mkdir()
    env = {
        "TUNER_MODEL": str(model),
        "TUNER_TUNING_FILE": str(tmp_path / "tuning.toml"),
        "TUNER_SPEC_ARGS": f"--spec-synth-rates {rates}",
        "TUNER_THREADS": "2",
    }
    running = start_daemon(state, env=env)
    served: list[str] = []
    try:
        path, body = WorkloadItem(id="story", prompt=PROMPT, temperature=0.0).request(64)
        for _ in range(requests):
            response = httpx.post(running.url + path, json=body, timeout=180)
            assert response.status_code == 200, response.text
            served.append(f"{response.headers['x-spec-variant']}:{response.headers['x-spec-role']}")
    finally:
        assert running.stop() == 0
    classes = json.loads((state / "policies.json").read_text())["classes"]
    key = next(k for k in classes if k.count("/") == 2)
    return served, classes[key]["policy"]


def test_the_kill_switch_keeps_a_losing_mtp_head_off(tmp_path: Path) -> None:
    """A tiny hybrid on the Qwen3.5 vocabulary: its output head is most of a step, so the
    MTP head's every draft costs about a step and loses at any acceptance (0.4-0.7x)."""
    model = _hybrid(
        tmp_path,
        "--experts",
        "16",
        "--active",
        "4",
        "--layers",
        "4",
        "--hidden",
        "64",
        "--expert-ffn",
        "64",
    )
    served, policy = _serve(tmp_path, model, "0.5", 24, longest=3)
    assert policy["variant"] == "none" and not policy["speculation"], policy
    assert "draft-mtp.max3:trial" in served, served  # it was tried, and measured slower
    assert served[-4:] == ["none:exploit"] * 4, served


def test_the_tuner_finds_and_serves_an_mtp_head_that_pays(tmp_path: Path) -> None:
    """A hybrid whose trunk, not its output head, is most of a step (a small vocabulary, as
    in a 35B; sixteen layers): the MTP head drafting six tokens pays 1.35-1.45x when all are
    kept on 2 CPU cores. Eight layers drafting three paid 1.05-1.15x there, inside the noise
    between launches: verifying a batch through the recurrent layers costs most of a step
    per token on a CPU."""
    vocab = default_vocab(load_settings().cache_dir)
    model = _hybrid(
        tmp_path,
        "--experts",
        "4",
        "--active",
        "4",
        "--layers",
        "16",
        "--hidden",
        "1024",
        "--expert-ffn",
        "1024",
        "--vocab",
        str(vocab),
    )
    served, policy = _serve(tmp_path, model, "1", 20, longest=6)
    assert policy["variant"].startswith("draft-mtp") and policy["speculation"], policy
    assert policy["speedup_low"] > 1.0, policy
    assert served[-3:] == [f"{policy['variant']}:exploit"] * 3, served
    # the report shows it like any variant: acceptance, accepted length, speedup, prediction
    report = tuner("report", "--state-dir", str(tmp_path / "state"), state=tmp_path)
    row = next(line for line in report.stdout.splitlines() if line.startswith(policy["class_key"]))
    assert policy["variant"] in row and "x [" in row and "1.00 [" in row, row
