"""``tuner bench`` and ``tuner synth-moe`` against the real llama-server."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.bench.test_render import assert_documented
from tests.integration.conftest import TEST_ENGINE, require, shipped_tuning
from tuner.bench.rows import PEER_PREFIX
from tuner.model.gguf_facts import read_facts

pytestmark = pytest.mark.llama

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "benchmarks" / "workloads" / "dev.jsonl"


def bench_env(state: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """A bench's environment: the suite's engine; ``env`` may unpin it (``TUNER_ENGINE=auto``)."""
    return {
        "PATH": "/usr/bin:/bin",
        "TUNER_STATE_DIR": str(state),
        "HOME": str(Path.home()),
        "TUNER_ENGINE": TEST_ENGINE,
        **(env or {}),
    }


def tuner(
    *args: str, state: Path, timeout: int = 900, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=bench_env(state, env),
    )


def test_bench_replays_the_matrix_and_the_tuner_and_writes_its_summary(tmp_path: Path) -> None:
    """As a user runs it, no engine pinned: where both engines are built the matrix runs on
    the one measured faster, with that engine's own autotune arms where it has them, and the
    default daemon serves there from the bench's measurement."""
    out = tmp_path / "bench"
    result = tuner(
        "bench",
        "--workload",
        str(WORKLOAD),
        "--prompts",
        "4",
        "--requests",
        "8",
        "--max-tokens",
        "16",
        "--matrix",
        "ngram-simple,ngram-mod",
        "--out",
        str(out),
        state=tmp_path / "state",
        env={"TUNER_ENGINE": "auto"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    arms = {r["arm"] for r in rows if r["arm"] != "tuner"}
    statics = {"none", "ngram-mod", "ngram-simple"}
    # beside the matrix only the engine's own autotune arms over its plain server
    assert statics <= arms and all(a.startswith(PEER_PREFIX) for a in arms - statics)
    total = 8 + 4 * len(arms)
    assert f"[bench] [{total}/{total}]" in result.stderr  # progress while running
    assert len(rows) == total and not [r for r in rows if r.get("error")]
    run = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    chosen = summary["overall"].get("tuner_engine")
    if chosen is not None:  # two engines built: the daemon started from the bench's measurement
        assert chosen["engine"] == run["engine"] and chosen["why"]
        assert set(chosen["tok_s"]) == {"llama.cpp", "ik_llama.cpp"}
        log = (out / "tuner-daemon.log").read_text()
        assert "engine_chosen" in log and "engines_measuring" not in log
    tuner_rows = [r for r in rows if r["arm"] == "tuner"]
    # the daemon classified each prompt as the bench did, and said what it served and why
    assert all(r["daemon_class"] == r["class"] for r in tuner_rows)
    assert all(r["role"] in ("exploit", "trial", "control") and r["variant"] for r in tuner_rows)
    assert all(r["tokens"] > 0 and r["ms"] > 0 for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "spec-tuner/bench/1"
    assert summary["static_arms"] == ["none", "ngram-mod", "ngram-simple"]
    assert summary["overall"]["tuner_requests"] == 8
    assert set(summary["classes"]) == {r["class"] for r in rows}
    assert all("converged_after" in c for c in summary["classes"].values())
    assert set(summary["targets"]) >= {"tuner_vs_best_static_whole_run", "requests_to_converge"}
    # 8 tuner requests over 4 prompts, every static arm once: how often each met each prompt
    assert summary["overall"]["requests_per_prompt"] == {"tuner": 2.0, "static_arm": 1.0}
    worst = summary["targets"].get("worst_class_after_convergence")
    assert worst is None or worst["class"] in summary["classes"]
    # same work: the tuner's requests whose variant and counts a static arm's request of the
    # same prompt repeated, counted here from the real rows
    done = {
        (r["item"], r["variant"], r["tokens"], r["drafted"], r["accepted"])
        for r in rows
        if r["arm"] != "tuner"
    }
    pairs = sum(
        (r["item"], r["variant"], r["tokens"], r["drafted"], r["accepted"]) in done
        for r in tuner_rows
    )
    same = summary["overall"]["tuner_same_work"]
    assert (same or {}).get("pairs", 0) == pairs
    assert same is None or same["time_ratio"] > 0
    # each prompt's static arms ran back to back, right beside a tuner request of that prompt
    for item in {r["item"] for r in rows}:
        at = [i for i, r in enumerate(rows) if r["arm"] != "tuner" and r["item"] == item]
        assert at == list(range(at[0], at[0] + len(arms))), at
        near = [rows[i] for i in (at[0] - 1, at[-1] + 1) if 0 <= i < len(rows)]
        assert any(r["arm"] == "tuner" and r["item"] == item for r in near), (item, at)
    assert (out / "summary.png").read_bytes()[:4] == b"\x89PNG"
    assert "| ngram-simple |" in (out / "summary.md").read_text()
    assert (out / "tuner-state" / "policies.json").is_file()  # the daemon's own fresh state
    # the machine's CPU counters, sampled at the start, every 10 requests and at the end:
    # the bench's own llama-servers and daemon did the decoding
    load = summary["machine"]
    assert (
        load["samples"] == 1 + math.ceil(total / 10)
        and load["own_cpu_s"] > 0
        and 0 <= load["other_share"] <= 1
    )
    assert len(load["other_share_by_quarter"]) == 4
    assert "- other processes: " in (out / "summary.md").read_text()
    assert_documented(summary)


def _sessions(path: Path) -> Path:
    """Two short conversations of three turns: a code edit, and a chat."""
    code = (ROOT / "tuner" / "atomic.py").read_text()[:1500]
    sessions = [
        {
            "id": "agent",
            "system": "You are a coding agent. Answer with code only.",
            "turns": [
                {"user": f"Here is a file:\n{code}\nRename path to target.", "assistant": code},
                {"user": "Now add a docstring to the first function.", "assistant": code[:600]},
                {"user": "Print the first function again.", "assistant": "Done."},
            ],
        },
        {
            "id": "chat",
            "system": "You are a helpful assistant.",
            "turns": [
                {"user": "Tell me about lighthouses.", "assistant": "They guide ships. " * 20},
                {"user": "And their keepers?", "assistant": "Keepers tended the lamps. " * 10},
                {"user": "Summarise both answers.", "assistant": "Lighthouses guide ships."},
            ],
        },
    ]
    path.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return path


def test_bench_replays_conversations_through_every_arm_and_the_tuner(tmp_path: Path) -> None:
    """``tuner bench --sessions``: each session's turns in order, the same history through
    each static arm and the daemon, from one client and from two at once; later turns find
    their history in the cache on every arm."""
    out = tmp_path / "bench"
    result = tuner(
        "bench",
        "--sessions",
        str(_sessions(tmp_path / "sessions.jsonl")),
        "--clients",
        "1,2",
        "--max-tokens",
        "16",
        "--matrix",
        "ngram-simple.n3.m16",
        "--out",
        str(out),
        state=tmp_path / "state",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    # 2 sessions x 3 turns x 3 arms, at 1 and at 2 clients
    assert len(turns) == 36 and not [t for t in turns if t.get("error")]
    assert {t["arm"] for t in turns} == {"none", "ngram-simple.n3.m16", "tuner"}
    assert all(t["predicted_n"] > 0 and t["prompt_n"] > 0 for t in turns)
    # on a static arm each later turn found the earlier turns' prompt in its cache (all but
    # the last few tokens, which the chat template renders anew)
    static = [t for t in turns if t["clients"] == 1 and t["arm"] != "tuner"]
    before = {(t["arm"], t["session"], t["turn"]): t for t in static}
    for t in static:
        if t["turn"] > 0:
            prev = before[(t["arm"], t["session"], t["turn"] - 1)]
            assert t["cache_n"] >= prev["cache_n"] + prev["prompt_n"] - 16, (prev, t)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sessions"] == 2 and summary["max_tokens"] == 16
    one, two = summary["clients_1"]["all"], summary["clients_2"]["all"]
    assert one["arms"]["none"]["reprocessed_share"] < 0.5
    assert "tuner_reprocessed_above_plain_pp" in one and "tuner_vs_best_static_time" in one
    assert two["arms"]["tuner"]["throughput_tok_s"] > 0 and two["tuner_ttft_p95_vs_best_static"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_bench_stopped_midway_leaves_nothing_running(tmp_path: Path, sig: int) -> None:
    """``timeout``, ``kill`` or a crash: a bench stopped while it runs takes its matrix
    llama-server and its daemon (in a session of its own) with it, and the daemon its
    llama-servers. SIGTERM stops the bench as Ctrl-C does (exit 143, the rows kept);
    SIGKILL leaves the daemon a SIGTERM from Linux (it used to run on, orphaned)."""
    out = tmp_path / "bench"
    with (tmp_path / "bench.log").open("wb") as log:
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tuner",
                "bench",
                "--workload",
                str(WORKLOAD),
                "--prompts",
                "2",
                "--requests",
                "100",
                "--max-tokens",
                "32",
                "--matrix",
                "ngram-simple",
                "--out",
                str(out),
            ],
            stdout=log,
            stderr=log,
            env=bench_env(tmp_path / "state"),
        )
    try:
        deadline = time.monotonic() + 300
        rows = out / "requests.jsonl"
        while not (rows.is_file() and len(rows.read_text().splitlines()) >= 8):
            assert bench.poll() is None, (tmp_path / "bench.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the bench served no tuner requests in time"
            time.sleep(0.5)
        started = psutil.Process(bench.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in started)
        assert "tuner serve" in names and names.count("llama-server") >= 2, names
        bench.send_signal(sig)
        code = bench.wait(120)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert code == (143 if sig == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 90
    while not all(_gone(p.pid) for p in started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert [p.pid for p in started if not _gone(p.pid)] == [], names
    if sig == signal.SIGTERM:
        assert "[bench] stopped" in (tmp_path / "bench.log").read_text()


def test_a_challenger_runs_side_by_side_with_its_own_tuning_file(tmp_path: Path) -> None:
    """A second daemon with its own tuning file (no exploring at all) and its own code (a copy
    of the package that marks its state dir) gets the tuner's prompts pair by pair; the
    bench's tuning file (every request explores) and its seed reach the tuner only."""
    tuning = tmp_path / "frozen.toml"
    tuning.write_text("[budget]\nexplore_share = 0.0\n[single]\nexplore_share = 0.0\n")
    code = tmp_path / "code"
    shutil.copytree(ROOT / "tuner", code / "tuner", ignore=shutil.ignore_patterns("__pycache__"))
    with (code / "tuner" / "__init__.py").open("a") as init:
        init.write(
            "\nimport os as _os, pathlib as _p\n"
            "if _os.environ.get('TUNER_STATE_DIR'):\n"
            "    (_p.Path(_os.environ['TUNER_STATE_DIR']) / 'code').write_text(__file__)\n"
        )
    out = tmp_path / "bench"
    result = tuner(
        "bench",
        "--workload",
        str(WORKLOAD),
        "--prompts",
        "2",
        "--requests",
        "8",
        "--max-tokens",
        "16",
        "--matrix",
        "ngram-mod",
        "--challenger",
        str(tuning),
        "--challenger-env",
        "TUNER_MAX_INSTANCES=1",
        "--challenger-code",
        str(code),
        "--out",
        str(out),
        state=tmp_path / "state",
        env=shipped_tuning(tmp_path, 1.0),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "seed = 0" in (out / "tuner-state" / "tuning.toml").read_text()
    assert (out / "challenger-state" / "code").read_text() == str(code / "tuner" / "__init__.py")
    assert not (out / "tuner-state" / "code").exists()
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r["wall_ms"] >= r["ms"] > 0 for r in rows)  # the client waited for the decode
    # the challenger's own daemon setting reached it, and only it
    plans = {}
    for arm in ("tuner", "challenger"):
        lines = (out / f"{arm}-daemon.log").read_text().splitlines()
        plans[arm] = next(json.loads(x) for x in lines if '"tuning_plan"' in x)
    assert plans["challenger"]["loaded_at_once"] == 1 < plans["tuner"]["loaded_at_once"]
    ours = [r for r in rows if r["arm"] == "tuner"]
    theirs = [r for r in rows if r["arm"] == "challenger"]
    assert len(ours) == len(theirs) == 8 and not [r for r in rows if r.get("error")]
    assert [(r["item"], r["repeat"]) for r in ours] == [(r["item"], r["repeat"]) for r in theirs]
    assert {(r["role"], r["variant"]) for r in theirs} == {("exploit", "none")}  # never explores
    assert any(r["role"] in ("trial", "control") for r in ours)  # the tuner's share was 1.0
    summary = json.loads((out / "summary.json").read_text())
    overall = summary["overall"]
    assert summary["challenger_tuning"] == str(tuning)
    assert summary["challenger_env"] == {"TUNER_MAX_INSTANCES": "1"}
    assert summary["challenger_code"] == str(code)
    assert overall["side_by_side_pairs"] == 8 and overall["challenger_vs_tuner"] > 0
    # the same pairs priced by their counts, on the real server's timings
    assert overall["challenger_vs_tuner_by_counts"] > 0
    assert all(r.get("daemon_class") == r["class"] for r in ours)  # classes as the bench's
    assert "challenger" not in summary["static_arms"]
    assert (out / "challenger-state" / "policies.json").is_file()
    assert "Side by side" in (out / "summary.md").read_text()
    assert_documented(summary)


def test_a_peer_builds_arms_run_beside_the_matrix_each_over_its_own_baseline(
    tmp_path: Path,
) -> None:
    """``--peer``: another build's llama-server (here this build's own binary, which any
    machine has) as arms of the run, each read against that binary's own no-speculation run."""
    from tuner.settings import load_settings
    from tuner.upstream.launch import prepare

    binary = prepare(load_settings(state_dir=tmp_path)).binary
    out = tmp_path / "bench"
    result = tuner(
        "bench",
        "--workload",
        str(WORKLOAD),
        "--prompts",
        "3",
        "--requests",
        "3",
        "--max-tokens",
        "24",
        "--matrix",
        "ngram-simple",
        "--peer",
        str(binary),
        "--peer-arm",
        "simple=--spec-type ngram-simple",
        "--out",
        str(out),
        state=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r.get("error")]
    arms = [r["arm"] for r in rows]
    assert arms.count("peer:none") == arms.count("peer:simple") == arms.count("none") == 3
    # each prompt's four arms back to back, the peer's among this build's
    for item in range(3):
        at = [i for i, r in enumerate(rows) if r["arm"] != "tuner" and r["item"] == item]
        assert at == list(range(at[0], at[0] + 4)), at
    assert sum(r["drafted"] for r in rows if r["arm"] == "peer:simple") > 0  # its flags reached it
    assert sum(r["drafted"] for r in rows if r["arm"] == "peer:none") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["static_arms"] == ["none", "ngram-simple"]
    assert summary["peer"] == str(binary.resolve())
    assert summary["peer_arms"] == {"peer:simple": "--spec-type ngram-simple"}
    peers = summary["overall"]["peers"]
    assert peers["baseline_tok_s"] > 0 and peers["arms"]["peer:simple"]["ratio"] > 0
    assert "## Peer:" in (out / "summary.md").read_text()
    log = (out / "peer-simple.log").read_text()
    one_slot = ("n_slots = 1", "n_parallel = 1", "slots = 1", "n_slots=1")  # ik: n_slots=1
    assert any(said in log for said in one_slot), log[-2000:]
    assert_documented(summary)


def test_bench_refuses_a_challenger_tuning_file_it_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[budget]\nexplore_share = 7\n")
    for path in (bad, tmp_path / "missing.toml"):
        result = tuner(
            "bench",
            "--workload",
            str(WORKLOAD),
            "--challenger",
            str(path),
            "--out",
            str(tmp_path / "out"),
            state=tmp_path,
        )
        assert result.returncode == 2 and "tuning file" in result.stderr, result.stderr
        assert not (tmp_path / "out").exists()  # refused before anything ran


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--challenger-env", "MAX=1", "--challenger", str(WORKLOAD)], "TUNER_"),
        (["--challenger-env", "TUNER_MAX_INSTANCES=1"], "TUNER_"),
        (["--challenger-code", "."], "--challenger"),
        (["--challenger-code", "/no/such/dir", "--challenger", str(WORKLOAD)], "no tuner"),
        (["--peer", "/no/such/llama-server"], "--peer"),
        (["--peer-arm", "a=--x"], "--peer"),
        (["--peer", str(WORKLOAD), "--peer-arm", "no-flags"], "--peer-arm"),
    ],
)
def test_bench_refuses_a_setting_it_cannot_use(tmp_path: Path, extra: list[str], said: str) -> None:
    result = tuner(
        "bench",
        "--workload",
        str(WORKLOAD),
        *extra,
        "--out",
        str(tmp_path / "out"),
        state=tmp_path,
    )
    assert result.returncode == 2 and said in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_bench_refuses_a_matrix_name_it_cannot_parse(tmp_path: Path) -> None:
    result = tuner(
        "bench",
        "--workload",
        str(WORKLOAD),
        "--matrix",
        "ngram-simple.x3",
        "--out",
        str(tmp_path),
        state=tmp_path,
    )
    assert result.returncode == 2 and "not a variant name" in result.stderr


def test_synth_moe_writes_a_model_llama_server_runs(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    result = tuner(
        "synth-moe",
        str(path),
        "--experts",
        "16",
        "--active",
        "2",
        "--layers",
        "2",
        "--hidden",
        "128",
        "--expert-ffn",
        "128",
        state=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    facts = read_facts(path)
    assert facts.is_moe and facts.expert_count == 16 and facts.expert_used == 2
    dense = tmp_path / "dense.gguf"
    assert (
        tuner(
            "synth-moe",
            str(dense),
            "--dense",
            "--experts",
            "16",
            "--active",
            "2",
            "--layers",
            "2",
            "--hidden",
            "128",
            "--expert-ffn",
            "128",
            state=tmp_path,
        ).returncode
        == 0
    )
    assert not read_facts(dense).is_moe
    import asyncio

    from tuner.settings import load_settings
    from tuner.upstream.launch import prepare

    settings = load_settings(state_dir=tmp_path)
    prepared = prepare(settings)

    async def complete(model: Path) -> dict[str, object]:
        from tuner.calibrate import temporary_server

        caps = prepared.capabilities
        async with temporary_server(prepared.binary, settings, caps, model, [], "synth") as c:
            response = await c.open(
                "POST", "/completion", content=b'{"prompt": "Hello", "n_predict": 8}'
            )
            data: dict[str, object] = json.loads(await response.aread())
            await response.aclose()
            return data

    for model in (path, dense):
        answer = asyncio.run(complete(model))
        assert answer["tokens_predicted"] == 8, answer


def test_synth_moe_writes_a_hybrid_whose_mtp_head_llama_server_drafts_with(
    tmp_path: Path,
) -> None:
    """``--arch qwen35moe --mtp-layers 1``: recurrent, attention and expert layers plus an MTP
    block, on the Qwen3.5 vocabulary; the real llama-server loads it and drafts with its MTP
    head (``--spec-type draft-mtp``); its attention-only twin has no recurrent layer."""
    import asyncio

    require("draft-mtp")

    from tuner.calibrate import temporary_server
    from tuner.settings import load_settings
    from tuner.upstream.launch import prepare

    size = [
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
    ]
    hybrid, twin = tmp_path / "hybrid.gguf", tmp_path / "twin.gguf"
    for path, extra in ((hybrid, ["--mtp-layers", "1"]), (twin, ["--attention-only"])):
        made = tuner("synth-moe", str(path), "--arch", "qwen35moe", *size, *extra, state=tmp_path)
        assert made.returncode == 0, made.stderr[-2000:]
    inspected = tuner("inspect", "--model", str(hybrid), "--format", "json", state=tmp_path)
    target = json.loads(inspected.stdout)["target"]
    assert (target["recurrent_layers"], target["mtp_layers"], target["experts"]) == (3, 1, 16)
    assert target["tokenizer"] == "gpt2" and target["vocab_size"] > 100_000  # Qwen's
    twin_facts = read_facts(twin)  # the same trunk and routed experts, every layer attending
    assert (twin_facts.recurrent_layers, twin_facts.n_layers, twin_facts.expert_count) == (0, 4, 16)
    settings = load_settings(state_dir=tmp_path)
    prepared = prepare(settings)
    mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", "2"]

    async def complete(model: Path, flags: list[str]) -> dict[str, object]:
        caps = prepared.capabilities  # (a qwen3moe like the twin is served in the test above)
        async with temporary_server(prepared.binary, settings, caps, model, flags, "mtp") as c:
            response = await c.open(
                "POST", "/completion", content=b'{"prompt": "Hello", "n_predict": 12}'
            )
            data: dict[str, object] = json.loads(await response.aread())
            await response.aclose()
            return data

    answer = asyncio.run(complete(hybrid, mtp))
    timings = answer["timings"]
    assert answer["tokens_predicted"] == 12, answer
    assert isinstance(timings, dict) and timings["draft_n"] > 0, timings  # the MTP head drafted
