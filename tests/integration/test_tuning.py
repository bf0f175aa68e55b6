"""The tuning engine on the real llama-server (router mode) and the real Gemma model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import engine_caps, start_daemon
from tests.integration.test_daemon import CODE_EDIT
from tuner.workload import WorkloadItem, load_workload

pytestmark = [pytest.mark.llama, pytest.mark.engine]  # run on both engines by make test

# A small space so the test settles in minutes on 2 cores; explore_share = 1 means every
# request is a trial or a control (the default budget is 10 %). min_gain = 1.25: on sampled
# stories ngram-simple.n3.m8 really measures 1.03-1.12 [0.96-1.02, 1.11-1.24] from 24
# requests (it accepted 0.43 of its drafted tokens in one run), so at the default 1.02, and
# even at 1.10, whether it cleared the guard was a coin's toss; the edits measure 1.7-2.2.
TUNING = """
[budget]
explore_share = 1.0
trial_requests = 4
min_trial_requests = 2
max_trials = 3
min_class_requests = 2
[guard]
confidence = 0.90
min_gain = 1.25
[prior]
enqueue = 3
[search.ngram-simple]
size_n = [3]
size_m = [8, 16]
[search.ngram-cache]
"""


def _tuned(tmp_path: Path, tuning_toml: str, **extra_env: str) -> tuple[Path, dict[str, str]]:
    """A fresh state dir and the daemon's environment for this tuning file (fixed seed)."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text(f"seed = 7\n{tuning_toml}")
    state = tmp_path / "state"
    state.mkdir()
    env = {"TUNER_TUNING_FILE": str(tuning), "TUNER_THREADS": "2"}
    return state, env | extra_env


def _send(url: str, item_body: tuple[str, dict[str, object]]) -> httpx.Response:
    path, body = item_body
    response = httpx.post(url + path, json=body, timeout=180)
    assert response.status_code == 200, response.text
    return response


