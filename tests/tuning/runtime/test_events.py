"""Evidence as events: what one engine publishes, another absorbs to the same evidence."""

from __future__ import annotations

import json
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
from tuner.tuning.evidence.counts import Counts
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
    kinds = {e.kind for e in events}
    assert kinds == {"served", "replayed", "trial"}

    joiner = make(tmp_path / "b", config(explore_share=0.5), caps)
    stored = [pooling.parse(json.loads(json.dumps(pooling.dump(e)))) for e in events]
    assert stored == events  # what storage gives back is the event published
    assert joiner.absorb([e for e in stored if e is not None]) == len(events)
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
    from tuner.tuning.evidence.classes import ClassState, levels, parse_class
    from tuner.tuning.pricing.costfit import CostFit

    states: dict[str, ClassState] = {}

    def state(key: str) -> ClassState:
        return states.setdefault(key, ClassState(key))

    event = pooling.replayed(CODE, {"b": (64, 30, 20), "c": (64, 8, 1)}, ("a", (64, 40, 25)))
    parsed = pooling.parse(json.loads(json.dumps(pooling.dump(event))))
    assert parsed is not None
    pooling.apply(parsed, state, CostFit(), lambda name: name != "c")
    row = {"a": (64, 40, 25), "b": (64, 30, 20)}  # c: a variant this daemon does not run
    assert set(states) == set(levels(CODE))
    assert all(list(s.pairs) == [row] for s in states.values())
    assert "a" not in states[CODE].arms  # the served counts came with the served event
    again = parse_class(CODE, json.loads(json.dumps(states[CODE].dump())))
    assert list(again.pairs) == [row]
    old = {k: v for k, v in states[CODE].dump().items() if k != "pairs"}
    with pytest.raises(ValueError):  # a layout of another version: the file is set aside
        parse_class(CODE, old)
    # an event without the served counts: evidence for the replayed variants, no row
    old_event = pooling.replayed(CODE, {"b": (64, 30, 20)})
    assert pooling.parse(pooling.dump(old_event)) == old_event
    pooling.apply(old_event, state, CostFit(), lambda name: True)
    assert len(states[CODE].pairs) == 1 and states[CODE].arms["b"].replayed == 2
    wrong = {**pooling.dump(event), "served": {"variant": "a", "counts": [64, 2, 3]}}
    assert pooling.parse(wrong) is None  # more accepted than drafted


def test_an_event_of_the_first_version_is_migrated() -> None:
    """Events written before versions (one-letter keys) read as this version's."""
    old = [
        {"k": "served", "c": CODE, "v": "ngram-mod", "r": 41.5, "n": [64, 30, 12]},
        {"k": "replayed", "c": CODE, "x": {"b": [64, 30, 20]}, "s": {"v": "a", "n": [64, 9, 3]}},
        {"k": "replayed", "c": CODE, "x": {"b": [64, 30, 20]}},
        {"k": "trial", "c": CODE, "v": "ngram-mod", "conv": True},
    ]
    assert [pooling.parse(e) for e in old] == [
        pooling.served(CODE, "ngram-mod", 41.5, Counts(64, 30, 12)),
        pooling.replayed(CODE, {"b": Counts(64, 30, 20)}, ("a", Counts(64, 9, 3))),
        pooling.replayed(CODE, {"b": Counts(64, 30, 20)}),
        pooling.trial_done(CODE, "ngram-mod", True),
    ]
    assert all(pooling.dump(pooling.parse(e))["version"] == pooling.VERSION for e in old)  # type: ignore[arg-type]


counts = st.lists(st.integers(-2, 10**6), min_size=0, max_size=4)
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | counts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
V1 = ["c", "v", "r", "n", "x", "s", "conv"]
V2 = ["version", "class_key", "variant", "tok_s", "counts", "served", "converged"]


@given(
    kind=st.sampled_from(["served", "replayed", "trial", "x"]),
    fields=st.dictionaries(st.sampled_from(V1 + V2), junk),
    v1=st.booleans(),
)
def test_parse_never_raises(kind: str, fields: dict[str, Any], v1: bool) -> None:
    found = pooling.parse({"k" if v1 else "kind": kind, **fields})
    assert found is None or found.kind == kind


valid_counts = st.tuples(st.integers(0, 10**5), st.integers(0, 10**4)).flatmap(
    lambda nd: st.integers(0, nd[1]).map(lambda a: Counts(nd[0], nd[1], a))
)
names = st.text("abcdefghijklmnopqrstuvwxyz.-0123456789", min_size=1, max_size=12)
valid_events = st.one_of(
    st.builds(pooling.served, names, names, st.floats(0.01, 1e4, allow_nan=False), valid_counts),
    st.builds(
        pooling.replayed,
        names,
        st.dictionaries(names, valid_counts, max_size=4),
        st.none() | st.tuples(names, valid_counts),
    ),
    st.builds(pooling.trial_done, names, names, st.booleans()),
)


@given(valid_events)
def test_every_event_survives_storage_and_applies(event: pooling.Event) -> None:
    from tuner.tuning.evidence.classes import ClassState
    from tuner.tuning.pricing.costfit import CostFit

    stored = pooling.parse(json.loads(json.dumps(pooling.dump(event))))
    assert stored == event
    engine_state: dict[str, ClassState] = {}

    def state(key: str) -> ClassState:
        return engine_state.setdefault(key, ClassState(key))

    applied = pooling.apply(stored, state, CostFit(), lambda _: True)
    assert applied == (not isinstance(event, pooling.Replayed) or bool(event.counts))
    assert event.class_key in engine_state or not applied
