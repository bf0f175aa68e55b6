"""The pool on the real ik_llama.cpp (which has no router): an instance per set of launch
flags, the draft settings honoured per request as the server's own timings show, and the
daemon on it end to end. Its faults are in ``test_router_faults`` beside the router's."""

from __future__ import annotations

import bisect
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.integration.conftest import report_json, start_daemon
from tuner.daemon.plan import pool_members
from tuner.settings import Settings
from tuner.tuning.variants import parse_name
from tuner.upstream.launch import instance_argv, prepare
from tuner.upstream.pool import Pool

pytestmark = pytest.mark.llama

# a standard library module's start (not this file's, which edits change) twice, and the
# start of a third copy: the model goes on copying it, so n-grams draft long runs
SOURCE = Path(bisect.__file__).read_text()[:1200]
PROMPT = f"{SOURCE}\n\n{SOURCE}\n\n{SOURCE[:200]}"
AUTO = "ngram-mod.match12.auto1"  # the engine's own --spec-autotune
NAMES = ("none", "ngram-mod.match12.max4", "ngram-mod.match12.max64", "ngram-simple.n3.m16", AUTO)


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[Pool]:
    state = tmp_path
    settings = Settings(engine="ik_llama.cpp", state_dir=state, ctx_size=4096, threads=2)
    prepared = prepare(settings)
    members = pool_members([parse_name(n) for n in NAMES], settings, prepared)
    argv = lambda flags, port: instance_argv(prepared, settings, flags, port)  # noqa: E731
    made = Pool(members, argv, capacity=5, log_dir=state / "logs", startup_timeout_s=120)
    await made.start()
    await made.wait_ready(120)
    yield made
    await made.stop()


async def complete(pool: Pool, model: str) -> dict[str, int]:
    async with httpx.AsyncClient(transport=pool, base_url="http://pool.invalid") as client:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 128, "temperature": 0}
        response = await client.post("/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    timings = response.json()["timings"]
    return {k: int(timings.get(k) or 0) for k in ("predicted_n", "draft_n", "draft_n_accepted")}


async def test_variants_differing_only_in_draft_settings_share_an_instance(pool: Pool) -> None:
    """The probe found ik_llama.cpp honours the fields: the two ngram-mod variants (n_max 4
    and 64) run on one process, ngram-simple and none on their own, and the engine's own
    autotune on one launched with ``--spec-autotune``, sent no draft settings."""
    flags = {name: member.flags for name, member in pool.members.items()}
    assert flags["ngram-mod.match12.max4"] == flags["ngram-mod.match12.max64"]
    assert len(set(flags.values())) == 4
    assert pool.members["ngram-mod.match12.max4"].fields["speculative.n_max"] == 4
    assert "--spec-autotune" in flags[AUTO] and pool.members[AUTO].fields == {}
    for name in NAMES:
        await complete(pool, name)
    assert pool.describe()["starts"] == 4 and len(pool.describe()["running"]) == 4  # type: ignore[arg-type]


async def test_the_draft_settings_sent_with_a_request_are_the_ones_it_drafts_with(
    pool: Pool,
) -> None:
    """Read from the server's timings: no speculation drafts nothing; n_max 4 never drafts
    more than 4 a round (each round gives its accepted tokens plus one, so the rounds are
    at most the answer's tokens less those accepted); n_max 64 drafts longer runs."""
    plain = await complete(pool, "none")
    assert plain["draft_n"] == 0 and plain["predicted_n"] == 128
    short = await complete(pool, "ngram-mod.match12.max4")
    long = await complete(pool, "ngram-mod.match12.max64")
    for answer in (short, long):
        assert answer["draft_n"] > 0, answer  # the copied module drafts
    rounds = short["predicted_n"] - short["draft_n_accepted"]
    assert short["draft_n"] <= 4 * rounds, short
    long_rounds = long["predicted_n"] - long["draft_n_accepted"]
    assert long["draft_n"] > 4 * long_rounds, long  # the same instance, longer drafts
    tuned = await complete(pool, AUTO)  # its bandit chooses n_max 1..16 each step
    tuned_rounds = tuned["predicted_n"] - tuned["draft_n_accepted"]
    assert 0 < tuned["draft_n"] <= 16 * tuned_rounds, tuned


def test_the_daemon_on_ik_llama_cpp_names_its_engine_and_tunes(tmp_path: Path) -> None:
    """``TUNER_ENGINE=ik_llama.cpp tuner serve``: ``/ready`` and ``tuner report`` name the
    engine; requests through the OpenAI SDK are answered with the variant that served them."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text("[search.ngram-mod]\nn_match = [12]\nn_max = [16, 64]\n")
    state = tmp_path / "state"
    state.mkdir()
    env = {"TUNER_ENGINE": "ik_llama.cpp", "TUNER_TUNING_FILE": str(tuning)}
    running = start_daemon(state, env=env)
    ready = httpx.get(running.url + "/ready", timeout=5).json()
    assert ready["engine"] == "ik_llama.cpp"
    fixed = {"none", "ngram-mod.match12.max16", "ngram-mod.match12.max64"}
    assert set(ready["models"]) == fixed | {"ngram-mod.match12.auto1"}  # its autotune too
    client = openai.OpenAI(api_key="unused", base_url=running.v1, max_retries=0, timeout=120)
    served = set()
    for _ in range(6):
        raw = client.completions.with_raw_response.create(model="x", prompt=PROMPT, max_tokens=32)
        assert raw.parse().usage.completion_tokens == 32  # type: ignore[union-attr]
        served.add(raw.headers["x-spec-variant"])
    client.close()
    assert served <= set(ready["models"]) and served != {"none"}  # trials of the others ran
    assert running.stop() == 0
    document = report_json(state)
    assert document["engine"] == "ik_llama.cpp" and document["build"] == "55d3c05"
