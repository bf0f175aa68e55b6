"""A conversation's later turns: kept where their history is cached unless moving pays."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from tests.tuning.sim import CODE, HELP, PROSE, SimUpstream, config, drive, make, truth
from tuner.records import RequestRecord, Timings
from tuner.sessions import Turn, prompt_of
from tuner.tuning.config import Override
from tuner.tuning.evidence.classes import parse_class
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.service import TuningService
from tuner.upstream.capabilities import Capabilities, parse_capabilities


def _learned(tmp_path: Path, caps: Capabilities) -> Engine:
    """An engine that has learned: code edits run a 1.45x variant, prose none."""
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, [CODE, PROSE] * 400)
    policy = engine.classes[CODE].policy
    assert policy is not None and policy.speculation
    return engine


def test_a_turn_stays_where_its_history_is_cached_unless_moving_pays(
    tmp_path: Path, caps: Capabilities
) -> None:
    """3,000 cached tokens cost seconds to process again; a 64-token answer at 1.45x saves a
    third of a second: the turn stays. With little history, it moves to the class's variant."""
    engine = _learned(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    long = engine.route(CODE, Turn("none", {"none": 3000.0}, 64))
    assert (long.variant, long.role) == ("none", "held")
    short = engine.route(CODE, Turn("none", {"none": 10.0}, 64))
    assert short.variant == best
    both = engine.route(CODE, Turn("none", {"none": 3000.0, best: 3000.0}, 64))
    assert both.variant == best  # the faster instance holds it too: nothing to process again


def test_turns_held_off_their_classs_choice_spend_its_exploration_budget(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A conversation opened on a slow trial stays there while its history is long: each such
    turn costs what a trial request would, so the class explores less for a while; turns
    held on the class's own choice cost nothing."""
    engine = _learned(tmp_path, caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    best = engine.effective_policy(CODE)[1].variant
    spent = engine.classes[CODE].spent
    for _ in range(5):
        engine.observe(sim.answer(CODE, engine.route(CODE, Turn(best, {best: 3000.0}, 64))))
    assert engine.classes[CODE].spent == pytest.approx(spent)
    for _ in range(5):
        decision = engine.route(CODE, Turn("none", {"none": 3000.0}, 64))
        assert decision.role == "held"
        engine.observe(sim.answer(CODE, decision))
    assert engine.classes[CODE].spent > spent + 5 * 0.1  # none is slower than its choice


def test_a_turn_held_by_a_variant_no_longer_served_moves(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = _learned(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    assert engine.route(CODE, Turn("gone.variant", {"gone.variant": 5000.0})).variant == best


def test_a_conversations_later_turns_explore_only_where_their_history_is(
    tmp_path: Path, caps: Capabilities
) -> None:
    """With every request allowed to explore: a turn whose history one instance holds runs
    what its class runs, or a trial of that very instance's variant; where one instance
    serves every variant (the pool's per-request settings), its turns run trials there."""
    engine = make(tmp_path, config(explore_share=1.0), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    held = "ngram-simple.n3.m16"
    served = []
    for _ in range(60):
        decision = engine.route(CODE, Turn(held, {held: 2000.0}, 64))
        engine.observe(sim.answer(CODE, decision))
        served.append((decision.role, decision.variant))
    assert all(role == "exploit" or variant == held for role, variant in served)
    everywhere = {name: 2000.0 for name in engine.variants}
    roles = []
    for _ in range(60):
        decision = engine.route(CODE, Turn(held, everywhere, 64))
        engine.observe(sim.answer(CODE, decision))
        roles.append(decision.role)
    assert "trial" in roles
    assert engine.classes[CODE].explored > 0


def _service(tmp_path: Path, **overrides: Override) -> TuningService:
    caps = parse_capabilities(HELP.read_text())
    cfg = config().model_copy(update={"overrides": overrides})
    return TuningService(partial(make, tmp_path, cfg, caps), tmp_path, {"model_key": "m"})


def _chat(*turns: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": t} for t in turns], "max_tokens": 32}


def test_the_service_routes_by_conversation_and_says_how(tmp_path: Path) -> None:
    """A new conversation goes where its class says (here a pin); its next turn, in a class
    pinned elsewhere, stays on the instance that holds its history (nothing measured yet
    pays for a move); a new conversation of that class goes to its pin."""
    pin = "ngram-simple.n3.m16"
    service = _service(tmp_path, **{"code": Override(pin="none"), "prose": Override(pin=pin)})
    first = prompt_of(_chat("Rename x in this code:\n" + "x = x + 1\n" * 60))
    routed = service.route(CODE, first)
    assert (routed.variant, routed.session) == ("none", "new")
    second = prompt_of(_chat("Rename x in this code:\n" + "x = x + 1\n" * 60, "Now explain it."))
    routed = service.route(PROSE, second)
    assert (routed.variant, routed.session) == ("none", "stayed")
    other = service.route(PROSE, prompt_of(_chat("A new story, please. " * 20)))
    assert (other.variant, other.session) == (pin, "new")
    assert service.route(PROSE).session is None  # no prompt: a plain request


def test_variants_sharing_an_instance_share_a_conversations_cache(tmp_path: Path) -> None:
    """In the pool, variants that differ only in per-request settings run on one instance:
    a turn whose class runs the other one goes there, for free, and counts as kept."""
    short, long = "ngram-simple.n3.m16", "ngram-simple.n3.m48"
    caps = parse_capabilities(HELP.read_text())
    cfg = config().model_copy(
        update={"overrides": {"code": Override(pin=short), "prose": Override(pin=long)}}
    )
    shared = {short: "one", long: "one"}
    service = TuningService(
        partial(make, tmp_path, cfg, caps), tmp_path, {"model_key": "m"}, instances=shared
    )
    first = prompt_of(_chat("Rename x in this code:\n" + "x = x + 1\n" * 60))
    assert service.route(CODE, first).variant == short
    second = prompt_of(_chat("Rename x in this code:\n" + "x = x + 1\n" * 60, "Explain it."))
    routed = service.route(PROSE, second)
    assert (routed.variant, routed.session) == (long, "stayed")


def test_a_quarantined_instance_gives_its_conversations_up(tmp_path: Path) -> None:
    pin = "ngram-simple.n3.m16"
    service = _service(tmp_path, **{"code": Override(pin=pin)})
    first = prompt_of(_chat("Fix this:\n" + "y = 2\n" * 80))
    assert service.route(CODE, first).variant == pin
    for i in range(2):
        service.observe(_record(pin, 502, rid=f"f{i}"))
    routed = service.route(CODE, prompt_of(_chat("Fix this:\n" + "y = 2\n" * 80, "More.")))
    assert (routed.variant, routed.session) == ("none", "new")  # its cache is forgotten


def _record(
    variant: str,
    status: int = 200,
    rid: str = "r",
    session: str | None = None,
    chars: int = 0,
    role: str = "exploit",
) -> RequestRecord:
    timings = {"prompt_n": 20, "cache_n": 180, "prompt_ms": 50.0, "predicted_n": 8}
    return RequestRecord(
        id=rid,
        ts=0.0,
        endpoint="/v1/chat/completions",
        stream=False,
        status=status,
        error=None if status == 200 else "failed",
        proxy_ms=1.0,
        variant=variant,
        role=role,
        class_key=PROSE,
        timings=Timings.model_validate(timings),
        session=session,
        prompt_chars=chars or None,
    )


def test_turns_are_counted_per_class_and_kept_in_the_policy_file(tmp_path: Path) -> None:
    service = _service(tmp_path)
    for i, outcome in enumerate(["new", "stayed", "stayed", "moved:pays"]):
        role = "trial" if i == 1 else "exploit"  # a kept turn that ran a trial in place
        service.observe(_record("none", rid=f"r{i}", session=outcome, chars=600, role=role))
    state = service.engine.classes[PROSE]
    assert (state.stayed, state.moved, state.turn_trials) == (2, {"pays": 1}, 1)
    assert service.chars_per_token < 4.0  # 600 characters were 200 tokens: learning toward 3
    assert service.save()
    saved = json.loads((tmp_path / "policies.json").read_text())["classes"][PROSE]
    assert saved["turns"] == {"stayed": 2, "moved": {"pays": 1}, "trials": 1}
    restored = parse_class(PROSE, saved)
    assert (restored.stayed, restored.moved, restored.turn_trials) == (2, {"pays": 1}, 1)
    del saved["turns"]["trials"]  # a file written before trials in place
    assert parse_class(PROSE, saved).turn_trials == 0
    del saved["turns"]  # a file written before conversations were counted
    assert parse_class(PROSE, saved).stayed == 0


def test_the_report_shows_each_classs_kept_and_moved_turns(tmp_path: Path) -> None:
    from tuner.report.data import load_report
    from tuner.report.render import as_table

    service = _service(tmp_path)
    for i, outcome in enumerate(["stayed", "stayed", "moved:pays", "moved:unavailable"]):
        service.observe(_record("none", rid=f"r{i}", session=outcome))
    assert service.save()
    report = load_report(tmp_path)
    row = next(r for r in report.classes if r.class_key == PROSE)
    assert (row.turns_stayed, row.turns_moved) == (2, {"pays": 1, "unavailable": 1})
    assert "turns 2 kept 2 moved" in as_table(report)
    service.observe(_record("none", rid="t", session="stayed", role="trial"))
    assert service.save()
    assert "turns 3 kept (1 trials in place) 2 moved" in as_table(load_report(tmp_path))
