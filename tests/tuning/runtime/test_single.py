"""One variant loaded at a time: the traffic-weighted choice, the reload rule, windows."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.tuning.sim import CODE, PROSE, SimUpstream, config, make
from tuner.records import RequestRecord
from tuner.tuning.config import TuningConfig
from tuner.tuning.runtime.single import SingleVariant, switch_pays, traffic_gain
from tuner.upstream.capabilities import Capabilities

speedups = st.floats(min_value=0.3, max_value=3.0)
shares = st.floats(min_value=0.01, max_value=1.0)


@given(st.dictionaries(st.sampled_from("abcdef"), st.tuples(shares, speedups), min_size=1))
def test_traffic_gain_lies_between_the_classes(per_class: dict[str, tuple[float, float]]) -> None:
    weights = {c: w for c, (w, _) in per_class.items()}
    measured = {c: {"v": s} for c, (_, s) in per_class.items()}
    gain = traffic_gain(weights, measured, "v")
    values = [s for _, s in per_class.values()]
    assert min(values) - 1e-9 <= gain <= max(values) + 1e-9
    assert traffic_gain(weights, measured, "none") == 1.0


@given(speedups, speedups, st.floats(0.0, 1e4), st.floats(0.0, 100.0), st.floats(0.0, 1e4))
def test_a_switch_pays_more_with_more_load(
    current: float, best: float, busy: float, reload_s: float, more: float
) -> None:
    if switch_pays(current, best, busy, reload_s):
        assert best > current
        assert switch_pays(current, best, busy + more, reload_s)
    assert not switch_pays(best, best, busy + more, reload_s)


class Reloading:
    """The simulated upstream with one instance: a change of variant costs ``reload_s``
    before the first byte; time advances by each request's decoding and reloads."""

    def __init__(self, sim: SimUpstream, reload_s: float) -> None:
        self.sim, self.reload_s = sim, reload_s
        self.now, self.loaded, self.reloads = 0.0, "none", 0

    def clock(self) -> float:
        return self.now

    def answer(self, class_key: str, decision_variant: str, record: RequestRecord) -> RequestRecord:
        wait = 0.0
        if decision_variant != self.loaded:
            self.loaded, wait = decision_variant, self.reload_s
            self.reloads += 1
        assert record.timings is not None and record.timings.predicted_ms is not None
        self.now += wait + record.timings.predicted_ms / 1000 + 0.5  # and some idle time
        return record.model_copy(update={"ttfb_ms": 20.0 + 1000 * wait})


def run(single: SingleVariant, upstream: Reloading, plan: list[str]) -> list[str]:
    served = []
    for key in plan:
        decision = single.route(key)
        record = upstream.sim.answer(key, decision)
        single.observe(upstream.answer(key, decision.variant, record))
        served.append(decision.variant)
    return served


def by_type(variants: list[str]) -> dict[str, dict[str, float]]:
    """Code: every ngram-simple variant 1.45x, the rest 0.92x; prose: everything 0.85x."""
    code = {v: 1.45 if v.startswith("ngram-simple") else 0.92 for v in variants}
    return {CODE: code, PROSE: {v: 0.85 for v in variants}}


