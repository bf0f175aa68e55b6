"""Prometheus collectors for the tuner, read when ``GET /metrics`` is scraped.

tuner_class_speedup{class_key,variant}        measured speedup of the chosen variant
tuner_class_alpha{class_key,variant}          its acceptance
tuner_class_speculation{class_key,variant}    1 when the class's policy speculates
tuner_class_kill_switch{class_key}            1 when speculation is off because it cannot pay
tuner_class_exploration_share{class_key}      share spent on trials, controls, held turns
tuner_class_exploration_cost{class_key}       what exploring cost, in requests
tuner_class_trials_total{class_key}, tuner_policy_switches_total{class_key}
tuner_variant_quarantined{variant,reason}     1 while a variant that failed is left out
tuner_counterfactual_replays_total{outcome}   requests replayed through n-gram variants
tuner_counterfactual_checked_total, tuner_counterfactual_agreed_total
                                              replays of the served variant, and those that
                                              gave the server's drafted/accepted counts
tuner_counterfactual_mod_accepted_total{source}  on requests an ngram-mod variant served:
                                              accepted tokens simulated and served
tuner_counterfactual_offered_total, tuner_counterfactual_pending
                                              answered requests offered for replay, and
                                              replays queued or running
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.tuning.replay.worker import Replayer
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.runtime.quarantine import Quarantine

__all__ = ["ReplayCollector", "TuningCollector"]


class TuningCollector(Collector):
    """Per-class decisions of the tuning engine, read when Prometheus scrapes."""

    def __init__(self, engine: Engine, quarantine: Quarantine | None = None) -> None:
        self.engine = engine
        self.quarantine = quarantine or Quarantine()

    def collect(self) -> Iterator[Metric]:
        speedup = GaugeMetricFamily(
            "tuner_class_speedup",
            "Measured speedup of the class's chosen variant over baseline",
            labels=["class_key", "variant"],
        )
        alpha = GaugeMetricFamily(
            "tuner_class_alpha", "Acceptance of the chosen variant", labels=["class_key", "variant"]
        )
        speculation = GaugeMetricFamily(
            "tuner_class_speculation",
            "1 when the class's policy speculates",
            labels=["class_key", "variant"],
        )
        kill = GaugeMetricFamily(
            "tuner_class_kill_switch",
            "1 when speculation is off because it cannot pay",
            labels=["class_key"],
        )
        share = GaugeMetricFamily(
            "tuner_class_exploration_share",
            "Share of the class's requests spent on trials, controls and conversations' turns"
            " held off the class's choice",
            labels=["class_key"],
        )
        cost = GaugeMetricFamily(
            "tuner_class_exploration_cost",
            "Decode time exploring cost the class, as a share of its "
            "requests at the speed of the policy serving it",
            labels=["class_key"],
        )
        trials = CounterMetricFamily(
            "tuner_class_trials", "Trials finished in the class", labels=["class_key"]
        )
        switches = CounterMetricFamily(
            "tuner_policy_switches", "Changes of a class's chosen variant", labels=["class_key"]
        )
        for state, policy in self.engine.summary():
            arm = [state.key, policy.variant]
            speculation.add_metric(arm, float(policy.speculation))
            if policy.speedup is not None:
                speedup.add_metric(arm, policy.speedup)
            if policy.alpha is not None:
                alpha.add_metric(arm, policy.alpha)
            kill.add_metric([state.key], float(policy.kill_switch))
            share.add_metric([state.key], state.explored / state.seen if state.seen else 0.0)
            cost.add_metric([state.key], max(state.spent, 0.0) / state.seen if state.seen else 0.0)
            trials.add_metric([state.key], state.trials_done)
            switches.add_metric([state.key], state.switches)
        held = GaugeMetricFamily(
            "tuner_variant_quarantined",
            "1 while a variant is out of routing and search because it failed on the server",
            labels=["variant", "reason"],
        )
        for name, entry in self.quarantine.describe().items():
            held.add_metric([name, str(entry["reason"])], 1.0)
        yield from (speedup, alpha, speculation, kill, share, cost, trials, switches, held)


class ReplayCollector(Collector):
    """Replayer replays (``tuner.tuning.replay.worker``), read when scraped."""

    def __init__(self, replayer: Replayer) -> None:
        self.replayer = replayer

    def collect(self) -> Iterator[Metric]:
        c = self.replayer
        done = CounterMetricFamily(
            "tuner_counterfactual_replays",
            "Answered requests replayed through the "
            "n-gram variants (ngram-simple, ngram-mod), by outcome",
            labels=["outcome"],
        )
        for outcome, value in (("done", c.done), ("dropped", c.dropped), ("failed", c.failed)):
            done.add_metric([outcome], value)
        yield done
        yield CounterMetricFamily(
            "tuner_counterfactual_checked",
            "Requests an ngram-simple variant served, replayed",
            value=c.checked,
        )
        yield CounterMetricFamily(
            "tuner_counterfactual_agreed",
            "... whose replay gave the server's drafted and accepted counts exactly",
            value=c.agreed,
        )
        mod = CounterMetricFamily(
            "tuner_counterfactual_mod_accepted",
            "Accepted draft tokens on requests an "
            "ngram-mod variant served: its simulation's estimate and the server's count",
            labels=["source"],
        )
        mod.add_metric(["simulated"], c.mod_simulated)
        mod.add_metric(["served"], c.mod_served)
        yield mod
        # offered before pending: a reader that sees an offer sees its job (``submit``)
        yield CounterMetricFamily(
            "tuner_counterfactual_offered",
            "Answered requests offered for replay (taken or not)",
            value=c.offered,
        )
        yield GaugeMetricFamily(
            "tuner_counterfactual_pending", "Replays queued or running", value=c.pending
        )
