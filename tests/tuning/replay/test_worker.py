"""Replays: the engine's use of replayed counts, and the replayer's IO."""

from __future__ import annotations

import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_llama import FakeLlamaServer
from tests.tuning.sim import CODE, SimUpstream, config, make
from tuner.model.speedup import CostModel
from tuner.proxy.app import create_app
from tuner.proxy.backend import Backend
from tuner.records import RecordStore, RequestRecord, Timings
from tuner.tuning.evidence.classes import Arm
from tuner.tuning.evidence.counts import Counts
from tuner.tuning.replay.drafters import EXACT, REPLAYABLE, ModDrafter, replay_simple
from tuner.tuning.replay.worker import Replayer
from tuner.tuning.runtime.engine import Decision, Engine
from tuner.tuning.runtime.service import TuningService
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.client import UpstreamClient


def _gains(engine: Engine) -> dict[str, float]:
    """Code edits: ngram-simple n3.m48 wins (1.5x), the rest of its type 1.2x, others lose."""
    out = {}
    for name, v in engine.variants.items():
        if v.spec_type == "ngram-simple":
            out[name] = 1.5 if (v.param("size_n"), v.param("size_m")) == (3, 48) else 1.2
        elif v.speculative:
            out[name] = 0.9
    return out


def _drive(
    engine: Engine, sim: SimUpstream, plan: list[str], replayed: frozenset[str] = frozenset()
) -> list[Decision]:
    """Requests of the classes in ``plan``; after each, what the replayer hands over: the
    counts of every variant whose spec type is in ``replayed`` (none: no replays)."""
    names = [k for k, v in engine.variants.items() if v.spec_type in replayed]
    out = []
    for key in plan:
        decision = engine.route(key)
        engine.observe(sim.answer(key, decision))
        if names:
            counts = {v: (64, *sim.counts(key, v)[:2]) for v in names}
            engine.observe_replayed(key, decision.variant, counts)
        out.append(decision)
    return out


