"""A real draft model with real acceptance, on the real llama-server: one cut from Gemma's
own file (``tuner derive-draft``), the only same-vocabulary draft at hand offline."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import start_daemon
from tests.integration.test_bench import tuner
from tuner.workload import WorkloadItem

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test

DRAFT_ONLY = """
seed = 7
[budget]
explore_share = 1.0
trial_requests = 3
min_trial_requests = 2
max_trials = 2
min_class_requests = 2
[search.draft-simple]
n_max = [3]
"""
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def test_a_draft_that_accepts_serves_where_it_is_faster_and_is_switched_off_where_not(
    tmp_path: Path,
) -> None:
    """All of Gemma's blocks: the draft agrees with the target on nearly every token. On
    mainline each drafted token costs about a target step, so ``draft-simple`` loses and the
    class ends without speculation; ik_llama.cpp 55d3c05 decodes the same requests twice as
    fast with it (its wall times, 250 against 550 ms), and the class keeps it. Either way the
    class ends on what its requests' wall times say is faster: the ground truth here is the
    server's clock, not the token counts the tuner prices. The daemon's start-up check passes
    the pair (same tokenizer)."""
    draft = tmp_path / "draft.gguf"
    made = tuner("derive-draft", str(draft), "--layers", "0-17", state=tmp_path)
    assert made.returncode == 0, made.stderr[-2000:]
    (tmp_path / "tuning.toml").write_text(DRAFT_ONLY)
    state = tmp_path / "state"
    state.mkdir()
    env = {
        "TUNER_DRAFT_MODEL": str(draft),
        "TUNER_TUNING_FILE": str(tmp_path / "tuning.toml"),
        "TUNER_THREADS": "2",
    }
    running = start_daemon(state, env=env)
    served: list[str] = []
    drafted = accepted = 0
    wall: dict[bool, list[float]] = {True: [], False: []}  # speculating or not: seconds
    try:
        path, body = WorkloadItem(id="story", prompt=PROMPT, temperature=0.0).request(48)
        for _ in range(14):
            response = httpx.post(running.url + path, json=body, timeout=180)
            assert response.status_code == 200, response.text
            variant = response.headers["x-spec-variant"]
            wall[variant != "none"].append(response.elapsed.total_seconds())
            served.append(f"{variant}:{response.headers['x-spec-role']}")
            if variant.startswith("draft-simple"):
                timings = response.json()["timings"]
                drafted += timings["draft_n"]
                accepted += timings["draft_n_accepted"]
    finally:
        assert running.stop() == 0
    assert "draft-simple.max3:trial" in served, served
    assert drafted > 0 and accepted / drafted > 0.5, (drafted, accepted)  # real acceptance
    classes = json.loads((state / "policies.json").read_text())["classes"]
    policy = classes[next(k for k in classes if k.count("/") == 2)]["policy"]
    faster = statistics.median(wall[True][1:]) < statistics.median(wall[False])  # 1st: a load
    assert policy["speculation"] is faster, (policy, wall)
    kept = "draft-simple.max3" if faster else "none"
    assert policy["variant"] == kept and served[-2:] == [f"{kept}:exploit"] * 2, served