def test_engine_settles_per_class_on_real_llama_server(tmp_path: Path) -> None:
    state, env = _tuned(tmp_path, TUNING)
    items = load_workload(Path(__file__).parents[2] / "tuner" / "data" / "dev.jsonl")
    # One echo-heavy edit, repeated: the dev workload's four edits differ from each other by
    # 2x in decode speed under n-gram drafting, too much spread for 4-request trials.
    edits = [WorkloadItem(id="edit", prompt=CODE_EDIT, temperature=0.0)]
    stories = [i for i in items if i.class_hint == "prose"]
    running = start_daemon(state, env=env)
    variants: dict[str, list[str]] = {}
    try:
        for n in range(24):
            edit = edits[n % len(edits)].request(64)
            story_path, story = stories[n % len(stories)].request(64)
            story |= {"temperature": 1.0, "seed": n}
            for key, request in (("edit", edit), ("story", (story_path, story))):
                response = _send(running.url, request)
                variants.setdefault(key, []).append(response.headers["x-spec-variant"])
    finally:
        assert running.stop() == 0

    policies = json.loads((state / "policies.json").read_text())["classes"]
    edit_class = next(k for k in policies if k.startswith("code/echo/"))
    story_class = next(k for k in policies if k.endswith("/sampled") and k.startswith("text"))
    edit_policy, story_policy = policies[edit_class]["policy"], policies[story_class]["policy"]
    # Echo-heavy code edits: a speculative variant, measured faster than baseline.
    assert edit_policy["speculation"], edit_policy
    assert edit_policy["variant"] != "none", edit_policy  # which one depends on the run
    assert edit_policy["speedup_low"] > 1.0, edit_policy
    assert edit_policy["alpha"] > 0.3, edit_policy
    # what the engine measures it at now, from the requests' token counts (the default):
    # still clear of baseline after every other request moved the calibrated draft cost
    value, low, high = policies[edit_class]["speedups"][edit_policy["variant"]]
    assert 1.0 < low <= value <= high, policies[edit_class]["speedups"]
    # Sampled stories: nothing clears a 25 % guard, speculation stays off; the edits' choice
    # measured, at its lower bound, above every story variant's own measure.
    assert story_policy["variant"] == "none" and not story_policy["speculation"], story_policy
    story_best = max(value for value, _, _ in policies[story_class]["speedups"].values())
    assert story_best < edit_policy["speedup_low"], policies[story_class]["speedups"]
    assert policies[story_class]["trials_done"] >= 2
    # replays measured both ngram-simple variants there on every request
    assert {"ngram-simple.n3.m8", "ngram-simple.n3.m16"} <= set(policies[story_class]["speedups"])
    assert set(variants["story"]) > {"none"}  # it did explore there

    # What it learned, exported and imported into an empty state dir (as on a second
    # machine of the same kind), serves from the first request there, with no exploration.
    export = tmp_path / "policies-export.json"
    _tuner("policies", "export", str(export), "--state-dir", str(state))
    state = tmp_path / "imported"
    imported = _tuner("policies", "import", str(export), "--state-dir", str(state))
    assert imported.startswith(f"{len(policies)} classes imported"), imported
    frozen = tmp_path / "frozen.toml"
    frozen.write_text(
        (tmp_path / "tuning.toml").read_text().replace("explore_share = 1.0", "explore_share = 0.0")
    )
    again = start_daemon(state, env=env | {"TUNER_TUNING_FILE": str(frozen)})
    try:
        # the state dir is its own while it runs: no import under it, no second daemon on it
        for argv in (("policies", "import", str(export)), ("serve", "--port", "0")):
            refused = _tuner(*argv, "--state-dir", str(state), check=False)
            assert f"pid {again.process.pid}" in refused, refused
        response = _send(again.url, edits[0].request(32))
        assert response.headers["x-spec-variant"] == edit_policy["variant"]
        story_path, story = stories[0].request(32)
        story |= {"temperature": 1.0, "seed": 99}  # the class it learned on (sampled stories)
        response = _send(again.url, (story_path, story))
        assert response.headers["x-spec-class"] == story_class
        assert response.headers["x-spec-variant"] == "none"
        # At the CPU gate: an edit that arrives while a long story decodes may open a
        # conversation, which would stay on its first turn's variant: it joins the story's at
        # once, where the story's instance batches it (on one slot it would queue there: it
        # waits for its own)
        role = "joined" if engine_caps().batches else "exploit"
        with ThreadPoolExecutor(1) as pool:
            for _ in range(2):
                story_path, story = stories[1].request(300)
                story |= {"temperature": 1.0, "seed": 7}  # its class runs no speculation
                long = pool.submit(_send, again.url, (story_path, story))
                time.sleep(1.5)  # it decodes
                response = _send(again.url, edits[0].request(32))
                assert long.result().headers["x-spec-variant"] == "none"
                assert response.headers["x-spec-role"] == role, response.headers
                # its class's speculative choice (which new evidence may move among
                # settings), or the story's variant where it joined
                joined_none = response.headers["x-spec-variant"] == "none"
                assert joined_none == (role == "joined"), response.headers
        # The report reads the same state while the daemon runs (which may still be
        # updating it with these two requests).
        running_report = json.loads(_report(state, "--format", "json"))
    finally:
        assert again.stop() == 0
    assert {edit_class, story_class} <= {row["class"] for row in running_report["classes"]}
    # Stopped: the report shows exactly what the policy file holds.
    final = json.loads((state / "policies.json").read_text())["classes"]
    rows = {row["class"]: row for row in json.loads(_report(state, "--format", "json"))["classes"]}
    assert set(rows) == set(final)
    for key, row in rows.items():
        policy = final[key]["policy"]
        assert (row["variant"], row["speculation"], row["speedup"], row["reason"]) == (
            policy["variant"],
            policy["speculation"],
            policy["speedup"],
            policy["reason"],
        ), key
        assert row["requests"] == final[key]["seen"]
    joined = role == "joined"
    assert rows[edit_class]["gate_waited"] >= (0 if joined else 2)
    assert rows[edit_class]["gate_joined"] == (2 if joined else 0)
    assert rows[edit_class]["widest"] == 1 + joined  # a joined edit was batched with the story
    assert rows[edit_class]["in_flight"] > 1.0  # its last two arrived behind a story
    learned_on = tmp_path / "state"  # the trial history stays with the Optuna studies there
    history = json.loads(_report(learned_on, "--class", story_class, "--format", "json"))
    assert len(history["trials"]) >= 2 and all(t["variant"] != "?" for t in history["trials"])
    table = _report(learned_on, "--plot", str(tmp_path / "report.png"))
    assert edit_class in table and "speculation off" in table
    assert (tmp_path / "report.png").stat().st_size > 50_000


def _report(state: Path, *args: str) -> str:
    """``tuner report`` as a user runs it: a separate process."""
    return _tuner("report", "--state-dir", str(state), *args)


