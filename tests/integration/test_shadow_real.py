"""The ngram-mod replay against the real llama-server: same requests, same order, one slot."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import plain_server
from tests.integration.test_daemon import CODE_EDIT
from tuner.tuning.replay.drafters import ModDrafter

pytestmark = pytest.mark.llama

MOD = (12, 16, 12)  # n_match, n_max, n_min


@pytest.fixture(scope="module")
def mod_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    flags = ["-t", "2", "-np", "1", "--spec-type", "ngram-mod"]
    flags += ["--spec-ngram-mod-n-match", str(MOD[0]), "--spec-ngram-mod-n-max", str(MOD[1])]
    flags += ["--spec-ngram-mod-n-min", str(MOD[2])]
    with plain_server(tmp_path_factory.mktemp("mod"), "llama.cpp", extra=flags) as url:
        yield url


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
