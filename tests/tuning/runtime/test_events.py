"""Evidence as events: what one engine publishes, another absorbs to the same evidence."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tuning.sim import (
    CODE,
    PROSE,
    SimUpstream,
    config,
    drive,
    evidence,
    make,
    schedule,
    truth,
)
from tuner.tuning.runtime import events as pooling
from tuner.upstream.capabilities import Capabilities


def test_an_engine_absorbing_anothers_events_holds_the_same_evidence_and_choices(
    tmp_path: Path, caps: Capabilities
) -> None:
    events: list[pooling.Event] = []
    learner = make(tmp_path / "a", config(explore_share=0.5), caps, publish=events.append)
    sim = SimUpstream(truth(list(learner.variants.values())))
    drive(learner, sim, schedule(500))
    mod, simple = (
        next(n for n in learner.variants if n.startswith(t + "."))
        for t in ("ngram-mod", "ngram-simple")
    )
    learner.observe_replayed(CODE, "none", {mod: (64, 40, 30), "not-run-here": (64, 9, 1)})
    learner.observe_replayed(PROSE, "none", {simple: (64, 9, 1)})
    learner.observe_replayed(PROSE, "none", {"not-run-here": (64, 9, 1)})  # nothing to say
    kinds = {e["k"] for e in events}
    assert kinds == {"served", "replayed", "trial"}

    joiner = make(tmp_path / "b", config(explore_share=0.5), caps)
    assert joiner.absorb([e for e in events if pooling.parse(e) is not None]) == len(events)
    assert evidence(joiner) == evidence(learner)
    for key in (CODE, PROSE):
        mine, theirs = joiner.classes[key], learner.classes[key]
        assert mine.trials_done == theirs.trials_done and mine.converged == theirs.converged
        assert mine.policy is not None and theirs.policy is not None
        assert mine.policy.variant == theirs.policy.variant
        assert mine.seen == 0  # its own budget counters stay its own
    code = joiner.classes[CODE].policy
    assert code is not None and code.speculation  # served from its first request
    assert joiner.route(CODE).variant == code.variant


def test_events_naming_variants_this_daemon_does_not_run_are_skipped(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = make(tmp_path, config(), caps)
    foreign = pooling.served(CODE, "draft-mtp.n_max3", 40.0, (64, 30, 20))
    assert engine.absorb([foreign]) == 0
    assert all("draft-mtp.n_max3" not in s.arms for s in engine.classes.values())


def test_a_replay_keeps_every_variants_counts_of_the_request_side_by_side() -> None:
    """With the served variant's own counts, a replayed request is one row of every
    variant's counts at each level of its class, and the row survives a restart."""
    import json

    from tuner.tuning.evidence.classes import ClassState, levels, parse_class
    from tuner.tuning.pricing.calibration import Calibration

    states: dict[str, ClassState] = {}

    def state(key: str) -> ClassState:
        return states.setdefault(key, ClassState(key))

    event = pooling.replayed(CODE, {"b": (64, 30, 20), "c": (64, 8, 1)}, ("a", (64, 40, 25)))
    parsed = pooling.parse(json.loads(json.dumps(event)))
    assert parsed is not None
    pooling.apply(parsed, state, Calibration(), lambda name: name != "c")
    row = {"a": (64, 40, 25), "b": (64, 30, 20)}  # c: a variant this daemon does not run
    assert set(states) == set(levels(CODE))
    assert all(list(s.pairs) == [row] for s in states.values())
    assert "a" not in states[CODE].arms  # the served counts came with the served event
    again = parse_class(CODE, json.loads(json.dumps(states[CODE].dump())))
    assert list(again.pairs) == [row]
    old = {k: v for k, v in states[CODE].dump().items() if k != "pairs"}
    with pytest.raises(KeyError):  # a layout of another version: the file is set aside
        parse_class(CODE, old)
    # an event without the served counts: evidence for the replayed variants, no row
    old_event = pooling.replayed(CODE, {"b": (64, 30, 20)})
    assert pooling.parse(old_event) is not None
    pooling.apply(old_event, state, Calibration(), lambda name: True)
    assert len(states[CODE].pairs) == 1 and states[CODE].arms["b"].replayed == 2
    assert pooling.parse({**event, "s": {"v": "a", "n": [64, 2, 3]}}) is None  # a > d


counts = st.lists(st.integers(-2, 10**6), min_size=0, max_size=4)
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | counts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@given(
    kind=st.sampled_from(["served", "replayed", "trial", "x"]),
    fields=st.dictionaries(st.sampled_from(["c", "v", "r", "n", "x", "s", "conv"]), junk),
)
def test_parse_never_raises_and_what_it_accepts_applies(kind: str, fields: dict[str, Any]) -> None:
    event = {"k": kind, **fields}
    parsed = pooling.parse(event)
    if parsed is None:
        return
    engine_state: dict[str, Any] = {}
    from tuner.tuning.evidence.classes import ClassState
    from tuner.tuning.pricing.calibration import Calibration

    def state(key: str) -> ClassState:
        return engine_state.setdefault(key, ClassState(key))

    pooling.apply(parsed, state, Calibration(), lambda _: True)  # must not raise
    assert parsed["c"] in engine_state
