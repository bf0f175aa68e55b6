"""Prometheus metrics for the daemon: ``GET /metrics``.

Request metrics are updated from each ``RequestRecord`` in the record writer's
thread, never on the request path; upstream state is read at scrape time.
Names follow Prometheus conventions (``_total`` counters, base units in seconds).

    tuner_requests_total{endpoint,class_key,variant,status}
    tuner_generated_tokens_total{class_key,variant}
    tuner_prompt_tokens_total{class_key,variant}
    tuner_draft_tokens_total{class_key,variant}
    tuner_draft_accepted_tokens_total{class_key,variant}
    tuner_request_duration_seconds{endpoint}      histogram: arrival to last byte
    tuner_proxy_overhead_seconds                  histogram: time added before the upstream send
    tuner_decode_tokens_per_second{class_key,variant}  histogram of llama-server's decode speed
    tuner_upstream_ready                          1 when llama-server answers /health
    tuner_upstream_restarts_total                 restarts of the managed llama-server
    tuner_records_dropped_total, tuner_record_write_errors_total
    tuner_counterfactual_replays_total{outcome}   requests replayed through n-gram variants
    tuner_counterfactual_checked_total, tuner_counterfactual_agreed_total
                                                  replays of the served variant, and those that
                                                  gave the server's drafted/accepted counts
    tuner_counterfactual_mod_accepted_total{source}  on requests an ngram-mod variant served:
                                                  accepted tokens simulated and served
    tuner_counterfactual_offered_total, tuner_counterfactual_pending
                                                  answered requests offered for replay, and
                                                  replays queued or running
    tuner_counterfactual_warms_total, tuner_counterfactual_warm_seconds_total
                                                  prompt-only requests feeding answers to other
                                                  ngram-mod instances ([guard] warm_tables)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.records import RecordStore, RequestRecord
from tuner.tuning.counterfactual import Counterfactual
from tuner.tuning.engine import Engine
from tuner.upstream.client import UpstreamClient

__all__ = ["Metrics"]

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS_PER_S = (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)


class _StateCollector(Collector):
    """Values owned by other objects, read when Prometheus scrapes."""

    def __init__(self, upstream: UpstreamClient, records: RecordStore) -> None:
        self.upstream = upstream
        self.records = records

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "tuner_upstream_ready", "1 when llama-server answers /health", value=self.upstream.ready
        )
        yield CounterMetricFamily(
            "tuner_upstream_restarts", "Restarts of the managed llama-server",
            value=self.upstream.restarts,
        )  # fmt: skip
        yield CounterMetricFamily(
            "tuner_records_dropped", "Request records dropped (queue full)",
            value=self.records.dropped,
        )  # fmt: skip
        yield CounterMetricFamily(
            "tuner_record_write_errors", "Failed writes of request records",
            value=self.records.write_errors,
        )  # fmt: skip


class _TuningCollector(Collector):
    """Per-class decisions of the tuning engine, read when Prometheus scrapes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        speedup = GaugeMetricFamily("tuner_class_speedup",
                                    "Measured speedup of the class's chosen variant over baseline",
                                    labels=["class_key", "variant"])  # fmt: skip
        alpha = GaugeMetricFamily("tuner_class_alpha", "Acceptance of the chosen variant",
                                  labels=["class_key", "variant"])  # fmt: skip
        speculation = GaugeMetricFamily("tuner_class_speculation",
                                        "1 when the class's policy speculates",
                                        labels=["class_key", "variant"])  # fmt: skip
        kill = GaugeMetricFamily("tuner_class_kill_switch",
                                 "1 when speculation is off because it cannot pay",
                                 labels=["class_key"])  # fmt: skip
        share = GaugeMetricFamily("tuner_class_exploration_share",
                                  "Share of the class's requests spent on trials and controls",
                                  labels=["class_key"])  # fmt: skip
        cost = GaugeMetricFamily("tuner_class_exploration_cost",
                                 "Decode time exploring cost the class, as a share of its "
                                 "requests at the speed of the policy serving it",
                                 labels=["class_key"])  # fmt: skip
        trials = CounterMetricFamily("tuner_class_trials", "Trials finished in the class",
                                     labels=["class_key"])  # fmt: skip
        switches = CounterMetricFamily("tuner_policy_switches",
                                       "Changes of a class's chosen variant",
                                       labels=["class_key"])  # fmt: skip
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
        yield from (speedup, alpha, speculation, kill, share, cost, trials, switches)


