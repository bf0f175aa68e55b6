"""The engine against a simulated upstream whose per-class speedups are known."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.tuning.sim import CODE, PROSE, SimUpstream, config, drive, make, schedule, truth
from tuner.model.envelope import cost_model
from tuner.model.speedup import CostModel
from tuner.tuning.config import Budget, Override
from tuner.tuning.pricing.costfit import CostFit
from tuner.tuning.runtime.engine import Decision, Engine
from tuner.tuning.runtime.policy_file import load_policies, save_policies
from tuner.upstream.capabilities import Capabilities

FRESH = "code/fresh/greedy"  # no echo: on a small-active MoE nothing is predicted to pay


def _converges(engine: Engine, sim: SimUpstream) -> None:
    """Code ends on its truly fastest variant, prose switches speculation off, and the
    last 300 requests are served at the best speed per class."""
    plan = schedule(1200)
    decisions = drive(engine, sim, plan)
    best = max(sim.true_speedup(CODE, name) for name in engine.variants)
    code = engine.classes[CODE].policy
    assert code is not None and code.speculation
    assert sim.true_speedup(CODE, code.variant) == best, code
    assert code.speedup_low is not None and code.speedup_low > 1.0
    prose = engine.classes[PROSE]
    assert prose.converged and prose.policy is not None
    assert prose.policy.variant == "none" and prose.policy.kill_switch
    assert "no variant beats baseline" in prose.policy.reason
    # What the traffic got once learned: exploitation only, at the best speed per class.
    late = [
        (c, d) for c, d in zip(plan[-300:], decisions[-300:], strict=True) if d.role == "exploit"
    ]
    assert all(sim.true_speedup(c, d.variant) >= (best if c == CODE else 1.0) for c, d in late)


@pytest.mark.parametrize("ground", ["model", "realistic"])
def test_converges_to_the_best_variant_and_switches_losers_off(
    tmp_path: Path, caps: Capabilities, ground: str
) -> None:
    """On counts that follow the engine's own model, and on a ground truth that does not
    (a per-round overhead the counts miss, per-class speed factors, stalls)."""
    engine = make(tmp_path, config(explore_share=0.5), caps)
    table = truth(list(engine.variants.values()))
    sim = SimUpstream(table) if ground == "model" else SimUpstream.realistic(table)
    _converges(engine, sim)


def test_the_convergence_check_fails_when_the_engine_prices_with_a_wrong_cost(
    tmp_path: Path, caps: Capabilities, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check above can fail: an engine that takes a drafted token for a tenth of what it
    costs (0.045 of a step against 0.45) serves code a variant that drafts more than it
    pays for, and speculation on prose."""
    real = CostFit.costs

    def wrong(self: CostFit, *args: Any, **kw: Any) -> dict[str, tuple[float, float]]:
        return {name: (0.045, se) for name, (_, se) in real(self, *args, **kw).items()}

    monkeypatch.setattr(CostFit, "costs", wrong)
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream.realistic(truth(list(engine.variants.values())))
    with pytest.raises(AssertionError):
        _converges(engine, sim)


def _exploration_cost(
    plan: list[str], decisions: list[Decision], sim: SimUpstream, key: str
) -> float:
    """What exploring really cost one class, from the simulator's true speedups: each trial or
    control request's extra decode time over the variant its class was being served then
    (its latest exploit decision), in requests at that variant's speed."""
    serving, cost = 1.0, 0.0
    for c, d in zip(plan, decisions, strict=True):
        if c != key:
            continue
        speed = sim.true_speedup(c, d.variant)
        if d.role == "exploit":
            serving = speed
        elif d.role in ("trial", "control"):
            cost += max(0.0, serving / speed - 1.0)
    return cost


