"""When one instance fails while the router lives: llama-server's router (mainline) and the
daemon's own pool (ik_llama.cpp, which has no router) on the real engines."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from tests.integration.conftest import RunningDaemon, report_json, start_daemon

pytestmark = pytest.mark.llama  # its engine faults are run on each engine by parameter

PINNED = "ngram-simple.n3.m16"
# one speculative variant besides none, every class pinned to it
TUNING = f"""
[search.ngram-simple]
size_n = [3]
size_m = [16]
[overrides.all]
pin = "{PINNED}"
"""
PROMPT = "Write a long story about a lighthouse keeper and the sea, in many chapters.\n\n"


ENGINES = pytest.mark.parametrize("engine", ["llama.cpp", "ik_llama.cpp"])
# a value each engine's parser rejects when an instance starts (not at the daemon's start)
BAD_VALUE = {
    "llama.cpp": "--spec-draft-p-min notanumber",
    "ik_llama.cpp": "--draft-p-min notanumber",
}


def _pinned(tmp_path: Path, engine: str = "llama.cpp", **env: str) -> RunningDaemon:
    """A daemon on ``engine`` whose every class is pinned to ``PINNED``, with these settings."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text(TUNING)
    state = tmp_path / "state"
    state.mkdir()
    full = {
        "TUNER_TUNING_FILE": str(tuning),
        "TUNER_THREADS": "2",
        "TUNER_ENGINE": engine,
        **env,
    }
    return start_daemon(state, env=full)


def _instance(running: RunningDaemon, variant: str) -> psutil.Process:
    """The instance serving ``variant`` (its argv names the variant's spec type), the
    router's or the pool's."""
    spec_type = variant.split(".")[0]
    for child in psutil.Process(running.process.pid).children(recursive=True):
        argv = " ".join(child.cmdline())
        if "llama-server" in child.name() and "--models-preset" not in argv and spec_type in argv:
            return child
    raise AssertionError("no instance of the pinned variant")


def _records(running: RunningDaemon) -> list[dict[str, object]]:
    files = sorted((running.state_dir / "records").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def _when_busy(process: psutil.Process, fault: Callable[[], None]) -> threading.Thread:
    """Run ``fault`` as soon as the instance works on a request (its ``/slots``), so the
    fault lands mid-request however fast the machine is (a fixed delay did not on CI)."""
    argv = process.cmdline()
    port = argv[argv.index("--port") + 1]

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                slots = httpx.get(f"http://127.0.0.1:{port}/slots", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                slots = []
            if not isinstance(slots, list):  # still loading: an error object
                slots = []
            # mainline says is_processing, ik_llama.cpp state 1
            if any(
                isinstance(slot, dict) and (slot.get("is_processing") or slot.get("state") == 1)
                for slot in slots
            ):
                fault()
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@ENGINES
def test_an_instance_killed_mid_stream_or_mid_request_is_an_error_the_sdk_sees(
    tmp_path: Path, engine: str
) -> None:
    """kill -9 of the instance that is answering: a streamed answer ends with an
    ``upstream_disconnected`` event that the ``openai`` SDK raises; a whole answer, nothing
    of which went back yet, is sent again without speculation and answered; both failures
    are recorded. Two failures in a row quarantine the variant at once (the second counted
    as the request falls back), so the next request goes without speculation and is
    answered in full."""
    running = _pinned(tmp_path, engine)
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    warm = client.completions.create(model="x", prompt=PROMPT, max_tokens=8)
    assert warm.choices[0].text is not None  # the pinned instance is loaded
    instance = _instance(running, PINNED)
    killed: list[bool] = []
    text = ""
    with pytest.raises(openai.APIError, match="middle of the answer"):
        for chunk in client.completions.create(
            model="x", prompt=PROMPT, max_tokens=400, stream=True
        ):
            text += chunk.choices[0].text if chunk.choices else ""
            if text and not killed:
                instance.kill()  # cut while it streams, however fast the machine is
                killed.append(True)
    assert text
    # the next request starts the instance again and it is killed as it works on it: two
    # failures in a row (a success between them would clear the first)
    watcher = _kill_when_back_and_busy(running, instance.pid)
    raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=400)
    watcher.join(10)
    assert raw.headers["x-spec-variant"] == "none" and raw.headers["x-spec-role"] == "fallback"
    assert raw.parse().choices[0].text  # answered in full on the second try
    after = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=16)
    assert after.headers["x-spec-role"] == "fallback"  # quarantined: no third try of it
    assert after.parse().usage.completion_tokens == 16  # type: ignore[union-attr]
    time.sleep(1.0)  # records are written off the request path
    records = _records(running)
    failed = [r for r in records if r.get("error")]
    assert [r["status"] for r in failed] == [502, 502], failed
    assert "middle of the answer" in str(failed[0]["error"])
    assert [r["role"] for r in records if r["role"] == "fallback"] == ["fallback"] * 2
    metrics = httpx.get(running.url + "/metrics", timeout=5).text
    assert 'tuner_variant_quarantined{reason="' in metrics and PINNED in metrics
    assert records[-1]["status"] == 200 and not records[-1].get("error")
    assert httpx.get(running.url + "/ready", timeout=5).status_code == 200
    client.close()