def test_replayed_counts_find_the_best_variant_without_trying_it(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Every request measures every ngram-simple variant: the class serves the best one
    within a few requests and spends far less on exploring than trials alone."""
    found = {}
    for replay in (True, False):
        engine = make(tmp_path / str(replay), config(explore_share=0.1), caps)
        sim = SimUpstream({CODE: _gains(engine)}, seed=4)
        decisions = _drive(engine, sim, [CODE] * 150, EXACT if replay else frozenset())
        best = [n for n, d in enumerate(decisions) if sim.true_speedup(CODE, d.variant) == 1.5]
        served = [sim.true_speedup(CODE, d.variant) for d in decisions]
        found[replay] = (best[0] if best else 999, sum(served) / len(served))
        policy = engine.classes[CODE].policy
        if replay:
            assert policy is not None and sim.true_speedup(CODE, policy.variant) == 1.5
            arm = engine.classes[CODE].arms[policy.variant]
            assert arm.replayed > 0 and policy.speedup_low and policy.speedup_low > 1.0
    assert found[True][0] <= 12, found
    assert found[True][0] < found[False][0], found
    assert found[True][1] > found[False][1] + 0.05, found


def test_a_fitted_baseline_needs_no_controls_in_any_class(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A plain step's time is fitted on all traffic's speculative requests, so after two
    plain requests that anchor it no class sends a control (not with its trials, not for
    drift checks), and every class still finds its variant, its drafted tokens priced at
    the fitted speed (the upstream's 60 tok/s)."""
    keys = [CODE, "code/fresh/greedy", "text/echo/greedy", "data/echo/greedy"]
    engine = make(tmp_path, config({"replay": False}, explore_share=0.5, patience=0), caps)
    gains = {n: 1.1 for n, v in engine.variants.items() if v.speculative}
    gains["ngram-simple.n6.m16"] = 1.6
    decisions = _drive(engine, SimUpstream(dict.fromkeys(keys, gains), seed=3), keys * 90)
    assert sum(d.role == "control" for d in decisions) <= 2
    assert sum(d.role == "trial" for d in decisions) > 0
    with engine._lock:
        assert engine.pricing.baseline_speed(CODE) == pytest.approx(60.0, rel=0.03)
    for key in keys:
        policy = engine.classes[key].policy
        assert policy is not None and policy.variant == "ngram-simple.n6.m16", policy


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_opening_serves_what_replays_price_fastest_until_the_cost_is_measured(
    tmp_path: Path, caps: Capabilities, seed: int
) -> None:
    """A request whose class runs no speculation only for lack of evidence runs, after the
    two plain requests that anchor the fitted step, the variant all traffic's replays price
    fastest so far, and only until a trial's worth of speculative requests has been served
    (then the guard alone decides): at most two plain requests, and every class settles on
    its best. Where every variant loses, nothing opens."""
    keys = [CODE, "code/fresh/greedy", "text/echo/greedy", "data/echo/greedy", "chat/fresh/greedy"]
    plan = keys * 40
    # the cost model guesses a drafted token at 0.3 of a step (the simulated one costs 0.45)
    cost = CostModel(verify=lambda n: 1.0 + 0.3 * (n - 1))
    engine = make(tmp_path / f"{seed}", config(), caps, cost=cost)
    gains = {n: 1.25 for n, v in engine.variants.items() if v.speculative}
    gains["ngram-simple.n6.m16"] = 1.6
    sim = SimUpstream(dict.fromkeys(keys, gains), seed=seed)
    decisions = _drive(engine, sim, plan, REPLAYABLE)
    assert [d.role for d in decisions[:2]] == ["control", "control"]
    first = decisions[:12]
    assert sum(d.variant == "none" for d in first) <= 2
    assert engine._opening is None  # calibrated: over
    served = [d for d in first[2:] if d.variant != "none"]
    assert served and all(sim.true_speedup(CODE, d.variant) > 1 for d in served)
    serving = {k: engine.classes[k].policy.variant for k in keys}  # type: ignore[union-attr]
    assert serving == dict.fromkeys(keys, "ngram-simple.n6.m16")

    engine = make(tmp_path / f"losing-{seed}", config(), caps, cost=cost)
    losing = {n: 0.8 for n, v in engine.variants.items() if v.speculative}
    sim = SimUpstream(dict.fromkeys(keys, losing), seed=seed)
    decisions = _drive(engine, sim, keys * 4, REPLAYABLE)
    assert all(d.variant == "none" for d in decisions if d.role == "exploit")


def _small_under_busy(engine: Engine, busy: str, small: str) -> tuple[list[str], str, str]:
    """A busy class whose best replayable variant (1.6x) is slow for a small class beside it
    (0.9x), where another is best (1.5x): 120 busy requests, then the two alternating. What
    the small class was served, the busy class's best, the small class's own best."""
    names = [k for k, v in engine.variants.items() if v.spec_type in REPLAYABLE]
    busy_best, own_best = names[0], names[1]
    gains = {
        busy: dict.fromkeys(names, 1.2) | {busy_best: 1.6},
        small: dict.fromkeys(names, 1.05) | {busy_best: 0.9, own_best: 1.5},
    }
    sim = SimUpstream(gains, seed=5)
    _drive(engine, sim, [busy] * 120, REPLAYABLE)
    plan = [busy, small] * 40
    decisions = _drive(engine, sim, plan, REPLAYABLE)
    served = [d.variant for k, d in zip(plan, decisions, strict=True) if k == small]
    return served, busy_best, own_best


def test_a_small_class_chooses_on_its_own_replays_not_its_busy_parents_choice(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A small class under a busy parent, at the shipped budget, has no baseline requests of
    its own; its replayed counts are priced at the fitted step, so it runs its own best,
    not the parent's variant, which is slow for it."""
    engine = make(tmp_path, config(), caps)
    served, parents_best, own_best = _small_under_busy(
        engine, "text/echo/greedy", "text/fresh/greedy"
    )
    late = served[-10:]
    assert late.count(own_best) >= 8 and parents_best not in late, late


def test_replayed_evidence_is_kept_across_a_restart(tmp_path: Path, caps: Capabilities) -> None:
    arm = Arm()
    arm.add(60.0, Counts(64, 20, 10))
    arm.add_replayed(Counts(64, 30, 25))
    again = Arm.load(json.loads(json.dumps(arm.dump())))
    assert again.replayed == 1 and list(again.replays) == [(64, 30, 25)]
    assert again.evidence == [(64, 20, 10), (64, 30, 25)] and again.known == 2
    old = {k: v for k, v in arm.dump().items() if k not in ("replayed", "replays")}
    with pytest.raises(ValueError):  # a layout of another version: the file is set aside
        Arm.load(old)


# -- the replayer against a fake llama-server (the real one: tests/integration) ----------


def _words(text: str) -> list[int]:
    """The fake tokenizer: one token per word, its id from a stable table."""
    return [sum(map(ord, w)) % 997 for w in text.split()]


def _transport(
    calls: list[tuple[str, dict[str, object]]], loaded: tuple[str, ...] = ()
) -> httpx.MockTransport:
    """The fake router: ``loaded`` are the presets ``GET /models`` says are loaded."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        calls.append((request.url.path, body))
        if request.url.path == "/models":
            data = [{"id": name, "status": {"value": "loaded"}} for name in loaded]
            data.append({"id": "cold", "status": {"value": "unloaded"}})
            return httpx.Response(200, json={"data": data})
        if request.url.path == "/completion":
            return httpx.Response(200, json={"content": "x", "timings": {"prompt_n": 9}})
        if request.url.path == "/apply-template":
            text = " ".join(m["content"] for m in body["messages"])
            return httpx.Response(200, json={"prompt": "<bos> " + text})
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": _words(body["content"])})
        return httpx.Response(404, json={"error": {"code": 404, "message": "no"}})

    return httpx.MockTransport(handle)


def _record(variant: str, drafted: int = 0, accepted: int = 0, n: int = 12) -> RequestRecord:
    timings = Timings(
        predicted_n=n,
        predicted_per_second=50.0,
        predicted_ms=n * 20,
        draft_n=drafted or None,
        draft_n_accepted=accepted or None,
    )
    return RequestRecord(
        id="r",
        ts=0.0,
        endpoint="/v1/chat/completions",
        stream=False,
        status=200,
        proxy_ms=1.0,
        timings=timings,
        class_key=CODE,
        variant=variant,
        role="exploit",
        max_tokens=64,
    )


def test_the_replayer_tokenizes_and_hands_each_variant_its_counts(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = make(tmp_path, config(), caps)
    calls: list[tuple[str, dict[str, object]]] = []
    replayer = Replayer(engine, "http://fake", transport=_transport(calls))
    assert replayer.enabled and "ngram-simple.n3.m16" in replayer.variants
    code = "a b c d e f g h i j k l m n o p q r s t"
    body = {"messages": [{"role": "user", "content": "copy this: " + code}], "max_tokens": 64}
    served = "ngram-simple.n3.m16"
    prompt, output = _words("<bos> copy this: " + code), _words(code)
    d, a = replay_simple(prompt, output, 3, 16, 64)
    replayer.replay(_record(served, d, a, n=len(output)), "/v1/chat/completions", body, code)
    # the template and both tokenizations went to the instance that answered
    assert [c[0] for c in calls] == ["/apply-template", "/tokenize", "/tokenize"]
    assert all(c[1]["model"] == served for c in calls)
    assert calls[1][1]["add_special"] is True and calls[2][1]["add_special"] is False
    arms = engine.classes[CODE].arms
    assert served not in arms or arms[served].replayed == 0  # its own counts are real ones
    other = arms["ngram-simple.n3.m48"]
    assert other.replayed == 1 and other.replays[0][0] == len(output)
    assert replayer.checked == 1 and replayer.agreed == 1
    # the request's row: every replayed variant's counts beside the server's own
    row = engine.classes[CODE].pairs[-1]
    assert row[served] == (len(output), d, a) and row["ngram-simple.n3.m48"] == other.replays[0]
    # a wrong count from the server shows as a disagreement, not as evidence
    replayer.replay(_record(served, d + 1, a), "/v1/chat/completions", body, code)
    assert replayer.checked == 2 and replayer.agreed == 1


def test_ngram_mod_variants_are_replayed_through_tables_that_remember(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Each ngram-mod variant has its own simulated drafter, fed every request in order:
    an answer repeated later is drafted from the earlier one (as the server's table does)."""
    engine = make(tmp_path, config(), caps)
    replayer = Replayer(engine, "http://fake", transport=_transport([]))
    mods = [k for k, v in engine.variants.items() if v.spec_type == "ngram-mod"]
    assert mods and sorted(replayer.mod) == sorted(mods)
    drafter = replayer.mod[mods[0]]
    v = engine.variants[mods[0]]
    assert (drafter.n, drafter.n_max) == (v.param("n_match", 24), v.draft_length)
    answer = " ".join(f"w{i}" for i in range(120))
    body = {"prompt": "tell me the words", "max_tokens": 200}
    record = _record("none", n=120).model_copy(
        update={"endpoint": "/v1/completions", "max_tokens": 200}
    )
    reference = {k: ModDrafter(d.n, d.n_max, d.n_min) for k, d in replayer.mod.items()}
    prompt, output = _words("tell me the words"), _words(answer)
    for _ in range(2):
        replayer.replay(record, "/v1/completions", body, answer)
        expected = {k: d.replay(prompt, output, record.max_tokens) for k, d in reference.items()}
    arms = engine.classes[CODE].arms
    for name in mods:
        shadow = list(arms[name].replays)
        assert len(shadow) == 2 and shadow[0][1:] == (0, 0)  # nothing to copy the first time
        assert shadow[1][1:] == expected[name]
    assert any(arms[name].replays[1][2] > 40 for name in mods)  # the second time: copied
    # served by one of them: its own counts are the evidence; the others still learn
    assert record.timings is not None
    timings = record.timings.model_copy(update={"draft_n": 30, "draft_n_accepted": 7})
    served = record.model_copy(update={"variant": mods[0], "timings": timings})
    replayer.replay(served, "/v1/completions", body, answer)
    assert arms[mods[0]].replayed == 2 and arms[mods[1]].replayed == 3
    assert replayer.checked == 0  # an estimate, not checked against the server's counts
    # ... but how far it is off is counted: simulated against served accepted tokens
    simulated = reference[mods[0]].replay(prompt, output, record.max_tokens)[1]
    assert simulated > 40
    assert (replayer.mod_checked, replayer.mod_simulated, replayer.mod_served) == (1, simulated, 7)


def test_replay_mod_off_leaves_ngram_mod_to_trials(tmp_path: Path, caps: Capabilities) -> None:
    engine = make(tmp_path, config({"replay_mod": False}), caps)
    replayer = Replayer(engine, "http://fake", transport=_transport([]))
    assert replayer.enabled and not replayer.mod and replayer.variants


def test_an_answer_cut_at_its_last_round_is_credited_its_tail(
    tmp_path: Path, caps: Capabilities
) -> None:
    """ik_llama.cpp's text leaves out the accepted drafts of a last round that reaches
    max_tokens, while its counts include them: on such an engine each variant's replay is
    credited the tail, so the served variant's replay agrees with the server again; on one
    that sends every token, an answer that short is replayed as it is."""
    engine = make(tmp_path, config(), caps)
    code = "a b c d e f g h i j k l m n o p q r s t"
    asked = f"copy this: {code} {code}"
    body = {"messages": [{"role": "user", "content": asked}], "max_tokens": 64}
    served = "ngram-simple.n3.m16"
    prompt, output = _words("<bos> " + asked), _words(code)
    d, a = replay_simple(prompt, output, 3, 16, 64)
    tail = 5  # the server generated and accepted 5 tokens more than its text holds
    record = _record(served, d, a + tail, n=len(output) + tail + 1)
    cut = Replayer(engine, "http://fake", cuts_last_round=True, transport=_transport([]))
    cut.replay(record, "/v1/chat/completions", body, code)
    assert (cut.checked, cut.agreed) == (1, 1)
    other = engine.classes[CODE].arms["ngram-simple.n3.m48"].replays[-1]
    d48, a48 = replay_simple(prompt, output, 3, 48, 64)
    assert other == (len(output) + tail + 1, d48, min(d48, a48 + tail))
    whole = Replayer(engine, "http://fake", transport=_transport([]))
    whole.replay(record, "/v1/chat/completions", body, code)
    assert (whole.checked, whole.agreed) == (1, 0)
    assert engine.classes[CODE].arms["ngram-simple.n3.m48"].replays[-1][1:] == (d48, a48)


def test_a_lookup_length_the_drafter_cannot_model_is_not_replayed(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A search space with a bad n_match does not stop the replayer (nor the daemon's
    start): that variant is left to trials."""
    cfg = config()
    cfg = cfg.model_copy(update={"search": {"ngram-mod": {"n_match": [-1, 0, 12], "n_max": [16]}}})
    engine = make(tmp_path, cfg, caps)
    replayer = Replayer(engine, "http://fake", transport=_transport([]))
    assert sorted(replayer.mod) == ["ngram-mod.match12.max16"]


def test_the_replayer_runs_off_thread_and_drops_when_full(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = make(tmp_path, config(), caps)
    calls: list[tuple[str, dict[str, object]]] = []
    replayer = Replayer(engine, "http://fake", transport=_transport(calls), queue_size=1)
    body = {"prompt": "x y z x y z x y z", "max_tokens": 64}
    record = _record("none").model_copy(update={"endpoint": "/v1/completions"})
    assert replayer.submit(record, "/v1/completions", body, "x y z")
    assert not replayer.submit(record, "/v1/completions", body, "x y z")  # queue full
    assert replayer.dropped == 1
    assert not replayer.submit(
        record.model_copy(update={"status": 500}), "/v1/completions", body, "x"
    )
    assert not replayer.submit(record, "/v1/completions", body, "")  # an empty answer
    # every answered request is counted as offered, taken or not (the bench waits on these)
    assert (replayer.offered, replayer.pending) == (4, 1)
    replayer.open()
    deadline = time.monotonic() + 5
    while replayer.done < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    replayer.close()
    assert replayer.done == 1 and replayer.failed == 0 and replayer.pending == 0
    assert [c[0] for c in calls] == ["/tokenize", "/tokenize"]  # no template for completions
    assert engine.classes[CODE].arms["ngram-simple.n3.m16"].replayed == 1


def test_an_upstream_error_loses_one_replay_only(tmp_path: Path, caps: Capabilities) -> None:
    engine = make(tmp_path, config(), caps)
    replayer = Replayer(
        engine, "http://fake", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    replayer.open()
    body = {"prompt": "x y z", "max_tokens": 8}
    assert replayer.submit(_record("none"), "/v1/completions", body, "x y")
    deadline = time.monotonic() + 5
    while replayer.failed < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    replayer.close()
    assert replayer.failed == 1 and replayer.done == 0


async def test_the_proxy_hands_over_answered_requests_with_their_text(
    tmp_path: Path, caps: Capabilities, fake: FakeLlamaServer
) -> None:
    """Whole and streamed answers, chat and completions: the replayer gets the routed
    request's body and the answer's text, after the record is built; errors are not kept."""
    service = TuningService(partial(make, tmp_path, config(), caps), tmp_path, {"model_key": "m"})
    records = RecordStore(tmp_path / "records", linger_s=0)
    await records.start()
    client = UpstreamClient("http://fake", transport=fake.transport(), default_model="fake-model")
    client.health.answering(True)
    kept: list[tuple[RequestRecord, str, dict[str, Any], str]] = []
    app = create_app(
        Backend(client, router=service.route, keep=lambda *args: kept.append(args)), records
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as proxy:
        for stream in (False, True):
            chat = {"messages": [{"role": "user", "content": "hi"}], "stream": stream}
            assert (await proxy.post("/v1/chat/completions", json=chat)).status_code == 200
            done = {"prompt": "hi", "stream": stream}
            assert (await proxy.post("/v1/completions", json=done)).status_code == 200
        fake.error = (500, {"error": {"code": 500, "message": "boom"}})
        assert (await proxy.post("/v1/completions", json={"prompt": "x"})).status_code >= 500
    await records.flush()
    assert [k[3] for k in kept] == ["Hello there"] * 4
    assert [k[1] for k in kept] == ["/v1/chat/completions", "/v1/completions"] * 2
    assert all(k[0].variant == k[2]["model"] and k[0].status == 200 for k in kept)
    await records.stop()
    await service.stop()
    await client.aclose()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_drafted_token_is_priced_by_its_class(
    tmp_path: Path, caps: Capabilities, seed: int
) -> None:
    """As measured on Gemma: an ngram-simple drafted token cost 0.50 of a step in one class
    and 0.37 in another, ngram-mod's 0.35 everywhere. Here prose, two thirds of the traffic,
    runs ngram-simple at 0.3 a drafted token (1.5x) and code at 0.6 (1.25x, where ngram-mod
    runs 1.4x). Priced over all traffic, code's ngram-simple replays would read about 1.6x;
    priced in its class, code's own ngram-simple requests price it there and code serves
    ngram-mod in most of its later requests."""
    text = "text/echo/greedy"
    engine = make(tmp_path, config(explore_share=0.1), caps)
    code, prose, costs = {}, {}, {}
    for name, v in engine.variants.items():
        if v.spec_type == "ngram-simple":
            code[name], prose[name], costs[name] = 1.25, 1.5, 0.6
        elif v.spec_type == "ngram-mod":
            code[name], prose[name] = 1.4, 1.3
        elif v.speculative:
            code[name] = prose[name] = 0.9
    cheap = {name: 0.3 for name in costs}
    sim = SimUpstream(
        {CODE: code, text: prose}, cost=0.35, costs=costs, class_costs={text: cheap}, seed=seed
    )
    plan = random.Random(seed).choices([CODE, text], weights=[1, 2], k=300)
    decisions = _drive(engine, sim, plan, EXACT)
    served = [
        sim.true_speedup(CODE, d.variant)
        for key, d in zip(plan, decisions, strict=True)
        if key == CODE
    ]
    late = served[len(served) // 2 :]
    assert late.count(1.4) >= 0.6 * len(late), late