@pytest.mark.parametrize("share", [0.05, 0.1, 0.3])
def test_exploration_costs_stay_inside_the_budget(
    tmp_path: Path, caps: Capabilities, share: float
) -> None:
    """The budget is decode time: a class loses at most ``explore_share`` of its requests'
    worth of time to trials and controls (true speeds, not the engine's own accounting)."""
    engine = make(tmp_path, config(explore_share=share), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    plan = schedule(800)
    decisions = drive(engine, sim, plan)
    for key in (CODE, PROSE):
        state = engine.classes[key]
        cost = _exploration_cost(plan, decisions, sim, key)
        assert cost <= share * state.seen * 1.1 + 1, (key, cost, state.seen)
    # Prose loses with every variant: it explored (at a cost over running none, 0.18 of a
    # request per trial request) until its search gave up.
    prose = engine.classes[PROSE]
    tried = [d for c, d in zip(plan, decisions, strict=True) if c == PROSE and d.role == "trial"]
    assert sum(1 / sim.true_speedup(PROSE, d.variant) - 1 for d in tried) > 1.0
    assert prose.converged and prose.policy is not None and not prose.policy.speculation


def test_exploring_variants_that_pay_is_free(tmp_path: Path, caps: Capabilities) -> None:
    """Where every variant tried beats what the class runs, exploring loses nothing, so the
    class explores far more than ``explore_share`` of its requests and finishes its search
    sooner: three or more trials in its first 60 requests, where a request-count budget
    would allow one trial per 60. No controls go with them."""
    engine = make(tmp_path, config(explore_share=0.1), caps)
    gains = {v: (1.5 if v.startswith("ngram-mod") else 1.25) for v in engine.variants}
    sim = SimUpstream({CODE: gains})
    decisions = drive(engine, sim, [CODE] * 150)
    state = engine.classes[CODE]
    early = decisions[:60]
    explored = sum(d.role in ("trial", "control") for d in early)
    assert explored > 0.3 * len(early)
    assert len({d.trial for d in early if d.role == "trial"}) >= 3
    assert state.trials_done >= 4 and state.policy is not None
    assert sim.true_speedup(CODE, state.policy.variant) == 1.5
    # and the true cost stayed inside the budget
    assert _exploration_cost([CODE] * 150, decisions, sim, CODE) <= 0.1 * 150 + 1


def test_slow_trials_spend_the_budget_by_the_time_they_take(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A trial request at 0.4x takes 2.5 requests' time: it costs 1.5, so a 10 % budget
    buys about 40 of them in 600 requests, not 60 (a request-count budget)."""
    engine = make(tmp_path, config(explore_share=0.1, patience=0, max_trials=50), caps)
    sim = SimUpstream({FRESH: {v: 0.4 for v in engine.variants}}, noise=0.02, count_noise=0.0)
    plan = [FRESH] * 600
    decisions = drive(engine, sim, plan)
    trials = sum(d.role == "trial" for d in decisions)
    assert 0.1 * 600 / 1.5 * 0.8 <= trials <= 0.1 * 600 / 1.5 + 2
    assert _exploration_cost(plan, decisions, sim, FRESH) <= 0.1 * 600 * 1.1 + 1


def test_a_search_that_stops_improving_ends(tmp_path: Path, caps: Capabilities) -> None:
    """After ``patience`` trials in a row that measure no better than the class's policy,
    the class is converged: no more trials and no controls (drift is judged by the held
    variant's counts)."""
    cfg = config(explore_share=0.3, max_trials=20, patience=3)
    engine = make(tmp_path, cfg, caps)
    gains = {v: (1.4 if v.startswith("ngram-simple") else 1.05) for v in engine.variants}
    sim = SimUpstream({CODE: gains})
    decisions = drive(engine, sim, [CODE] * 400)
    state = engine.classes[CODE]
    assert state.converged and state.trials_done < 20 and state.stale >= 3
    late = decisions[-200:]
    assert not any(d.role == "trial" for d in late)
    assert not any(d.role == "control" for d in late)


def test_kill_switch_before_data_for_a_small_active_moe(tmp_path: Path, caps: Capabilities) -> None:
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    engine = make(tmp_path, config(explore_share=0.1), caps, cost=moe)
    # An echo class's copies may pay even here (predicted, so it is off only for lack
    # of evidence); a class that does not echo is off by the verdict.
    echo = engine.route(CODE)
    assert echo.variant == "none" and not engine.classes[CODE].policy.kill_switch  # type: ignore[union-attr]
    first = engine.route(FRESH)
    assert first.variant == "none"
    policy = engine.classes[FRESH].policy
    assert policy is not None and policy.kill_switch and not policy.speculation
    assert "cannot pay" in policy.reason and "MoE" in policy.reason
    # It still explores, inside the budget only.
    sim = SimUpstream({FRESH: {v: 0.7 for v in engine.variants}})
    decisions = drive(engine, sim, [FRESH] * 300)
    trials = sum(d.role == "trial" for d in decisions)
    assert 0 < trials <= 0.1 * 301 + 1


def test_turns_routed_before_any_answer_open_on_the_priors_best(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Four clients' first turns routed at once, before any request is measured: one is
    the plain anchor and the others run the prior's best-predicted variant (plain, they
    would hold their conversations plain); on a small-active MoE, where the prior says
    nothing pays, they run none. Once a variant is measured, the measurements decide."""
    keys = [CODE, "chat/fresh/greedy", "text/echo/greedy", CODE]
    engine = make(tmp_path / "dense", config(), caps)
    best = engine.rules.rank("all").ranked[0][0].name
    first = [engine.route(key) for key in keys]
    assert first[0] == Decision("none", "control", policy_class=CODE)
    assert [(d.variant, d.role) for d in first[1:]] == [(best, "exploit")] * 3
    gains = {n: 1.3 for n, v in engine.variants.items() if v.speculative} | {best: 0.8}
    sim = SimUpstream(dict.fromkeys(keys, gains), seed=2)
    later = drive(engine, sim, keys * 10)
    assert not any(d.variant == best and d.role == "exploit" for d in later[-20:])

    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    engine = make(tmp_path / "moe", config(), caps, cost=moe)
    assert [engine.route(key).variant for key in keys] == ["none"] * 4


def test_a_confirmed_kill_switch_stops_exploring(tmp_path: Path, caps: Capabilities) -> None:
    """Once the prior's best candidates confirm that nothing pays, the search ends there
    (exploring on, at a loss, would cost the class its budget's share for good)."""
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    engine = make(tmp_path, config(explore_share=0.1), caps, cost=moe)
    sim = SimUpstream({FRESH: {v: 0.6 for v in engine.variants}})
    decisions = drive(engine, sim, [FRESH] * 1200)
    state = engine.classes[FRESH]
    assert state.converged and state.trials_done == engine.config.prior.enqueue
    assert state.policy is not None and state.policy.kill_switch
    assert all(d.role == "exploit" and d.variant == "none" for d in decisions[-600:])


def test_a_wrong_kill_switch_verdict_is_overturned(tmp_path: Path, caps: Capabilities) -> None:
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    engine = make(tmp_path, config(explore_share=0.1), caps, cost=moe)
    sim = SimUpstream({FRESH: {v: 1.3 for v in engine.variants}})
    drive(engine, sim, [FRESH] * 600)
    policy = engine.classes[FRESH].policy
    assert policy is not None and policy.speculation and not policy.kill_switch


def test_the_anchors_cost_a_class_nothing_of_its_budget(tmp_path: Path, caps: Capabilities) -> None:
    """The first requests run without speculation to anchor the step time, before any
    baseline exists to time them by; on a class served without speculation they cost
    nothing, so its exploring budget is whole after them."""
    engine = make(tmp_path, config(explore_share=0.01), caps)
    sim = SimUpstream({PROSE: {v: 1.0 for v in engine.variants}})
    decisions = drive(engine, sim, [PROSE] * 2)
    assert [d.role for d in decisions] == ["control", "control"], decisions
    assert engine.classes[PROSE].spent < 0.05, engine.classes[PROSE].spent


def test_a_new_class_waits_for_budget_before_trying_what_a_parent_measured_losing(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Once all traffic measured every variant slower, a class seen for the first time does
    not spend its first request on a trial: its budget must first cover what the trial's
    variant measured above it."""
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    small = {"ngram-simple": {"size_n": [3], "size_m": [8, 16]}}  # all measured on FRESH
    cfg = config(explore_share=0.1).model_copy(update={"search": small})
    engine = make(tmp_path, cfg, caps, cost=moe)
    new = ["data/echo/greedy", "text/echo/greedy", "chat/fresh/greedy", "code/echo/sampled"]
    sim = SimUpstream({key: {v: 0.5 for v in engine.variants} for key in [FRESH, *new]})
    drive(engine, sim, [FRESH] * 400)
    decisions = drive(engine, sim, [key for key in new for _ in range(4)])
    assert not any(d.role == "trial" for d in decisions), decisions


def test_many_new_classes_explore_inside_one_budget(tmp_path: Path, caps: Capabilities) -> None:
    """Twelve classes, each new, where every variant loses: the share holds over all traffic
    too, not only per class (each class's first request would otherwise be a trial)."""
    engine = make(tmp_path, config(explore_share=0.01), caps)
    keys = [
        f"{kind}/{echo}/{mode}"
        for kind in ("code", "text", "data")
        for echo in ("echo", "fresh")
        for mode in ("greedy", "sampled")
    ]
    sim = SimUpstream({key: {v: 0.5 for v in engine.variants} for key in keys})
    decisions = drive(engine, sim, keys * 6)
    assert sum(d.role == "trial" for d in decisions) <= 2, decisions


def test_a_verdict_yields_to_a_parent_that_measured_speculation_paying(
    tmp_path: Path, caps: Capabilities
) -> None:
    """The verdict is the cost model's guess: once a level above a class measured a variant
    clear of the guard, the class borrows it and searches in full instead of staying off."""
    moe = cost_model(experts=256, active=8, expert_fraction=0.7)
    engine = make(tmp_path, config(explore_share=0.1), caps, cost=moe)
    other = "text/fresh/greedy"
    sim = SimUpstream({key: {v: 1.3 for v in engine.variants} for key in (FRESH, other)})
    drive(engine, sim, [other] * 600)
    root = engine.classes["all"].policy
    assert root is not None and root.speculation, root
    drive(engine, sim, [FRESH] * 2)
    policy = engine.classes[FRESH].policy
    assert policy is not None and not policy.kill_switch and not policy.settled, policy
    served = engine.route(FRESH)
    assert served.variant != "none", served  # borrowed, or a trial of its own


def test_drift_reopens_exploration(tmp_path: Path, caps: Capabilities) -> None:
    """The held variant's speedup over its recent requests, by their counts, leaves the
    interval of its older ones."""
    cfg = config(explore_share=0.5, max_trials=4)
    cfg = cfg.model_copy(
        update={"search": {"ngram-simple": {"size_n": [3], "size_m": [8, 16]}, "ngram-cache": {}}}
    )
    engine = make(tmp_path, cfg, caps)
    speeds = truth(list(engine.variants.values()))
    sim = SimUpstream(speeds)
    drive(engine, sim, [CODE] * 300)
    state = engine.classes[CODE]
    assert state.converged and state.policy is not None and state.policy.speculation
    assert engine.check_drift() == []  # nothing changed yet
    chosen = state.policy.variant
    for name in speeds[CODE]:  # the workload changed: every variant accepts less
        speeds[CODE][name] = min(speeds[CODE][name], 1.15)
    assert speeds[CODE][chosen] == 1.15
    sim.speedups = speeds
    # Checked every 20 requests (the daemon checks on a timer). The engine may first
    # switch to another variant whose older evidence now looks better; that one drifts too.
    reopened = []
    for _ in range(10):
        drive(engine, sim, [CODE] * 20)
        reopened = engine.check_drift()
        if reopened:
            break
    assert reopened == [CODE]
    assert not state.converged


def test_policies_survive_a_restart(tmp_path: Path, caps: Capabilities) -> None:
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, schedule(600))
    before = engine.classes[CODE].policy
    assert before is not None and before.speculation
    meta = {"model_key": "m", "build": "b", "hardware_key": "h"}
    save_policies(tmp_path / "policies.json", meta, engine.snapshot())

    again = make(tmp_path, config(explore_share=0.5), caps)
    again.restore(load_policies(tmp_path / "policies.json", meta))
    after = again.classes[CODE].policy
    assert after is not None and after.variant == before.variant
    assert after.since == before.since
    assert again.route(CODE).variant in (before.variant, "none")  # exploit, or a control
    assert again.classes[PROSE].converged
    # The calibration of what a drafted token costs is rebuilt from the kept requests, and
    # the file says what each variant measured, as the engine decided.
    names = engine.costfit.variants()
    assert names and again.costfit.variants() == names
    was = engine.costfit.costs(names, engine.pricing.baseline_speed)
    now = again.costfit.costs(names, again.pricing.baseline_speed)
    for name in names:  # the same requests (the kept ones): the same costs
        assert now[name][0] == pytest.approx(was[name][0], abs=0.02)
    with engine._lock, again._lock:  # and the plain speed they are priced against
        speed = engine.pricing.baseline_speed(CODE)
        assert again.pricing.baseline_speed(CODE) == pytest.approx(speed, rel=0.03)
    saved = engine.snapshot()[CODE]["speedups"][before.variant]
    assert saved[0] == pytest.approx(before.speedup, abs=0.02)
    # Learned on another machine: set aside, not reused.
    assert load_policies(tmp_path / "policies.json", meta | {"hardware_key": "other"}) == {}
    assert list(tmp_path.glob("policies.*.old.json"))


def test_a_state_file_of_another_format_is_refused_whole(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Arms saved with (drafted, accepted) pairs only, a format no release wrote, do not
    load: the restore raises before changing anything (the service sets the file aside)."""
    old = {
        "requests": 6,
        "tokens": 384,
        "drafted": 240,
        "accepted": 200,
        "samples": [90.0] * 6,
        "served": [[40, 33]] * 6,
        "replayed": 0,
        "replays": [],
    }
    entry = {
        "seen": 6,
        "explored": 0,
        "spent": 0.0,
        "pairs": [],
        "prompt": {"cached": 0, "processed": 0, "seconds": 0.0},
        "trials_done": 0,
        "converged": False,
        "arms": {"ngram-simple.n3.m16": old},
    }
    engine = make(tmp_path, config(), caps)
    with pytest.raises(ValueError):
        engine.restore({CODE: entry})
    assert CODE not in engine.classes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_see_through_timing_noise(tmp_path: Path, caps: Capabilities, seed: int) -> None:
    """On a machine whose decode speeds scatter by 25 % per request, the counts estimate
    (each request's accepted and drafted tokens, priced) measures the chosen variant close
    to its true speedup. (Which variant the search reaches first is the search's business:
    1.45x or 1.15x here.)"""
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())), noise=0.25, seed=seed)
    drive(engine, sim, schedule(800, seed))
    policy = engine.classes[CODE].policy
    assert policy is not None
    true = sim.true_speedup(CODE, policy.variant)
    # within 8 %: c, calibrated on the same noisy speeds, is good to about +-0.05
    assert true >= 1.15 and policy.speedup == pytest.approx(true, rel=0.08), policy


def test_overrides_win(tmp_path: Path, caps: Capabilities) -> None:
    cfg = config(explore_share=0.5).model_copy(
        update={
            "overrides": {
                "code": Override(pin="ngram-simple.n12.m16"),
                PROSE: Override(off=True),
                "all": Override(forbid=("ngram-cache", "ngram-mod")),
            }
        }
    )
    engine = make(tmp_path, cfg, caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    decisions = drive(engine, sim, schedule(300))
    code = [d for c, d in zip(schedule(300), decisions, strict=True) if c == CODE]
    assert {d.variant for d in code} == {"ngram-simple.n12.m16"}
    prose = [d for c, d in zip(schedule(300), decisions, strict=True) if c == PROSE]
    assert {d.variant for d in prose} == {"none"}
    policy = engine.classes[PROSE].policy
    assert policy is not None and policy.override and "override" in policy.reason
    sim.speedups["math/fresh/greedy"] = {name: 1.1 for name in engine.variants}
    other = drive(engine, sim, ["math/fresh/greedy"] * 200)
    assert any(d.role == "trial" for d in other)
    assert not any(d.variant.startswith(("ngram-cache", "ngram-mod")) for d in other)


def test_reconfigure_applies_overrides_and_budget_but_not_the_search(
    tmp_path: Path, caps: Capabilities
) -> None:
    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    drive(engine, sim, schedule(100))
    search = engine.config.search
    edited = config(explore_share=0.0).model_copy(
        update={
            "overrides": {
                CODE: Override(pin="ngram-simple.n3.m8"),
                PROSE: Override(pin="ngram-simple.n5.m99"),  # not a running variant
            },
            "search": {"ngram-cache": {}},
        }
    )
    changed = engine.reconfigure(edited)
    assert set(changed) == {"budget", "overrides"}
    assert engine.config.search == search  # kept: the running presets cannot change
    assert engine.config.budget.explore_share == 0.0
    code = drive(engine, sim, [CODE] * 20)
    assert {d.variant for d in code} == {"ngram-simple.n3.m8"}
    assert engine.classes[CODE].policy is not None and engine.classes[CODE].policy.override
    prose = drive(engine, sim, [PROSE] * 20)  # the unknown pin was dropped, not routed
    assert all(d.variant in engine.variants and d.role == "exploit" for d in prose)
    assert engine.reconfigure(engine.config) == []


def test_budget_validation() -> None:
    with pytest.raises(ValueError, match="min_trial_requests"):
        Budget(trial_requests=2, min_trial_requests=3)


def test_per_class_decisions_are_prometheus_gauges(tmp_path: Path, caps: Capabilities) -> None:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tuner.metrics import Metrics, RequestMetrics
    from tuner.records import RecordStore
    from tuner.tuning.runtime.collectors import TuningCollector
    from tuner.upstream.client import UpstreamClient

    engine = make(tmp_path, config(explore_share=0.5), caps)
    sim = SimUpstream(truth(list(engine.variants.values())))
    collectors = [TuningCollector(engine)]
    upstream, records = UpstreamClient("http://127.0.0.1:9"), RecordStore(tmp_path / "r")
    metrics = Metrics(RequestMetrics(), lambda: upstream, records, collectors)
    drive(engine, sim, schedule(800))
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    code = engine.classes[CODE].policy
    assert code is not None
    arm = (("class_key", CODE), ("variant", code.variant))
    assert found[("tuner_class_speculation", arm)] == 1.0
    assert found[("tuner_class_speedup", arm)] == pytest.approx(code.speedup)
    assert found[("tuner_class_kill_switch", (("class_key", PROSE),))] == 1.0
    assert 0 < found[("tuner_class_exploration_share", (("class_key", PROSE),))] <= 0.5 + 1e-9
    prose = engine.classes[PROSE]
    cost = found[("tuner_class_exploration_cost", (("class_key", PROSE),))]
    assert 0 < cost == pytest.approx(prose.spent / prose.seen)
    assert found[("tuner_class_trials_total", (("class_key", PROSE),))] >= 1
    # The code class moved from none to a speculative variant at least once.
    assert found[("tuner_policy_switches_total", (("class_key", CODE),))] >= 1
    assert found[("tuner_policy_switches_total", (("class_key", CODE),))] == (
        engine.classes[CODE].switches
    )


def test_young_classes_are_served_by_what_their_parents_learned(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Six classes share 10 % of exploration; evidence pools at the parents. Five classes
    gain from short-lookup ngram-simple, one loses with every variant."""
    winners = [
        "code/echo/greedy",
        "code/echo/sampled",
        "code/fresh/greedy",
        "code/fresh/sampled",
        "text/echo/greedy",
    ]
    loser = "text/fresh/greedy"
    engine = make(tmp_path, config(explore_share=0.1), caps)
    variants = list(engine.variants.values())
    gains = {
        v.name: 1.3 if v.spec_type == "ngram-simple" and v.param("size_n") == 3 else 0.95
        for v in variants
    }
    sim = SimUpstream({**{c: gains for c in winners}, loser: {v.name: 0.85 for v in variants}})
    import random

    rng = random.Random(5)
    plan = [rng.choice([*winners, loser]) for _ in range(1200)]
    decisions = drive(engine, sim, plan)
    late = list(zip(plan[-200:], decisions[-200:], strict=True))
    served = [
        sim.true_speedup(c, d.variant) for c, d in late if c in winners and d.role == "exploit"
    ]
    # most winners' traffic gets a winning variant: found once, confirmed by the siblings
    assert sum(s >= 1.3 for s in served) >= 0.8 * len(served), served
    for key in winners:
        policy = engine.classes[key].policy
        assert policy is not None and sim.true_speedup(key, policy.variant) == 1.3, policy
    root = engine.classes["all"].policy
    assert root is not None and sim.true_speedup(winners[0], root.variant) == 1.3
    # the class where speculation loses is not served the parents' choice for long
    lost = [d.variant for c, d in late if c == loser and d.role == "exploit"]
    assert sum(v == "none" for v in lost) >= 0.9 * len(lost), lost


def test_a_parents_choice_is_not_served_untried_once_the_class_has_its_own_trials(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Serving a variant the class never tried is exploration; after its first own trial
    the class is served its own policy, and the parent's choice comes as a trial."""
    winner, loser = "code/echo/greedy", "code/fresh/greedy"
    engine = make(tmp_path, config(explore_share=0.1), caps)
    variants = list(engine.variants.values())
    sim = SimUpstream(
        {winner: {v.name: 1.3 for v in variants}, loser: {v.name: 0.85 for v in variants}}
    )
    import random

    rng = random.Random(2)
    after_own_trial = []
    for _ in range(1500):
        key = rng.choice([winner, winner, loser])
        had_trial = engine.classes[key].trials_done > 0 if key in engine.classes else False
        decision = engine.route(key)
        engine.observe(sim.answer(key, decision))
        if key == loser and had_trial and decision.role == "exploit":
            after_own_trial.append(decision.variant)
    root = engine.classes["all"].policy
    assert root is not None and root.speculation  # the parent had something to lend
    assert after_own_trial and set(after_own_trial) == {"none"}


def test_siblings_starting_together_split_the_priors_list(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Eight young classes start at once and the prior's first pick is not the winner:
    each class's first trial is a different variant, so the one that pays is found in
    the first round and confirmed by the others (it fails with every class trying the
    prior's first pick)."""
    import random

    classes = [
        f"{g}/{e}/greedy" for g in ("code", "data", "text", "chat") for e in ("echo", "fresh")
    ]
    engine = make(tmp_path, config(explore_share=0.1), caps)
    first_pick = engine.state(classes[0]).prior.ranked[0][0]  # type: ignore[union-attr]
    winner = next(
        v
        for v, _ in engine.classes[classes[0]].prior.ranked[4:]  # type: ignore[union-attr]
        if v.spec_type != first_pick.spec_type
    )
    gains = {name: 1.3 if name == winner.name else 0.97 for name in engine.variants}
    sim = SimUpstream({c: gains for c in classes}, noise=0.08)
    rng = random.Random(7)
    plan = [rng.choice(classes) for _ in range(800)]
    decisions = drive(engine, sim, plan)

    firsts = {}
    for c, d in zip(plan, decisions, strict=True):
        if d.role == "trial":
            firsts.setdefault(c, d.variant)
    # Distinct first trials, except classes starting after the winner was measured: they
    # confirm it first (a parent's measured best goes ahead of the prior).
    others = [v for v in firsts.values() if v != winner.name]
    assert len(set(others)) == len(others) and winner.name in firsts.values(), firsts
    late = [
        sim.true_speedup(c, d.variant) for c, d in zip(plan[-300:], decisions[-300:], strict=True)
    ]
    assert sum(s == 1.3 for s in late) >= 0.5 * len(late)


def test_sampled_classes_borrow_from_sampled_traffic_not_their_greedy_siblings(
    tmp_path: Path, caps: Capabilities
) -> None:
    """Greedy classes gain 1.3x with ngram-mod; sampled ones lose with everything. The
    sampled classes' parents are mostly greedy evidence, so they borrow from all sampled
    traffic pooled (``*/sampled``), where the borrowed variant is measured losing."""
    import random

    greedy = [f"{g}/echo/greedy" for g in ("code", "data", "text")]
    sampled = [f"{g}/echo/sampled" for g in ("code", "data", "text")]
    engine = make(tmp_path, config(explore_share=0.1), caps)
    gains = {v: 1.3 if v.startswith("ngram-mod") else 0.97 for v in engine.variants}
    sim = SimUpstream(
        {**{c: gains for c in greedy}, **{c: {v: 0.85 for v in engine.variants} for c in sampled}}
    )
    rng = random.Random(3)
    plan = [rng.choice(greedy * 3 + sampled) for _ in range(1200)]
    decisions = drive(engine, sim, plan)

    assert "*/sampled" in engine.classes and engine.classes["*/sampled"].seen == 0
    late = list(zip(plan[-400:], decisions[-400:], strict=True))
    lost = [d.variant for c, d in late if c in sampled and d.role == "exploit"]
    assert sum(v == "none" for v in lost) >= 0.85 * len(lost), lost
    won = [sim.true_speedup(c, d.variant) for c, d in late if c in greedy and d.role == "exploit"]
    assert sum(s == 1.3 for s in won) >= 0.8 * len(won)


def test_a_parent_that_measured_only_losses_lends_no_speculation(
    tmp_path: Path, caps: Capabilities
) -> None:
    """A new class whose nearest parent measured every variant slower than baseline is
    served no speculation, not a farther ancestor's choice."""
    engine = make(tmp_path, config(explore_share=0.5, min_class_requests=2), caps)
    sim = SimUpstream(
        {
            "code/echo/greedy": {v: 1.3 for v in engine.variants},
            "text/fresh/greedy": {v: 0.8 for v in engine.variants},
        }
    )
    drive(engine, sim, ["code/echo/greedy", "text/fresh/greedy"] * 150)
    assert engine.classes["all"].policy is not None and engine.classes["all"].policy.speculation
    text = engine.classes["text/fresh"].policy
    assert text is not None and not text.speculation and text.settled, text
    assert "every variant tried is slower" in text.reason or text.kill_switch
    decision = engine.route("text/fresh/sampled")  # brand new: no evidence of its own
    assert decision.variant == "none", decision


TEXT = "text/echo/greedy"


class _SharedPrompts(SimUpstream):
    """Counts where the prompt, more than the variant, decides what is accepted: each
    request copies ``share`` of what it could (drawn per request), and a variant accepts
    ``quality[variant]`` of that. Replays of the same request see the same ``share``."""

    share = 1.0
    quality: dict[str, float] = {}  # noqa: RUF012

    def counts(self, class_key: str, variant: str, n: int = 64) -> tuple[int, int, float]:
        drafted = 40
        mean = drafted * self.share * self.quality[variant]
        accepted = min(drafted, max(0, round(mean + self.rng.gauss(0.0, 1.0))))
        return drafted, accepted, n / (n - accepted + self.cost * drafted)


@pytest.mark.parametrize(("draft_step", "expected"), [(0.0, 0.2), (0.3, 0.5)])
def test_a_drafted_tokens_cost_before_any_request_is_the_verify_guess(
    tmp_path: Path, caps: Capabilities, draft_step: float, expected: float
) -> None:
    """Every variant's cost starts at the verify curve's extra time per drafted token (here
    0.2 a token), plus a draft model's own step, and a restart's rebuilt calibration starts
    from the same prior."""
    cost = CostModel(verify=lambda n: 1.0 + 0.2 * (n - 1))
    engine = make(tmp_path, config(), caps, cost=cost, draft_step=draft_step)
    prior = pytest.approx(expected), pytest.approx(0.25)
    assert (engine.costfit.prior, engine.costfit.prior_se) == prior
    name = next(n for n in engine.variants if n != "none")
    assert engine.pricing.costs([name])[name] == prior  # nothing served yet: the prior alone
    engine.restore({})
    assert (engine.costfit.prior, engine.costfit.prior_se) == prior


def test_a_class_counts_its_prompts_turns_and_load(tmp_path: Path, caps: Capabilities) -> None:
    """Every answered request adds what the server's cache held and what it processed (and
    how long that took), how its conversation's turn was routed, and the load it met (in
    flight as it arrived, its wait at the gate, a join) to its class, kept across a restart
    and shown by the report."""
    from tuner.records import RequestRecord, Timings
    from tuner.report.data import build_report

    engine = make(tmp_path, config(), caps)
    turns = [  # cached, processed, ms; its turn, role, in flight, wait at the gate (ms), batch
        (0, 1400, 2800.0, "new", "exploit", 1, 0.01, 1),
        (1380, 40, 80.0, "stayed", "trial", 3, 900.0, 1),
        (0, 1500, 3000.0, "moved:pays", "joined", 2, 0.02, 2),
    ]
    for i, (cached, processed, ms, session, role, active, wait_ms, batch) in enumerate(turns):
        timings = {"cache_n": cached, "prompt_n": processed, "prompt_ms": ms}
        engine.observe(
            RequestRecord(
                id=f"r{i}",
                ts=float(i),
                endpoint="/v1/chat/completions",
                stream=False,
                status=200,
                proxy_ms=1.0,
                timings=Timings.model_validate({**timings, "predicted_n": 64}),
                class_key=CODE,
                variant="none",
                session=session,
                role=role,
                active=active,
                wait_ms=wait_ms,
                batch=batch,
            )
        )
    state = engine.state(CODE)
    assert (state.prompt_cached, state.prompt_processed) == (1380, 2940)
    assert state.prompt_s == pytest.approx(5.88)
    restored = make(tmp_path / "again", config(), caps)
    restored.restore(json.loads(json.dumps(engine.snapshot())))
    again = restored.state(CODE)
    assert again.prompt_processed == 2940
    assert (again.stayed, again.moved, again.turn_trials) == (1, {"pays": 1}, 1)
    assert again.load == state.load and again.load.mean_in_flight == 2.0
    assert (again.load.waited, again.load.wait_s, again.load.joined) == (1, 0.9, 1)
    document = {"version": 2, "classes": restored.snapshot()}
    row = next(r for r in build_report(document).classes if r.class_key == CODE)
    assert (row.prompt_cached, row.prompt_processed) == (1380, 2940)
    assert row.prompt_tok_s == pytest.approx(500.0)
    assert (row.turns_stayed, row.turns_trials) == (1, 1)
    assert (row.in_flight, row.busiest, row.gate_waited, row.gate_joined) == (2.0, 3, 1, 1)
    assert (row.batch, row.widest) == (pytest.approx(4 / 3), 2)
    assert row.gate_wait_s == pytest.approx(0.9)
