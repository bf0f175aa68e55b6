"""A variant that fails on the server is left out of routing and the search for a while."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tuning.sim import CODE, HELP, SimUpstream, config, drive, make, truth
from tuner.records import RequestRecord
from tuner.tuning.runtime.quarantine import Quarantine
from tuner.tuning.runtime.service import TuningService
from tuner.upstream.capabilities import parse_capabilities


@given(st.lists(st.booleans(), max_size=40))
def test_a_variant_is_held_only_after_failures_in_a_row_and_a_success_clears_it(
    outcomes: list[bool],
) -> None:
    """Two server-side failures in a row start a quarantine; each later episode lasts twice
    as long (capped); a success in between clears the record."""
    now = [0.0]
    q = Quarantine(after=2, first_s=10.0, max_s=40.0, clock=lambda: now[0])
    run = episodes = 0
    for ok in outcomes:
        now[0] += 100.0  # every quarantine is over by the next request
        if ok:
            q.succeeded("v")
            run = episodes = 0
            continue
        run += 1
        started = q.failed("v", "boom")
        expected = run >= (1 if episodes else 2)
        assert started == expected
        if started:
            episodes, run = episodes + 1, 0
            until = q.describe()["v"]["until"]
            assert until == now[0] + min(40.0, 10.0 * 2 ** (episodes - 1))
            assert q.blocks("v") and not q.blocks("none")


def _record(variant: str, status: int, role: str = "exploit", rid: str = "r") -> RequestRecord:
    error = None if status == 200 else "failed to load"
    return RequestRecord(
        id=rid,
        ts=0.0,
        endpoint="/v1/completions",
        stream=False,
        status=status,
        proxy_ms=1.0,
        variant=variant,
        role=role,
        class_key=CODE,
        error=error,
    )


def test_a_failing_variant_is_routed_around_and_its_trials_abandoned(tmp_path: Path) -> None:
    """Where every request of the class's chosen variant fails on the server, after two the
    variant is quarantined: routing falls back (its next best or no speculation), trials of
    it are abandoned (failed in the study), and the policy file and report say why."""
    caps = parse_capabilities(HELP.read_text())
    service = TuningService(
        partial(make, tmp_path, config(explore_share=0.5), caps), tmp_path, {"model_key": "m"}
    )
    engine = service.engine
    gains = {v: 1.5 if v.startswith("ngram-simple") else 1.3 for v in engine.variants}
    sim = SimUpstream({CODE: gains})
    for _ in range(12):  # trials are asked on the service's thread: let each batch's land
        drive(engine, sim, [CODE] * 50)
        service._pool.submit(lambda: None).result()
    chosen = engine.classes[CODE].policy.variant  # type: ignore[union-attr]
    assert chosen != "none"
    for i in range(2):
        service.observe(_record(chosen, 502, rid=f"r{i}"))
    assert service.quarantine.blocks(chosen)
    engine.refresh()
    routes = [service.route(CODE) for _ in range(50)]
    assert all(r.variant != chosen for r in routes)
    assert engine.classes[CODE].policy.variant != chosen  # type: ignore[union-attr]
    assert service.fallback(chosen, "r9", "failed to load").variant == "none"  # type: ignore[union-attr]
    assert service.fallback("none", "r9", "x") is None
    assert service.save()
    import json

    saved = json.loads((tmp_path / "policies.json").read_text())
    assert saved["quarantine"][chosen]["reason"] == "failed to load"
    from tuner.report.data import load_report

    assert chosen in load_report(tmp_path).quarantine


def test_a_trial_of_a_quarantined_variant_is_abandoned(tmp_path: Path) -> None:
    caps = parse_capabilities(HELP.read_text())
    held: set[str] = set()
    engine = make(tmp_path, config(explore_share=1.0), caps, excluded=held.__contains__)
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, [CODE] * 4)  # the anchors, then a trial starts
    trial = engine.classes[CODE].trial
    assert trial is not None
    held.add(trial.variant.name)
    decision = engine.route(CODE)
    assert decision.variant != trial.variant.name
    assert engine.classes[CODE].trial is None or engine.classes[CODE].trial is not trial
    history = engine.studies.history(CODE)  # type: ignore[union-attr]
    assert any(t.number == trial.number and t.state == "fail" for t in history), history


@pytest.mark.parametrize("status", [200, 502])
def test_only_server_side_failures_count(tmp_path: Path, status: int) -> None:
    caps = parse_capabilities(HELP.read_text())
    service = TuningService(partial(make, tmp_path, config(), caps), tmp_path, {"model_key": "m"})
    for i in range(3):
        service.observe(_record("ngram-mod", status, rid=f"r{i}"))
    assert service.quarantine.blocks("ngram-mod") == (status == 502)
    service.observe(_record("ngram-mod", 400))  # the client's fault: not the variant's


def test_a_failure_counts_as_the_request_falls_back_and_once(tmp_path: Path) -> None:
    """The proxy reports a failed variant as it sends the request again, before the record
    of it lands: the next request already routes around it; each record counts no more."""
    caps = parse_capabilities(HELP.read_text())
    service = TuningService(partial(make, tmp_path, config(), caps), tmp_path, {"model_key": "m"})
    for rid in ("a", "b"):
        service.fallback("ngram-mod", rid, "status 500")
        assert service.quarantine.blocks("ngram-mod") == (rid == "b")
    service.observe(_record("ngram-mod", 502, rid="a"))
    service.observe(_record("ngram-mod", 502, rid="b"))
    assert service.quarantine.describe()["ngram-mod"]["reason"] == "failed to load"
    assert service.quarantine.describe()["ngram-mod"]["episodes"] == 1
    service.quarantine.clock = lambda: 1e12  # over: one new failure starts the next one
    service.observe(_record("ngram-mod", 502, rid="c"))
    assert service.quarantine.describe()["ngram-mod"]["episodes"] == 2


def test_a_preset_the_router_is_reloading_is_routed_around(tmp_path: Path) -> None:
    """Right after a stall its preset is being killed and reloaded: requests pinned to it
    go without speculation (``fallback``) until the upstream says it is available again."""
    from tuner.tuning.config import Override

    caps = parse_capabilities(HELP.read_text())
    pin = "ngram-simple.n3.m16"
    cfg = config().model_copy(update={"overrides": {"all": Override(pin=pin)}})
    reloading = {pin}
    service = TuningService(
        partial(make, tmp_path, cfg, caps),
        tmp_path,
        {"model_key": "m"},
        unavailable=reloading.__contains__,
    )
    assert (service.route(CODE).variant, service.route(CODE).role) == ("none", "fallback")
    reloading.clear()
    assert (service.route(CODE).variant, service.route(CODE).role) == (pin, "pinned")


def test_while_none_restarts_the_variant_that_answered_last_stands_in(tmp_path: Path) -> None:
    """Where the no-speculation instance stalled and is being restarted, a request routed to
    it, or failing on it, goes to an instance that answered lately (what is generated is the
    same); once it is back, none serves again and a failure on it is not tried twice."""
    from tuner.tuning.config import Override

    caps = parse_capabilities(HELP.read_text())
    cfg = config().model_copy(update={"overrides": {"all": Override(pin="none")}})
    reloading: set[str] = set()
    service = TuningService(
        partial(make, tmp_path, cfg, caps),
        tmp_path,
        {"model_key": "m"},
        unavailable=reloading.__contains__,
    )
    assert service.fallback("none", "r0", "status 500", CODE) is None  # it answered an error
    reloading.add("none")
    assert service.route(CODE).variant == "none"  # no other instance known to be up
    service.observe(_record("ngram-mod", 200, rid="r1"))
    service.observe(_record("ngram-simple.n3.m16", 502, rid="r2"))  # a failure is not an answer
    routed = service.route(CODE)
    assert (routed.variant, routed.role) == ("ngram-mod", "fallback")
    again = service.fallback("none", "r3", "stalled", CODE)
    assert again is not None and again.variant == "ngram-mod"
    reloading.add("ngram-mod")  # that one stalled too: nothing else is known to answer
    assert service.route(CODE).variant == "none"
    reloading.clear()
    assert (service.route(CODE).variant, service.route(CODE).role) == ("none", "pinned")
    assert service.fallback("none", "r4", "status 500", CODE) is None
