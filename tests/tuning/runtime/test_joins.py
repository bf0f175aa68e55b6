"""A request at a busy CPU gate: it joins the variant decoding now unless what its class's
variant saves over the answer beats the wait (``Router.route``, role ``joined``)."""

from __future__ import annotations

from pathlib import Path

from tests.tuning.runtime.test_turns import _learned
from tests.tuning.sim import CODE, PROSE, SimUpstream, config, truth
from tuner.sessions import Turn
from tuner.tuning.config import Override
from tuner.tuning.pricing.waiting import Busy
from tuner.tuning.runtime.engine import Engine
from tuner.upstream.capabilities import Capabilities


def _exploiting(tmp_path: Path, caps: Capabilities) -> Engine:
    """The learned engine with no budget left to explore: every request is its policy's."""
    engine = _learned(tmp_path, caps)
    engine.reconfigure(config(explore_share=0.0))
    return engine


def test_a_long_wait_joins_the_variant_decoding_and_a_short_one_waits(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Code runs a 1.45x variant: against no speculation it saves about a second an answer
    here, less than a 30 s wait and more than a 10 ms one."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    assert engine.route(CODE).variant == best
    joined = engine.route(CODE, busy=Busy("none", 30.0))
    assert (joined.variant, joined.role) == ("none", "joined")
    waits = engine.route(CODE, busy=Busy("none", 0.01))
    assert (waits.variant, waits.role) == (best, "exploit")
    same = engine.route(CODE, busy=Busy(best, 30.0))
    assert (same.variant, same.role) == (best, "exploit")  # it is the one decoding


def test_joined_requests_are_evidence_and_spend_no_exploration_budget(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Serving the variant decoding is what the class would choose with the wait counted:
    not exploring, so the budget is not charged; its answers count for that variant."""
    engine = _exploiting(tmp_path, caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    state = engine.classes[PROSE]
    spent, plain = state.spent, state.baseline_requests
    best = engine.effective_policy(CODE)[1].variant
    for _ in range(4):  # prose runs none; a slower variant decodes and the wait is long
        decision = engine.route(PROSE, busy=Busy(best, 60.0))
        assert (decision.variant, decision.role) == (best, "joined")
        engine.observe(sim.answer(PROSE, decision))
    assert state.spent == spent and state.baseline_requests == plain
    assert state.arms[best].requests >= 4
    assert state.load.joined == 4


def test_nothing_joins_a_variant_its_class_may_not_run_or_that_lacks_its_history(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    history = Turn(best, {best: 3000.0}, 64)
    kept = engine.route(CODE, history, Busy("none", 30.0))
    assert (kept.variant, kept.role) == (best, "exploit")  # "none" would process it again
    shared = Turn(best, {best: 3000.0, "none": 3000.0}, 64)
    assert engine.route(CODE, shared, Busy("none", 30.0)).role == "joined"
    forbid = config(explore_share=0.0).model_copy(
        update={"overrides": {"code": Override(forbid=["none"])}}
    )
    engine.reconfigure(forbid)
    assert engine.route(CODE, busy=Busy("none", 30.0)).variant == best
    assert engine.route(CODE, busy=Busy("gone.variant", 30.0)).variant == best
