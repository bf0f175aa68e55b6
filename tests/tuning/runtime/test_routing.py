"""Routing reads the table the learner publishes: it never takes the learner's lock, and
the requests it routed before the learner took them still count against the budget."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from tests.tuning.sim import CODE, PROSE, SimUpstream, config, drive, make, schedule, truth
from tuner.sessions import Turn
from tuner.tuning.runtime.engine import Engine
from tuner.upstream.capabilities import Capabilities


def _learned(tmp_path: Path, caps: Capabilities, **kw: object) -> tuple[Engine, SimUpstream]:
    engine = make(tmp_path, config(explore_share=0.3), caps, **kw)
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, schedule(300))
    return engine, sim


def test_route_does_not_wait_while_the_learner_holds_its_lock(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine, _ = _learned(tmp_path, caps)
    held, release = threading.Event(), threading.Event()

    def learner_busy() -> None:  # a save or a fleet batch, as long as it takes
        with engine.locked():
            held.set()
            release.wait(10)

    busy = threading.Thread(target=learner_busy)
    busy.start()
    held.wait(5)
    answered: list[str] = []
    router = threading.Thread(
        target=lambda: answered.extend(engine.route(CODE).variant for _ in range(50))
    )
    try:
        engine.io = lambda job: None  # the learner's thread is busy: nothing runs on it now
        router.start()
        router.join(2)
        assert not router.is_alive() and len(answered) == 50
    finally:
        release.set()
        busy.join()
        router.join()


def test_requests_not_yet_taken_by_the_learner_count_against_the_budget(
    tmp_path: Path, caps: Capabilities
) -> None:
    """With the learner's thread stalled, the table stays as it was; the router's own
    count of what it routed since keeps exploration inside its share."""
    queued: list[Callable[[], None]] = []
    engine, _ = _learned(tmp_path, caps)
    engine.io = queued.append
    engine.router.notify = lambda: queued.append(engine.drain)
    share = engine.config.budget.explore_share
    before = engine.router.table.classes[PROSE]
    explored_before = engine.state(PROSE).explored
    decisions = [engine.route(PROSE) for _ in range(200)]
    explored = sum(d.role in ("trial", "control") for d in decisions)
    assert engine.router.table.classes[PROSE] is before  # nothing was published meanwhile
    assert explored <= share * (before.seen + 200) - before.spent + 1
    for job in queued:  # the learner catches up: every routed request is counted once
        job()
    state = engine.state(PROSE)
    assert state.seen == before.seen + 200 == engine.router.table.classes[PROSE].seen
    assert state.explored == explored_before + explored


def test_the_table_counts_what_the_learner_applied(tmp_path: Path, caps: Capabilities) -> None:
    engine, _ = _learned(tmp_path, caps)
    table = engine.router.table
    assert table.seen_all == sum(s.seen for s in engine.classes.values())
    assert table.classes[CODE].seen == engine.state(CODE).seen
    assert table.applied == engine.router._seq  # inline learner: every request taken
    code = engine.classes[CODE].policy
    assert code is not None and table.classes[CODE].serves.variant == code.variant


def test_a_class_the_table_lacks_is_served_its_parents_policy(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine, sim = _learned(tmp_path, caps)
    drive(engine, sim, [CODE] * 300)
    parent = engine.effective_policy("code/echo")[1]
    engine.io = lambda job: None  # the learner does not see the new class before it routes
    engine.router.notify = lambda: None
    decision = engine.route("code/echo/new")
    assert "code/echo/new" not in engine.router.table.classes
    assert decision.role == "exploit" and decision.variant == parent.variant


def test_a_later_turn_stays_on_its_instance_without_the_learner(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine, _ = _learned(tmp_path, caps)
    engine.io = lambda job: None
    engine.router.notify = lambda: None
    held = "ngram-mod.match12.max16" if "ngram-mod.match12.max16" in engine.variants else "none"
    turn = Turn(held, {held: 6000.0}, max_tokens=32)  # a long history, a short answer
    decision = engine.route(CODE, turn)
    assert decision.variant == held and decision.role == "held"
