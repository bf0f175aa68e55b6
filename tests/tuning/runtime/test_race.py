"""The race: a class serves close rivals of its variant until time parts them (#69)."""

from __future__ import annotations

import random
from pathlib import Path

from tests.tuning.replay.test_worker import _drive
from tests.tuning.sim import CODE, TEXT, code_and_text, config, make
from tuner.sessions.moves import Turn
from tuner.tuning.policy.rivals import Rival, cap
from tuner.tuning.replay.drafters import EXACT
from tuner.tuning.runtime.engine import Engine
from tuner.upstream.capabilities import Capabilities

COST = 0.3  # a drafted token in code; 0.45 in prose
HELD, FASTER = "ngram-simple.n3.m8", "ngram-simple.n3.m16"


def _run(tmp_path: Path, caps: Capabilities, seed: int, race: bool) -> tuple[Engine, list[float]]:
    """#69's lock-in, simulated: prose, two thirds of the traffic, runs every ngram-simple
    variant at 1.5x; in code they run 1.2x but ``HELD`` 1.37x and ``FASTER`` 1.46x, and a
    drafted token costs ``COST`` of a step there against 0.45 in prose, so a variant code
    never served is priced at prose's cost, too low. The true speedups code was served."""
    rng = random.Random(seed)
    engine = make(tmp_path / f"{seed}-{race}", config({"race": race}), caps, rng=rng)
    sim = code_and_text(engine, {HELD: 1.37, FASTER: 1.46}, 1.2, COST, seed)
    plan = random.Random(seed).choices([CODE, TEXT], weights=[1, 2], k=450)
    decisions = _drive(engine, sim, plan, EXACT)
    served = [sim.true_speedup(CODE, d.variant) for k, d in zip(plan, decisions, strict=True)]
    return engine, [s for k, s in zip(plan, served, strict=True) if k == CODE]


def test_a_rival_priced_low_is_raced_and_wins_where_the_class_locked_in_without_it(
    tmp_path: Path, caps: Capabilities
) -> None:
    """On seeds where code may hold ``HELD`` to the end without the race (at least one of
    them does), the race serves ``FASTER`` a few times, its own requests price it, and
    code's later half runs it on every seed; the race spends at most its cap."""
    locked = []
    for seed in (5, 9):
        engine, served = _run(tmp_path, caps, seed, race=False)
        late = served[len(served) // 2 :]
        locked.append(sum(late) / len(late) < 1.40)
        engine, served = _run(tmp_path, caps, seed, race=True)
        late = served[len(served) // 2 :]
        assert sum(late) / len(late) > 1.42, seed
        state = engine.classes[CODE]
        assert 0 < sum(state.raced.values()) <= cap(state.seen), state.raced
    assert any(locked), "no lock-in for the race to break"


def _holding(tmp_path: Path, caps: Capabilities) -> Engine:
    """An engine whose code class holds a variant on its own evidence, with one rival
    certain to be drawn."""
    engine, _ = _run(tmp_path, caps, 9, race=True)
    state = engine.classes[CODE]
    assert state.policy is not None and state.policy.speculation
    rival = next(n for n in engine.variants if n.startswith("ngram-mod"))
    state.rivals, state.raced, state.lost = [Rival(rival, 2.0, 0.01, 0, 0)], {}, set()
    return engine


def test_a_conversations_later_turn_never_races(tmp_path: Path, caps: Capabilities) -> None:
    engine = _holding(tmp_path, caps)
    held = engine.classes[CODE].policy.variant  # type: ignore[union-attr]
    rival = engine.classes[CODE].rivals[0].name
    assert engine.route(CODE).variant == rival
    turn = engine.route(CODE, Turn(held, {held: 10.0}, 64))
    assert turn.role != "race" and turn.variant == held


def test_races_and_losers_survive_a_restart(tmp_path: Path, caps: Capabilities) -> None:
    engine = _holding(tmp_path, caps)
    loser = "ngram-simple.n6.m16"
    state = engine.classes[CODE]
    state.raced, state.lost = {loser: 3}, {loser}
    again = make(tmp_path / "again", config(), caps)
    again.restore(engine.snapshot())
    found = again.classes[CODE]
    assert found.raced == {loser: 3} and loser in found.lost
    snapshot = again.snapshot()[CODE]
    assert snapshot["race"]["raced"] == {loser: 3} and loser in snapshot["race"]["lost"]
    assert all(set(r) == {"variant", "ratio", "sd", "served", "raced"} for r in snapshot["rivals"])
