"""``[guard] warm_tables`` against a real llama-server router: a prompt-only request with a
request's prompt and answer teaches another ngram-mod instance's table that answer."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tuning.sim import HELP, config, make
from tuner.records import RequestRecord, Timings
from tuner.settings import Settings
from tuner.tuning.counterfactual import Counterfactual
from tuner.tuning.shadow import ModDrafter
from tuner.upstream.capabilities import parse_capabilities
from tuner.upstream.launch import default_model_path
from tuner.upstream.process import free_port
from tuner.upstream.provision import locate_llama_server

pytestmark = pytest.mark.llama

WARMED = "ngram-mod.match12.max16"  # a variant of the engine's search space
UNLOADED = "ngram-mod.match24.max16"  # another one, not a preset here
MOD = (12, 16, 12)  # n_match, n_max, n_min
COLD = "cold"  # the same settings, never warmed
MOD_FLAGS = (
    "spec-type = ngram-mod\nspec-ngram-mod-n-match = 12\nspec-ngram-mod-n-max = 16\n"
    "spec-ngram-mod-n-min = 12\n"
)
# a fresh answer: little of it echoes the prompt, so only a table that saw it can draft it
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring.\n\n"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    presets = tmp_path_factory.mktemp("warm") / "presets.ini"
    presets.write_text(
        f"version = 1\n\n[*]\nmodel = {default_model_path()}\nthreads = 2\nctx-size = 4096\n"
        f"parallel = 1\n\n[none]\n\n[{WARMED}]\n{MOD_FLAGS}\n[{COLD}]\n{MOD_FLAGS}"
    )
    port = free_port()
    argv = [str(binary), "--models-preset", str(presets), "--models-max", "3",
            "--host", "127.0.0.1", "--port", str(port), "--no-webui"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(url + "/models", timeout=2).status_code == 200, "router")
        for name in ("none", WARMED, COLD):
            httpx.post(url + "/models/load", json={"model": name}, timeout=30)
        _wait(lambda: _loaded(url) >= {"none", WARMED, COLD}, "presets")
        yield url
    finally:
        proc.kill()
        proc.wait()


def _wait(ready: object, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if ready():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    pytest.fail(f"{what} did not start")


def _loaded(url: str) -> set[str]:
    data = httpx.get(url + "/models", timeout=5).json()["data"]
    return {m["id"] for m in data if m["status"]["value"] == "loaded"}


def _complete(url: str, model: str) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "n_predict": 96, "temperature": 0,
            "return_tokens": True}  # fmt: skip
    reply: dict[str, Any] = httpx.post(url + "/completion", json=body, timeout=300).json()
    return reply


def test_a_warmed_instance_drafts_from_an_answer_another_instance_served(
    router: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer comes from the instance without speculation; the replayer (the daemon's
    code path: tokenize through the router, replay, warm) feeds it to ``WARMED``, and not
    to a target that is not loaded. Asked the same prompt, ``WARMED`` drafts and accepts
    exactly what a simulated table fed that prompt and answer first gives, which is not
    what a cold table gives (``COLD``, same settings, is that)."""
    engine = make(tmp_path, config({"warm_tables": True}), parse_capabilities(HELP.read_text()))
    assert WARMED in engine.variants
    monkeypatch.setattr(engine, "warm_targets", lambda served: [WARMED, UNLOADED])
    replayer = Counterfactual(engine, router)
    answer = _complete(router, "none")
    t = answer["timings"]
    record = RequestRecord(
        id="r", ts=0.0, endpoint="/v1/completions", stream=False, status=200, proxy_ms=1.0,
        timings=Timings(predicted_n=t["predicted_n"], predicted_per_second=50.0,
                        predicted_ms=t["predicted_ms"]),
        class_key="code/fresh/greedy", variant="none", role="control", max_tokens=96,
    )  # fmt: skip
    replayer.replay(record, "/v1/completions", {"prompt": PROMPT}, answer["content"])
    replayer.close()
    assert replayer.warms == 1 and replayer.warm_seconds > 0
    assert UNLOADED not in _loaded(router)  # not loaded for a warm
    prompt = _tokens(router, PROMPT)
    warmed_table, cold_table = ModDrafter(*MOD), ModDrafter(*MOD)
    warmed_table.feed(prompt + answer["tokens"])
    for name, table in ((WARMED, warmed_table), (COLD, cold_table)):
        served = _complete(router, name)
        counts = (served["timings"].get("draft_n", 0), served["timings"].get("draft_n_accepted", 0))
        assert counts == table.replay(prompt, served["tokens"], 96), name
        if name == WARMED:
            # the warm changed what it drafted: a cold table would have drafted otherwise
            assert counts != ModDrafter(*MOD).replay(prompt, served["tokens"], 96)


def _tokens(url: str, text: str) -> list[int]:
    body = {"model": "none", "content": text, "add_special": True, "parse_special": True}
    return list(httpx.post(url + "/tokenize", json=body, timeout=30).json()["tokens"])
