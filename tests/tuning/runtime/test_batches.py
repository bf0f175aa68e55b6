"""Where requests decode together: what serves a class in each bucket (``Rules.by_batch``,
``Router.route``'s ``batch``), what opens a conversation there, and which requests price a
drafted token."""

from __future__ import annotations

from pathlib import Path

from tests.tuning.runtime.test_turns import _learned
from tests.tuning.sim import CODE, PROSE, SimUpstream, config, make, truth
from tuner.model.speedup import CostModel
from tuner.tuning.evidence.classes import Arm
from tuner.tuning.evidence.counts import Counts
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.events import parse, served
from tuner.upstream.capabilities import Capabilities


def _exploiting(tmp_path: Path, caps: Capabilities) -> Engine:
    engine = _learned(tmp_path, caps)
    engine.reconfigure(config(explore_share=0.0))
    return engine


def test_a_class_serves_its_variant_alone_and_none_where_many_decode_together(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Code runs ``ngram-simple.n3.m48`` at 1.45x, its drafted tokens costing 0.45 of a step
    alone: priced as eight decoding together pay them, it no longer clears the guard, so
    that bucket serves none; alone, two and four keep it. Prose runs none everywhere."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    assert engine.rules.by_batch(CODE) == {8: "none"}
    assert [engine.route(CODE, batch=b).variant for b in (1, 2, 4, 8)] == [best] * 3 + ["none"]
    assert engine.rules.by_batch(PROSE) == {}
    assert {engine.route(PROSE, batch=b).variant for b in (1, 8)} == {"none"}
    fresh = "code/echo/sampled"  # not in the table yet: it borrows code's, and its buckets
    assert engine.route(fresh, batch=8).variant == "none"


def test_a_cheap_drafted_token_keeps_speculating_in_every_bucket(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Where a drafted token costs little alone (a GPU's memory-bound step), eight decoding
    together still pay for it: the class keeps its variant in every bucket."""
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())), cost=0.05)
    for _ in range(400):
        for key in (CODE, PROSE):
            engine.observe(sim.answer(key, engine.route(key)))
    policy = engine.effective_policy(CODE)[1]
    assert policy.speculation
    assert engine.rules.by_batch(CODE) == {}


def test_a_turn_routed_before_any_answer_opens_by_the_bucket_it_arrives_in(
    tmp_path: Path, caps: Capabilities
) -> None:
    """On a CPU whose verify costs a tenth of a step a token (the cost model's guess
    without a calibration), the prior's best pays alone and with two decoding together,
    and not with four: a first turn that arrives with three others runs none."""
    cpu = CostModel(verify=lambda n: 1.0 + 0.1 * (n - 1))
    engine = make(tmp_path, config(), caps, cost=cpu)
    opening = engine.router.table.opening
    assert opening is not None
    assert engine.router.table.openings == {4: None, 8: None}
    engine.route(CODE)  # the plain anchor
    assert [engine.route(CODE, batch=b).variant for b in (1, 2, 4)] == [opening] * 2 + ["none"]


def test_only_requests_decoded_alone_price_a_drafted_token(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A request decoded beside others took as long as their drafts made the shared steps:
    its counts are evidence of what its variant accepts, its time is not of what its own
    drafts cost."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    before = engine.costfit.costs([best], lambda _: 60.0)[best]
    requests = engine.classes[CODE].arms[best].requests
    slow = served(CODE, best, 5.0, Counts(64, 48, 40), batch=4)  # slow: four decoded at once
    engine.absorb([slow])
    assert engine.costfit.costs([best], lambda _: 60.0)[best] == before
    assert engine.classes[CODE].arms[best].requests == requests + 1
    engine.absorb([served(CODE, best, 5.0, Counts(64, 48, 40))])  # the same, alone
    assert engine.costfit.costs([best], lambda _: 60.0)[best][0] > before[0]


def test_a_restart_rebuilds_the_cost_from_the_requests_decoded_alone(
    tmp_path: Path, caps: Capabilities
) -> None:
    """The kept requests say how many decoded together with each: the calibration rebuilt
    from them leaves the batched ones out, as the running one did."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    found = {}
    for batch in (1, 4):
        again = make(tmp_path / str(batch), config(explore_share=0.0), caps)
        again.restore(engine.snapshot())
        again.absorb([served(CODE, best, 5.0, Counts(64, 48, 40), batch=batch)] * 5)
        running = again.costfit.costs([best], lambda _: 60.0)[best][0]
        rebuilt = make(tmp_path / f"{batch}-rebuilt", config(explore_share=0.0), caps)
        rebuilt.restore(again.snapshot())
        found[batch] = (running, rebuilt.costfit.costs([best], lambda _: 60.0)[best][0])
    base = make(tmp_path / "base", config(explore_share=0.0), caps)
    base.restore(engine.snapshot())
    before = base.costfit.costs([best], lambda _: 60.0)[best][0]
    assert found[4][0] == before  # the running calibration left them out
    moved = found[1][1] - before  # what five such requests move it by where they count
    assert found[1][0] > before and moved > 0.005
    assert abs(found[4][1] - before) < moved / 10


def test_an_arm_kept_before_batches_were_recorded_reads_as_decoded_alone() -> None:
    arm = Arm()
    arm.add(40.0, Counts(64, 10, 8))
    data = arm.dump()
    del data["batches"]
    assert list(Arm.load(data).batches) == [1]
    arm.add(20.0, Counts(64, 10, 8), batch=3)
    assert list(Arm.load(arm.dump()).batches) == [1, 3]


def test_a_served_event_of_the_version_before_batches_was_decoded_alone() -> None:
    old = {
        "version": 2,
        "kind": "served",
        "class_key": "code",
        "variant": "v",
        "tok_s": 41.5,
        "counts": [64, 30, 12],
    }
    event = parse(old)
    assert event is not None and event.version == 3 and getattr(event, "batch", None) == 1
    batched = parse(served("code", "v", 41.5, Counts(64, 30, 12), batch=4).model_dump())
    assert batched is not None and getattr(batched, "batch", None) == 4
    assert parse({**old, "version": 3, "batch": 0}) is None
