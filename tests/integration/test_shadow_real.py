"""The ngram-mod replay against the real llama-server: same requests, same order, one slot."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.test_daemon import CODE_EDIT
from tuner.settings import Settings
from tuner.tuning.replay.drafters import ModDrafter
from tuner.upstream.launch import default_model_path
from tuner.upstream.process import free_port
from tuner.upstream.provision import locate_llama_server

pytestmark = pytest.mark.llama

MOD = (12, 16, 12)  # n_match, n_max, n_min


@pytest.fixture(scope="module")
def mod_server() -> Iterator[str]:
    settings = Settings()
    binary = locate_llama_server(settings.llama_server, settings.cache_dir)
    port = free_port()
    argv = [
        str(binary),
        "-m",
        str(default_model_path()),
        "--port",
        str(port),
        "-t",
        "2",
        "-c",
        "4096",
        "-np",
        "1",
        "--no-webui",
        "--spec-type",
        "ngram-mod",
        "--spec-ngram-mod-n-match",
        str(MOD[0]),
        "--spec-ngram-mod-n-max",
        str(MOD[1]),
        "--spec-ngram-mod-n-min",
        str(MOD[2]),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            pytest.fail("llama-server did not start")
        yield url
    finally:
        proc.kill()
        proc.wait()


def _tokens(url: str, text: str, special: bool) -> list[int]:
    body = {"content": text, "add_special": special, "parse_special": special}
    return list(httpx.post(url + "/tokenize", json=body, timeout=30).json()["tokens"])


def test_the_mod_replay_gives_the_servers_counts_in_order(mod_server: str) -> None:
    """Three requests in a row (the third repeats the first: the table carries over);
    per request, the replay of the prompt and output token ids through one
    drafter gives the drafted and accepted counts the server reported."""
    list_prompt = "Continue the list:\n" + "".join(f"{i}. item number {i}\n" for i in range(1, 9))
    prompts = [CODE_EDIT, list_prompt, CODE_EDIT]
    drafter = ModDrafter(*MOD)
    found = []
    for prompt in prompts:
        body = {
            "prompt": prompt,
            "n_predict": 64,
            "temperature": 0,
            "return_tokens": True,
            "cache_prompt": False,
        }
        reply = httpx.post(mod_server + "/completion", json=body, timeout=300).json()
        t = reply["timings"]
        server = (t.get("draft_n", 0), t.get("draft_n_accepted", 0))
        replayed = drafter.replay(_tokens(mod_server, prompt, True), reply["tokens"], 64)
        found.append((server, replayed))
    assert all(server == replayed for server, replayed in found), found
    assert sum(server[1] for server, _ in found) > 0, found  # it did draft and accept