def _tuner(*args: str, check: bool = True) -> str:
    """A ``tuner`` command in its own process: its output (with stderr when not ``check``)."""
    done = subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
    )
    return done.stdout if check else done.stdout + done.stderr


ONE_AT_A_TIME = """
[budget]
explore_share = 0.5
trial_requests = 3
min_trial_requests = 2
max_trials = 4
[single]
window = 3
explore_share = 0.5
[prior]
enqueue = 1
[search.ngram-simple]
size_n = [3]
size_m = [16]
"""


def test_one_variant_at_a_time_on_real_llama_server(tmp_path: Path) -> None:
    """``TUNER_MAX_INSTANCES=1``: the router holds one instance, so every change of variant
    reloads Gemma. The daemon explores in windows, measures the reload, and switches all
    traffic to the n-gram variant that pays on echo-heavy edits."""
    state, env = _tuned(tmp_path, ONE_AT_A_TIME, TUNER_MAX_INSTANCES="1")
    running = start_daemon(state, env=env)
    served: list[tuple[str, str]] = []
    try:
        edit = WorkloadItem(id="edit", prompt=CODE_EDIT, temperature=0.0).request(64)
        for _ in range(30):
            response = _send(running.url, edit)
            served.append((response.headers["x-spec-variant"], response.headers["x-spec-role"]))
    finally:
        assert running.stop() == 0

    single = json.loads((state / "policies.json").read_text())["single"]
    assert single["reload_measured"] and single["reload_s"] > 0.05, single
    assert single["active"] == "ngram-simple.n3.m16" and single["switches"] >= 1, single
    assert single["gains"]["ngram-simple.n3.m16"] > 1.1, single
    roles = {role for _, role in served}
    assert {"trial", "exploit"} <= roles, served
    changes = sum(a[0] != b[0] for a, b in itertools.pairwise(served))
    assert changes <= 2 * single["windows"] + single["switches"] + 1, served
    exploits = [variant for variant, role in served if role == "exploit"]
    assert exploits[-1] == "ngram-simple.n3.m16", served  # the active variant serves all
    table = _report(state)
    assert "ngram-simple.n3.m16 serves all traffic" in table


# Every request served by one ngram-simple variant (pinned), two more in the space.
REPLAY_TUNING = """
[search.ngram-simple]
size_n = [3, 12]
size_m = [16]
[overrides.all]
pin = "ngram-simple.n3.m16"
"""


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_replays_give_the_servers_counts_and_measure_the_other_variants(tmp_path: Path) -> None:
    """The daemon tokenizes each answer through llama-server and replays it through every
    ngram-simple variant: for the variant that served it, the replay gives the drafted and
    accepted counts the server reported (chat and completions, whole and streamed); the
    variants that did not serve it get those counts as evidence in the policy file."""
    state, env = _tuned(tmp_path, REPLAY_TUNING)
    items = load_workload(Path(__file__).parents[2] / "tuner" / "data" / "dev.jsonl")
    greedy = [i for i in items if i.temperature == 0][:8]
    running = start_daemon(state, env=env)
    reported = []  # what the server said of each whole answer: (tokens, drafted, accepted)
    try:
        for n, item in enumerate(greedy):
            path, body = item.request(48)
            body["stream"] = n % 2 == 1
            response = _send(running.url, (path, body))
            assert response.headers["x-spec-variant"] == "ngram-simple.n3.m16"
            if not body["stream"]:
                t = response.json()["timings"]
                reported.append([t["predicted_n"], t["draft_n"], t["draft_n_accepted"]])
        for _ in range(150):  # the replays run after the answers, on their own thread
            text = httpx.get(running.url + "/metrics", timeout=10).text
            if _metric(text, "tuner_counterfactual_replays_total") >= len(greedy):
                break
            time.sleep(0.2)
    finally:
        assert running.stop() == 0
    lines = [line for line in text.splitlines() if "counterfactual" in line]
    done = _metric(text, 'tuner_counterfactual_replays_total{outcome="done"}')
    assert done == len(greedy), lines
    checked = _metric(text, "tuner_counterfactual_checked_total")
    agreed = _metric(text, "tuner_counterfactual_agreed_total")
    assert checked == len(greedy) and agreed >= checked - 1, (checked, agreed)
    classes = json.loads((state / "policies.json").read_text())["classes"]
    replayed = sum(
        c["arms"].get("ngram-simple.n12.m16", {}).get("replayed", 0)
        for key, c in classes.items()
        if key.count("/") == 2
    )
    assert replayed == len(greedy)
    served = classes["all"]["arms"]["ngram-simple.n3.m16"]
    assert served["requests"] == len(greedy) and served.get("replayed", 0) == 0
    # each replayed request side by side (the guard's paired comparison): the served
    # variant's counts are the server's, the other's the replay's, of the same tokens
    rows = classes["all"]["pairs"]
    assert len(rows) == len(greedy)
    assert all(set(r) == {"ngram-simple.n3.m16", "ngram-simple.n12.m16"} for r in rows), rows
    assert all(r["ngram-simple.n3.m16"][0] == r["ngram-simple.n12.m16"][0] for r in rows)
    served_rows = [r["ngram-simple.n3.m16"] for r in rows]
    assert all(counts in served_rows for counts in reported), (reported, served_rows)