def _kill_when_back_and_busy(running: RunningDaemon, old: int) -> threading.Thread:
    """Kill the pinned instance once it is started again (another process than ``old``)
    and works on a request."""

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                back = _instance(running, PINNED)
            except (AssertionError, psutil.Error):
                back = None
            if back is not None and back.pid != old:
                _when_busy(back, back.kill).join()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@ENGINES
def test_a_stopped_instance_is_cut_off_reloaded_and_the_next_request_answered(
    tmp_path: Path, engine: str
) -> None:
    """SIGSTOP of the instance that is streaming: the stream ends with ``upstream_stalled``
    after the stall bound (the openai SDK raises it), ``/ready`` and ``/metrics`` show the
    stall, the next request is answered at once without speculation while the router kills
    the stopped instance and reloads it."""
    running = _pinned(tmp_path, engine, TUNER_STALL_TIMEOUT_S="3")
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    client.completions.create(model="x", prompt=PROMPT, max_tokens=8)
    instance = _instance(running, PINNED)
    stopped: list[bool] = []
    started = time.monotonic()
    try:
        with pytest.raises(openai.APIError, match="sent nothing for 3 s"):
            for chunk in client.completions.create(
                model="x", prompt=PROMPT, max_tokens=400, stream=True
            ):
                if chunk.choices and chunk.choices[0].text and not stopped:
                    instance.suspend()  # stopped while it streams, however fast it is
                    stopped.append(True)
        assert time.monotonic() - started < 30
        ready = httpx.get(running.url + "/ready", timeout=5).json()
        metrics = httpx.get(running.url + "/metrics", timeout=5).text
        assert "tuner_upstream_stalls_total 1.0" in metrics
        assert ready.get("recovering") == [PINNED] or "tuner_upstream_recovering 0.0" in metrics
        again = time.monotonic()
        raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=16)
        assert raw.parse().usage.completion_tokens == 16  # type: ignore[union-attr]
        # while the router reloads that instance, requests go elsewhere: no wait behind it
        assert raw.headers["x-spec-variant"] == "none" and raw.headers["x-spec-role"] == "fallback"
        assert time.monotonic() - again < 10
        for _ in range(60):  # the router kills the stopped instance after its stop timeout
            if not instance.is_running() or instance.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the stopped instance was not killed")
    finally:
        client.close()
        if instance.is_running():
            instance.kill()
    failed = [r for r in _records(running) if r.get("error")]
    assert [r["status"] for r in failed] == [504]


@ENGINES
def test_a_preset_that_cannot_load_is_quarantined_and_every_request_answered(
    tmp_path: Path, engine: str
) -> None:
    """Every speculative preset gets a flag value this build rejects when the instance
    starts (``--spec-draft-p-min notanumber``): each request is still answered, without
    speculation, and after two failures the variant is quarantined (``/metrics``,
    ``tuner report``) so later requests do not try it at all."""
    running = _pinned(tmp_path, engine, TUNER_SPEC_ARGS=BAD_VALUE[engine])
    state = running.state_dir
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    timings = []
    for _ in range(4):
        started = time.monotonic()
        raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=8)
        timings.append(time.monotonic() - started)
        assert raw.parse().usage.completion_tokens == 8  # type: ignore[union-attr]
        assert raw.headers["x-spec-variant"] == "none"
    for _ in range(50):  # records are written off the request path
        roles = [r["role"] for r in _records(running)]
        if len(roles) >= 6:
            break
        time.sleep(0.1)
    # two tries of the pinned variant, each answered on the second try; then it is held
    assert roles == ["pinned", "fallback", "pinned", "fallback", "fallback", "fallback"], roles
    metrics = httpx.get(running.url + "/metrics", timeout=5).text
    assert 'tuner_variant_quarantined{reason="' in metrics and PINNED in metrics
    assert running.stop() == 0
    assert "failed to load" in report_json(state)["quarantine"][PINNED]["reason"]


