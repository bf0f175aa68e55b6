"""A request at a busy CPU gate: it joins the variant decoding now unless what its class's
variant saves over the answer beats the wait (``Router.route``, role ``joined``)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tests.tuning.runtime.test_turns import _chat, _learned
from tests.tuning.sim import CODE, HELP, PROSE, SimUpstream, config, make, truth
from tuner.sessions import Turn, prompt_of
from tuner.tuning.config import Override
from tuner.tuning.pricing.waiting import Busy
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.service import TuningService
from tuner.upstream.capabilities import Capabilities, parse_capabilities


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


def test_a_later_turn_joins_only_where_the_wait_beats_processing_its_history_again(
    tmp_path: Path, caps: Capabilities
) -> None:
    """3,000 tokens of history take about 6 s to process again here: a 30 s wait for the
    turn's own variant costs more, a 5 s one less; where the busy variant's instance holds
    the history too, the 5 s wait is the longer."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    history = Turn(best, {best: 3000.0}, 64)
    joined = engine.route(CODE, history, Busy("none", 30.0))
    assert (joined.variant, joined.role) == ("none", "joined")
    kept = engine.route(CODE, history, Busy("none", 5.0))
    assert (kept.variant, kept.role) == (best, "exploit")
    shared = Turn(best, {best: 3000.0, "none": 3000.0}, 64)
    assert engine.route(CODE, shared, Busy("none", 5.0)).role == "joined"


def test_a_held_turn_moves_to_the_variant_decoding_where_its_wait_costs_more_than_its_history(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A turn held on no speculation, where code runs a faster variant: its 3,000 tokens cost
    more to process again than the answer saves, so it stays, unless the gate is busy with
    its class's variant and waiting for that to drain costs longer still. Where the gate is
    busy with the variant holding it, staying waits for nothing."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    held = Turn("none", {"none": 3000.0}, 64)
    assert engine.route(CODE, held).role == "held"
    assert engine.route(CODE, held, Busy(best, 5.0)).role == "held"
    moved = engine.route(CODE, held, Busy(best, 30.0))
    assert (moved.variant, moved.role) == (best, "exploit")
    assert engine.route(CODE, held, Busy("none", 30.0)).role == "held"


def test_nothing_joins_a_variant_its_class_may_not_run(tmp_path: Path, caps: Capabilities) -> None:
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    forbid = config(explore_share=0.0).model_copy(
        update={"overrides": {"code": Override(forbid=["none"])}}
    )
    engine.reconfigure(forbid)
    assert engine.route(CODE, busy=Busy("none", 30.0)).variant == best
    assert engine.route(CODE, busy=Busy("gone.variant", 30.0)).variant == best


def test_a_request_that_may_open_a_conversation_joins_the_variant_decoding_however_short_the_wait(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A conversation stays where its first turn goes: waiting for code's variant while the
    gate runs none would make each of its turns wait while the load lasts, so its first
    turn joins none even where the waits so far were short; not a variant its class
    measured slower than none: there it waits for its own."""
    engine = _exploiting(tmp_path, caps)
    best = engine.effective_policy(CODE)[1].variant
    short = Busy("none", 0.01)
    assert engine.route(CODE, busy=short).variant == best  # one request: the wait is priced
    opened = engine.route(CODE, busy=short, opens=True)
    assert (opened.variant, opened.role) == ("none", "joined")
    slow = next(n for n, s in engine.router.table.classes[PROSE].speeds.items() if s < 1.0)
    assert engine.route(PROSE, busy=Busy(slow, 0.01), opens=True).variant == "none"
    same = engine.route(CODE, busy=Busy(best, 0.01), opens=True)
    assert (same.variant, same.role) == (best, "exploit")  # it is the one decoding


def test_first_turns_at_once_on_a_fresh_state_join_the_variant_decoding(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Four clients' first turns at once, before anything is measured: the first is the plain
    anchor and decodes; the others join it rather than each open a session on the prior's
    best and wait for it (on one CPU the four decode together)."""
    engine = make(tmp_path, config(), caps)
    first = engine.route(CODE, opens=True)
    assert first.variant == "none"
    busy = Busy(first.variant, 0.0)
    rest = [engine.route(key, busy=busy, opens=True) for key in (CODE, PROSE, CODE)]
    assert [(d.variant, d.role) for d in rest] == [("none", "joined")] * 3


def test_the_service_says_which_requests_may_open_a_conversation(tmp_path: Path) -> None:
    """With a busy gate, a new conversation's first turn joins the variant decoding; a
    request without a prompt is not one, and waits for the opening variant there."""
    caps = parse_capabilities(HELP.read_text())
    service = TuningService(
        partial(make, tmp_path, config(explore_share=0.0), caps),
        tmp_path,
        {"model_key": "m"},
        busy=lambda: ("none", 0.01),
    )
    first = prompt_of(_chat("Rename x in this code:\n" + "x = x + 1\n" * 60))
    routed = service.route(CODE, first)
    assert (routed.variant, routed.role, routed.session) == ("none", "joined", "new")
    plain = service.route(CODE)  # no prompt: one request, nothing measured to price a wait
    assert plain.role == "exploit" and plain.variant != "none"