def test_a_fitted_baseline_runs_without_controls_on_real_llama_server(tmp_path: Path) -> None:
    """On the real server the first two requests run without speculation to anchor the
    fitted step time; after them, at a budget where every request may explore, none is a
    control and, once a trial has served, none runs without speculation; the echo-heavy edit
    settles on a speculative variant measured faster than the fitted baseline, its drafted
    tokens priced in its class."""
    state, env = _tuned(tmp_path, TUNING)
    edit = WorkloadItem(id="edit", prompt=CODE_EDIT, temperature=0.0)
    running = start_daemon(state, env=env)
    served = []
    try:
        for _ in range(16):
            response = _send(running.url, edit.request(64))
            served.append((response.headers["x-spec-role"], response.headers["x-spec-variant"]))
    finally:
        assert running.stop() == 0
    controls = [n for n, (role, _) in enumerate(served) if role == "control"]
    assert controls == [0, 1], served  # the two anchors, nothing after
    # plain after that only as the class's own first requests, before any trial has served
    first = next(n for n, (_, variant) in enumerate(served) if variant != "none")
    assert all(variant != "none" for _, variant in served[first:]), served
    policies = json.loads((state / "policies.json").read_text())["classes"]
    key = next(k for k in policies if k.startswith("code/echo/"))
    policy = policies[key]["policy"]
    assert policy["speculation"] and policy["speedup_low"] > 1.0, policy
    assert policies[key]["trials_done"] >= 1


OPENING_TUNING = """
[budget]
explore_share = 0.01
trial_requests = 6
min_trial_requests = 3
[search.ngram-simple]
size_n = [3]
size_m = [8, 16]
"""


def _opening_roles(state: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    """Role and variant of a fresh daemon's echo-heavy edits until the two anchors have run
    (at most four), then of one more, sent once their replays have arrived."""
    edit = WorkloadItem(id="edit", prompt=CODE_EDIT, temperature=0.0)
    running = start_daemon(state, env=env)
    try:
        served: list[httpx.Headers] = []
        while sum(h["x-spec-role"] == "control" for h in served) < 2 and len(served) < 4:
            served.append(_send(running.url, edit.request(64)).headers)
        for _ in range(150):  # the replays run after the answers, on their own thread
            text = httpx.get(running.url + "/metrics", timeout=10).text
            done = _metric(text, 'tuner_counterfactual_replays_total{outcome="done"}')
            if done >= len(served):
                break
            time.sleep(0.2)
        served.append(_send(running.url, edit.request(64)).headers)
    finally:
        assert running.stop() == 0
    return [(h["x-spec-role"], h["x-spec-variant"]) for h in served]


def test_an_opening_speculates_before_the_guard_clears_on_real_llama_server(
    tmp_path: Path,
) -> None:
    """On the real server a fresh daemon's first request is a plain anchor; until the second
    anchor runs (when the budget allows), requests sent before anything is measured run the
    prior's best variant, never plain for lack of evidence; once the replays have arrived,
    the echo-heavy edit is served an opening variant: an exploit request on a policy that
    is not settled yet (two replayed requests are too few for the guard, which alone would
    run it plain)."""
    state, env = _tuned(tmp_path, OPENING_TUNING)
    roles = _opening_roles(state, env)
    assert roles[0] == ("control", "none"), roles
    assert [r for r in roles[:-1] if r[0] == "control"] == [("control", "none")] * 2, roles
    assert all(role == ("control" if v == "none" else "exploit") for role, v in roles), roles
    role, variant = roles[-1]
    assert role == "exploit", roles
    assert variant.startswith("ngram-simple"), roles