def test_a_flag_the_build_does_not_know_stops_the_daemon_with_a_clear_error(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "TUNER_SPEC_ARGS": "--bogus-flag 3", "TUNER_STATE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "tuner", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 2
    assert "TUNER_SPEC_ARGS" in result.stderr and "--bogus-flag" in result.stderr


def test_a_draft_of_another_vocabulary_stops_the_daemon_before_anything_runs(
    tmp_path: Path,
) -> None:
    """This build throws when it loads a draft whose vocabulary differs from the target's,
    so every draft preset would fail: the daemon refuses at start and says why."""
    from tests.model.synthetic_gguf import write_gguf

    draft = write_gguf(tmp_path / "other-vocab.gguf", "llama")  # 300 tokens, Gemma has 262,144
    env = {**os.environ, "TUNER_DRAFT_MODEL": str(draft), "TUNER_STATE_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "tuner", "serve", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert (
        "TUNER_DRAFT_MODEL" in result.stderr and "vocabulary sizes 300 and 262144" in result.stderr
    )
    assert "model family" in result.stderr  # the fix


@ENGINES
def test_requests_on_a_stopped_instance_are_answered_again_without_speculation(
    tmp_path: Path, engine: str
) -> None:
    """SIGSTOP of the instance working on a whole answer, with a second request waiting on
    it: neither has had a byte back, so once the instance fails its probe (seconds, not the
    90 s stall bound) both are sent again without speculation and answered; the stopped
    instance is killed, and the failures are recorded as stalls of the pinned variant."""
    running = _pinned(tmp_path, engine)
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    client.completions.create(model="x", prompt=PROMPT, max_tokens=8)
    instance = _instance(running, PINNED)
    _when_busy(instance, instance.suspend)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:
            asked = [
                pool.submit(
                    client.completions.with_raw_response.create,
                    model="x",
                    prompt=PROMPT,
                    max_tokens=64,
                )
                for _ in range(2)
            ]
            answers = [future.result() for future in asked]
        assert time.monotonic() - started < 45
        for raw in answers:
            assert raw.headers["x-spec-variant"] == "none", raw.headers
            assert raw.headers["x-spec-role"] == "fallback"
            assert raw.parse().usage.completion_tokens > 0  # type: ignore[union-attr]
        for _ in range(60):  # unloaded: the router or the pool kills the stopped instance
            if not instance.is_running() or instance.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the stopped instance was not killed")
    finally:
        client.close()
        if instance.is_running():
            instance.kill()
    for _ in range(50):  # records are written off the request path
        failed = [r for r in _records(running) if r.get("error")]
        if len(failed) >= 2:
            break
        time.sleep(0.1)
    assert [(r["variant"], r["status"]) for r in failed] == [(PINNED, 504)] * 2
    assert all("stopped answering" in str(r["error"]) for r in failed), failed


def test_the_router_answers_a_probe_at_once_while_four_long_prompts_stream(
    tmp_path: Path,
) -> None:
    """Four long prompts streaming at once through mainline's router, and the instance
    probed every half second on the same connections (as the daemon's client does): each
    probe is answered at once. With the router's default pool of HTTP threads a probe waited
    out its 10 s in 6 of 20 such bursts, and the daemon then killed a healthy instance; with
    16 threads, in none of 18. The router's instances get 16 threads too."""
    running = _pinned(tmp_path)
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=300)
    client.completions.create(model="x", prompt=PROMPT, max_tokens=8)
    client.close()
    instance = _instance(running, PINNED)
    assert instance.cmdline()[instance.cmdline().index("--threads-http") + 1] == "16"
    router = running.llama_server().cmdline()
    package = Path(__file__).parents[2] / "tuner"
    sources = sorted(package.rglob("*.py"), key=lambda f: -f.stat().st_size)[:4]
    prompts = [source.read_text()[:8000] + "\n\nSummary:" for source in sources]
    waits = asyncio.run(_probed_while_streaming(router[router.index("--port") + 1], prompts))
    assert waits and max(waits) < 5.0, max(waits)  # the daemon's probe allows 5 s
    assert "upstream_stuck" not in running.log.read_text()