class _CounterfactualCollector(Collector):
    """Counterfactual replays (``tuner.tuning.counterfactual``), read when scraped."""

    def __init__(self, replayer: Counterfactual) -> None:
        self.replayer = replayer

    def collect(self) -> Iterator[Metric]:
        c = self.replayer
        done = CounterMetricFamily(
            "tuner_counterfactual_replays", "Answered requests replayed through the "
            "n-gram variants (ngram-simple, ngram-mod), by outcome", labels=["outcome"],
        )  # fmt: skip
        for outcome, value in (("done", c.done), ("dropped", c.dropped), ("failed", c.failed)):
            done.add_metric([outcome], value)
        yield done
        yield CounterMetricFamily(
            "tuner_counterfactual_checked", "Requests an ngram-simple variant served, replayed",
            value=c.checked,
        )  # fmt: skip
        yield CounterMetricFamily(
            "tuner_counterfactual_agreed", "... whose replay gave the server's drafted and "
            "accepted counts exactly", value=c.agreed,
        )  # fmt: skip
        mod = CounterMetricFamily(
            "tuner_counterfactual_mod_accepted", "Accepted draft tokens on requests an "
            "ngram-mod variant served: its simulation's estimate and the server's count",
            labels=["source"],
        )  # fmt: skip
        mod.add_metric(["simulated"], c.mod_simulated)
        mod.add_metric(["served"], c.mod_served)
        yield mod
        # offered before pending: a reader that sees an offer sees its job (``submit``)
        yield CounterMetricFamily(
            "tuner_counterfactual_offered", "Answered requests offered for replay (taken or "
            "not)", value=c.offered,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "tuner_counterfactual_pending", "Replays queued or running", value=c.pending
        )
        yield CounterMetricFamily(
            "tuner_counterfactual_warms", "Prompt-only requests that fed an answer to an "
            "ngram-mod instance that did not serve it ([guard] warm_tables)", value=c.warms,
        )  # fmt: skip
        yield CounterMetricFamily(
            "tuner_counterfactual_warm_seconds", "... and the seconds they took",
            value=c.warm_seconds,
        )  # fmt: skip


class Metrics:
    """The daemon's metrics registry; ``observe`` takes one finished request."""

    def __init__(self, upstream: UpstreamClient, records: RecordStore) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        arm = ["class_key", "variant"]
        labels = ["endpoint", "class_key", "variant", "status"]
        self.requests = Counter("tuner_requests", "Requests proxied", labels, registry=r)
        self.replays = Counter(
            "tuner_replays",
            "Idle-time replays of sampled prompts (not in the other request metrics)",
            ["variant", "status"],
            registry=r,
        )
        self.generated = Counter("tuner_generated_tokens", "Tokens generated", arm, registry=r)
        self.prompt = Counter("tuner_prompt_tokens", "Prompt tokens processed", arm, registry=r)
        self.drafted = Counter("tuner_draft_tokens", "Tokens drafted", arm, registry=r)
        self.accepted = Counter(
            "tuner_draft_accepted_tokens", "Drafted tokens accepted", arm, registry=r
        )
        self.duration = Histogram("tuner_request_duration_seconds",
                                  "Arrival to last byte handed back", ["endpoint"],
                                  buckets=_SECONDS, registry=r)  # fmt: skip
        self.overhead = Histogram("tuner_proxy_overhead_seconds",
                                  "Time the proxy spends before sending upstream",
                                  buckets=_SECONDS, registry=r)  # fmt: skip
        self.decode = Histogram("tuner_decode_tokens_per_second",
                                "llama-server's decode speed per request", arm,
                                buckets=_TOKENS_PER_S, registry=r)  # fmt: skip
        r.register(_StateCollector(upstream, records))

    def watch_tuning(self, engine: Engine) -> None:
        """Expose the engine's per-class decisions as gauges."""
        self.registry.register(_TuningCollector(engine))

    def watch_counterfactual(self, replayer: Counterfactual) -> None:
        """Expose the counterfactual replays' counts and their agreement with the server."""
        self.registry.register(_CounterfactualCollector(replayer))

    def observe(self, record: RequestRecord) -> None:
        if record.replay:
            self.replays.labels(record.variant or "default", str(record.status)).inc()
            return
        arm = (record.class_key or "unknown", record.variant or "default")
        self.requests.labels(record.endpoint, *arm, str(record.status)).inc()
        self.duration.labels(record.endpoint).observe(record.proxy_ms / 1000)
        if record.overhead_ms is not None:
            self.overhead.observe(max(record.overhead_ms, 0.0) / 1000)
        t = record.timings
        if t is None:
            return
        self.generated.labels(*arm).inc(t.predicted_n or 0)
        self.prompt.labels(*arm).inc(t.prompt_n or 0)
        self.drafted.labels(*arm).inc(t.draft_n or 0)
        self.accepted.labels(*arm).inc(t.draft_n_accepted or 0)
        if t.predicted_per_second:
            self.decode.labels(*arm).observe(t.predicted_per_second)