def mix(n: int, code_share: float, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [CODE if rng.random() < code_share else PROSE for _ in range(n)]


def single_config(share: float, budget_share: float = 0.01) -> TuningConfig:
    """The shipped tuning with this one-instance exploration share (and the per-class
    budget's ``budget_share``, which the one-instance controller must not use)."""
    base = config(explore_share=budget_share)
    single = base.single.model_copy(update={"explore_share": share})
    return base.model_copy(update={"single": single})


def reloading(
    tmp_path: Path, caps: Capabilities, reload_s: float, guess: float | None = None
) -> tuple[Reloading, SingleVariant]:
    """The by-type simulator behind a ``reload_s`` reload (``.sim``), and the one-variant
    controller on its clock (``.engine``; its reload guess: ``guess``, else the truth)."""
    engine = make(tmp_path, single_config(0.1), caps)
    sim = SimUpstream(by_type(list(engine.variants)))
    upstream = Reloading(sim, reload_s=reload_s)
    single = SingleVariant(engine, reload_s=guess or reload_s, clock=upstream.clock)
    return upstream, single


def test_serves_the_best_variant_over_the_traffic_mix(tmp_path: Path, caps: Capabilities) -> None:
    """70 % code (ngram-simple: 1.45x), 30 % prose (everything 0.85x): one variant for
    everyone, switched to once it is measured, with few reloads."""
    upstream, single = reloading(tmp_path, caps, 3.0, guess=10.0)
    engine, sim = single.engine, upstream.sim
    plan = mix(1500, 0.7)
    served = run(single, upstream, plan)

    assert sim.true_speedup(CODE, single.active) == 1.45, single.describe()
    gain = single.gains[single.active]
    assert 0.7 * 1.45 + 0.3 * 0.85 - 0.1 < gain < 0.7 * 1.45 + 0.3 * 0.85 + 0.1
    assert single.reload_measured and single.reload_s == pytest.approx(3.0, abs=0.5)
    assert single.explored <= 0.1 * single.seen + engine.config.single.window
    # reloads come in windows: far fewer than the exploring requests
    assert upstream.reloads <= 3 * single.candidates + single.switches + 1
    late = served[-300:]
    assert sum(v == single.active for v in late) >= 0.85 * len(late)


def test_stays_when_the_reload_costs_more_than_the_gain(tmp_path: Path, caps: Capabilities) -> None:
    upstream, single = reloading(tmp_path, caps, 2000.0)
    served = run(single, upstream, mix(800, 0.7))
    assert single.active == "none" and single.switches == 0
    # not even explored: a window's two reloads would cost more than 10 % of the decoding
    assert single.candidates == 0 and set(served) == {"none"} and upstream.reloads == 0


def test_switches_when_the_gain_repays_the_reload(tmp_path: Path, caps: Capabilities) -> None:
    """Where the code variant loses over the mix it explores and stays off; when the mix
    turns to code, the same evidence, re-weighted, makes the switch pay."""
    upstream, single = reloading(tmp_path, caps, 12.0)
    run(single, upstream, mix(1200, 0.15))  # gain 0.15 * 1.45 + 0.85 * 0.85 = 0.94
    assert single.candidates > 0 and single.active == "none", single.describe()
    run(single, upstream, mix(1200, 0.9, seed=4))  # the mix changes: gain about 1.39
    assert single.active.startswith("ngram-simple"), single.describe()


def test_stays_off_where_nothing_pays_over_the_mix(tmp_path: Path, caps: Capabilities) -> None:
    """10 % code, 90 % prose: the code variant's gain is outweighed by what prose loses."""
    upstream, single = reloading(tmp_path, caps, 1.0)
    served = run(single, upstream, mix(1200, 0.1))
    assert single.active == "none"
    late = served[-300:]
    assert sum(v == "none" for v in late) >= 0.85 * len(late)


def test_overrides_still_apply(tmp_path: Path, caps: Capabilities) -> None:
    from tuner.tuning.config import Override

    cfg = single_config(0.1)
    cfg = cfg.model_copy(
        update={
            "overrides": {"code": Override(pin="ngram-simple.n3.m16"), "prose": Override(off=True)}
        }
    )
    engine = make(tmp_path, cfg, caps)
    single = SingleVariant(engine, reload_s=1.0)
    assert single.route(CODE).variant == "ngram-simple.n3.m16"
    decision = single.route(PROSE)
    assert decision.variant == "none" and decision.role == "exploit"
    single.active = "ngram-cache"
    cfg = cfg.model_copy(update={"overrides": {"text": Override(forbid=("ngram-cache",))}})
    engine.reconfigure(cfg)
    assert single.route("text/fresh/greedy").variant == "none"  # forbidden there
    assert single.route("data/fresh/greedy").variant == "ngram-cache"
    assert "active" in single.state() and single.state()["switches"] == 0


@pytest.mark.parametrize(("share", "budget_share"), [(0.0, 0.5), (0.1, 0.0)])
def test_explores_on_its_own_share_not_the_class_budget(
    tmp_path: Path, caps: Capabilities, share: float, budget_share: float
) -> None:
    """Windows follow ``single.explore_share``: none at 0 however large the per-class
    budget, and some at 0.1 with the per-class budget at 0."""
    engine = make(tmp_path, single_config(share, budget_share), caps)
    upstream = Reloading(SimUpstream(by_type(list(engine.variants))), reload_s=1.0)
    single = SingleVariant(engine, reload_s=1.0, clock=upstream.clock)
    run(single, upstream, mix(600, 0.7))
    assert (single.candidates > 0) == (share > 0), single.describe()
    assert single.explored <= share * single.seen + engine.config.single.window


def test_a_trial_a_killed_process_left_running_is_failed(
    tmp_path: Path, caps: Capabilities
) -> None:
    """One variant at a time asks the root study through the same handle as the per-class
    search, so a window's trial left running by a crash is failed at its first ask."""
    from tuner.classify.classes import ROOT
    from tuner.tuning.search.studies import StudyBook

    engine = make(tmp_path, single_config(0.1), caps)
    assert engine.studies is not None
    space = engine.space(ROOT)
    StudyBook(tmp_path / "studies.db", "sim", seed=3).open(ROOT, space).next()  # then killed
    assert [r.state for r in engine.studies.history(ROOT)] == ["running"]
    single = SingleVariant(engine, reload_s=1.0)
    single._prepare()
    assert single.prepared is not None
    assert [r.state for r in engine.studies.history(ROOT)] == ["fail", "running"]