async def _probed_while_streaming(port: str, prompts: list[str]) -> list[float]:
    """How long each probe of the pinned preset took while ``prompts`` streamed."""
    waits: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:

        async def stream(prompt: str) -> None:
            body = {"model": PINNED, "prompt": prompt, "max_tokens": 8, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as answer:
                assert answer.status_code == 200
                async for _ in answer.aiter_raw():
                    pass

        async def probe(streams: asyncio.Future[list[None]]) -> None:
            params = {"model": PINNED, "autoload": "false"}
            while not streams.done():
                started = time.monotonic()
                with contextlib.suppress(httpx.HTTPError):
                    await http.get("/props", params=params, timeout=10)
                waits.append(time.monotonic() - started)
                await asyncio.sleep(0.5)

        streams = asyncio.gather(*(stream(p) for p in prompts))
        await asyncio.gather(streams, probe(streams))
    return waits


def test_a_draft_file_gone_after_start_is_quarantined_and_requests_answered(
    tmp_path: Path,
) -> None:
    """Gemma as its own draft, from a file that disappears once the daemon runs: the
    draft preset cannot load, its requests are answered without speculation, and after two
    failures the variant is quarantined."""
    from tuner.upstream.launch import default_model_path

    draft = tmp_path / "draft.gguf"
    try:  # a file of its own (a symbolic link would be resolved at start)
        os.link(default_model_path(), draft)
    except OSError:
        shutil.copyfile(default_model_path(), draft)
    pinned = "draft-simple.max3.p0"
    tuning = tmp_path / "tuning.toml"
    tuning.write_text(
        f'[search.draft-simple]\nn_max = [3]\np_min = [0.0]\n[overrides.all]\npin = "{pinned}"\n'
    )
    state = tmp_path / "state"
    state.mkdir()
    env = {"TUNER_TUNING_FILE": str(tuning), "TUNER_DRAFT_MODEL": str(draft)}
    running = start_daemon(state, env=env)
    draft.unlink()
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    variants = []
    for _ in range(3):
        raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=8)
        assert raw.parse().usage.completion_tokens == 8  # type: ignore[union-attr]
        variants.append(raw.headers["x-spec-variant"])
    client.close()
    assert variants == ["none", "none", "none"]
    metrics = httpx.get(running.url + "/metrics", timeout=5).text
    assert f'variant="{pinned}"' in metrics and "tuner_variant_quarantined" in metrics


def _instances(running: RunningDaemon) -> list[psutil.Process]:
    """The router's or the pool's instances (not the router)."""
    children = psutil.Process(running.process.pid).children(recursive=True)
    return [
        c
        for c in children
        if "llama-server" in c.name() and "--models-preset" not in " ".join(c.cmdline())
    ]


@ENGINES
def test_a_stopped_no_speculation_instance_is_restarted_and_both_requests_answered(
    tmp_path: Path, engine: str
) -> None:
    """Speculation off for all traffic: every request runs on no speculation, which is also
    where failed requests go. SIGSTOP of that instance while it works on a 300-token sampled
    answer, with a 16-token request after it: it is killed at once and started again, and
    both requests are answered (by another loaded instance or the restarted one), well
    inside the stall bound; the failure is recorded once per request as a stall of
    ``none``."""
    state = tmp_path / "state"
    state.mkdir()
    tuning = tmp_path / "tuning.toml"
    tuning.write_text("[overrides.all]\noff = true\n")
    env = {"TUNER_THREADS": "2", "TUNER_ENGINE": engine, "TUNER_TUNING_FILE": str(tuning)}
    running = start_daemon(state, env=env)
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    opened = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=8)
    assert opened.headers["x-spec-variant"] == "none"
    (instance,) = [p for p in _instances(running) if _serves_none(p)]
    _when_busy(instance, instance.suspend)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(2) as pool:
            long = pool.submit(
                client.completions.with_raw_response.create,
                model="x",
                prompt=PROMPT,
                max_tokens=300,
                temperature=0.8,
            )
            time.sleep(1.0)
            short = pool.submit(
                client.completions.with_raw_response.create,
                model="x",
                prompt="Name three colours.",
                max_tokens=16,
            )
            answers = [long.result(), short.result()]
        took = time.monotonic() - started
        for raw in answers:
            assert raw.status_code == 200 and raw.headers["x-spec-role"] == "fallback"
            assert raw.parse().usage.completion_tokens > 0  # type: ignore[union-attr]
        assert took < 60
        assert not instance.is_running() or instance.status() == psutil.STATUS_ZOMBIE
    finally:
        client.close()
        if instance.is_running():
            instance.kill()
    for _ in range(50):  # records are written off the request path
        failed = [r for r in _records(running) if r.get("error")]
        if len(failed) >= 2:
            break
        time.sleep(0.1)
    assert [(r["variant"], r["status"]) for r in failed] == [("none", 504)] * 2, failed


def _serves_none(process: psutil.Process) -> bool:
    """An instance without speculation: the router names it by its preset (``--alias
    none``); the pool starts it with ``--spec-type none``."""
    pairs = list(itertools.pairwise(process.cmdline()))
    return ("--alias", "none") in pairs or ("--spec-type", "none") in pairs
