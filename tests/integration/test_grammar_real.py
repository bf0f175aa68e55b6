"""The proxy's GBNF check agrees with the real parser: every grammar of the unit corpus,
and random ones, sent straight to a plain mainline llama-server: it refuses exactly those
the check names. Through the daemon on ik_llama.cpp (which would drop a broken grammar and
answer unconstrained) a broken grammar is the same 400 as on mainline."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import plain_server, start_daemon
from tests.proxy.test_grammar import INVALID, VALID
from tuner.proxy.grammar import grammar_error

pytestmark = pytest.mark.llama

ALPHABET = '"ab()[]*+?{}0123456789,\\ \n#.^x-|<>!'


@pytest.fixture(scope="module")
def mainline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with plain_server(tmp_path_factory.mktemp("grammar"), "llama.cpp", ctx_size=512) as url:
        yield url


def _refused(url: str, grammar: str) -> bool:
    body = {"prompt": "a", "n_predict": 1, "grammar": grammar, "temperature": 0}
    answer = httpx.post(url + "/completion", json=body, timeout=60)
    assert answer.status_code in (200, 400), (grammar, answer.status_code, answer.text)
    return answer.status_code == 400


def test_the_check_refuses_what_the_real_parser_refuses(mainline: str) -> None:
    rng = random.Random(7)
    noise = ["root ::= " + "".join(rng.choices(ALPHABET, k=rng.randint(1, 16))) for _ in range(80)]
    corpus = [g for g in VALID if g.strip() and not g.startswith("%")] + [*INVALID, *noise]
    disagree = [
        (g, grammar_error(g))
        for g in corpus
        if _refused(mainline, g) != (grammar_error(g) is not None)
    ]
    assert disagree == []
    refused = sum(grammar_error(g) is not None for g in noise)
    assert 10 < refused < len(noise)  # the random ones hold both verdicts


def test_a_broken_grammar_is_a_400_on_ik_llama_cpp_too(tmp_path: Path) -> None:
    running = start_daemon(tmp_path, env={"TUNER_ENGINE": "ik_llama.cpp", "TUNER_TUNE": "false"})
    body = {"prompt": "a", "max_tokens": 4, "grammar": "root ::= ("}
    answer = httpx.post(running.v1 + "/completions", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "grammar" and "does not parse" in error["message"]
    good = {"prompt": "Answer:", "max_tokens": 5, "grammar": 'root ::= "yes" | "no"'}
    answer = httpx.post(running.v1 + "/completions", json=good, timeout=60)
    assert answer.json()["choices"][0]["text"] in {"yes", "no"}
