"""Prometheus metrics for the daemon: ``GET /metrics``.

Request metrics are updated from each ``RequestRecord`` by a consumer of the records
(``RequestMetrics.observe``, ``tuner.consumers``), never on the request path; upstream
state is read at scrape time.
Names follow Prometheus conventions (``_total`` counters, base units in seconds).

    tuner_requests_total{endpoint,class_key,variant,status}
    tuner_generated_tokens_total{class_key,variant}
    tuner_prompt_tokens_total{class_key,variant}
    tuner_prompt_cached_tokens_total{class_key,variant}
    tuner_session_turns_total{class_key,outcome}  new, stayed, moved:<reason> (router mode)
    tuner_session_trials_total{class_key}         kept turns that ran a trial in place
    tuner_draft_tokens_total{class_key,variant}
    tuner_draft_accepted_tokens_total{class_key,variant}
    tuner_requests_abandoned_total{endpoint}      clients that hung up before their answer's end
    tuner_abandoned_tokens_total{endpoint}        tokens those generated (where the server said)
    tuner_request_duration_seconds{endpoint}      histogram: arrival to last byte
    tuner_proxy_overhead_seconds                  histogram: time added before the upstream send
    tuner_gate_wait_seconds{class_key}            histogram: waiting for another variant (CPU gate)
    tuner_gate_joins_total{class_key}             served by the variant decoding, not the class's
    tuner_active_requests                         histogram: requests in flight at arrival
    tuner_variant_batch_requests                  histogram: its variant's in flight as one is sent
    tuner_decode_tokens_per_second{class_key,variant}  histogram of llama-server's decode speed
    tuner_upstream_ready                          1 when llama-server answers /health
    tuner_upstream_restarts_total                 restarts of the managed llama-server
    tuner_records_dropped_total, tuner_record_write_errors_total
    tuner_record_consumer_dropped_total{consumer}  records a consumer's full queue dropped

The tuner's per-class and replay metrics are collectors of their own
(``tuner.tuning.runtime.collectors``), handed in at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.consumers import ConsumersCollector
from tuner.records import CLIENT_GONE, RecordStore, RequestRecord
from tuner.upstream.client import UpstreamClient

__all__ = ["Metrics", "RequestMetrics"]

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS_PER_S = (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)
_ACTIVE = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)  # the load levels agents bring


class _StateCollector(Collector):
    """Values owned by other objects, read when Prometheus scrapes."""

    def __init__(self, upstream: Callable[[], UpstreamClient], records: RecordStore) -> None:
        self.upstream = upstream  # the one serving now (a topology swap replaces it)
        self.records = records

    def collect(self) -> Iterator[Metric]:
        upstream = self.upstream()
        yield GaugeMetricFamily(
            "tuner_upstream_ready", "1 when llama-server answers /health", value=upstream.ready
        )
        yield CounterMetricFamily(
            "tuner_upstream_restarts",
            "Restarts of the managed llama-server",
            value=upstream.health.restarts,
        )
        yield CounterMetricFamily(
            "tuner_upstream_stalls",
            "Requests cut because their instance stopped answering (it is reloaded; "
            "those with nothing back yet are sent again without speculation)",
            value=upstream.health.stalls,
        )
        yield GaugeMetricFamily(
            "tuner_upstream_recovering",
            "Router presets reloaded after a stall that have not answered since",
            value=len(upstream.health.recovering_now()),
        )
        yield CounterMetricFamily(
            "tuner_records_dropped",
            "Request records dropped (queue full)",
            value=self.records.dropped,
        )
        yield CounterMetricFamily(
            "tuner_record_write_errors",
            "Failed writes of request records",
            value=self.records.write_errors,
        )


class RequestMetrics:
    """The per-request counters; ``observe`` takes one finished request (a consumer of the
    records)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        arm = ["class_key", "variant"]
        labels = ["endpoint", "class_key", "variant", "status"]
        self.requests = Counter("tuner_requests", "Requests proxied", labels, registry=r)
        self.generated = Counter("tuner_generated_tokens", "Tokens generated", arm, registry=r)
        self.prompt = Counter("tuner_prompt_tokens", "Prompt tokens processed", arm, registry=r)
        self.cached = Counter(
            "tuner_prompt_cached_tokens",
            "Prompt tokens the server's cache held, not processed again",
            arm,
            registry=r,
        )
        self.turns = Counter(
            "tuner_session_turns",
            "Requests by how routing treated their conversation: new, stayed on the instance"
            " holding its history, or moved (and why)",
            ["class_key", "outcome"],
            registry=r,
        )
        self.turn_trials = Counter(
            "tuner_session_trials",
            "Conversations' later turns that ran a trial on the instance holding their history",
            ["class_key"],
            registry=r,
        )
        self.abandoned = Counter(
            "tuner_requests_abandoned",
            "Requests whose client hung up before the answer's end (their generation is "
            "cancelled upstream)",
            ["endpoint"],
            registry=r,
        )
        self.abandoned_tokens = Counter(
            "tuner_abandoned_tokens",
            "Tokens generated for clients that hung up, where the server reported them",
            ["endpoint"],
            registry=r,
        )
        self.drafted = Counter("tuner_draft_tokens", "Tokens drafted", arm, registry=r)
        self.accepted = Counter(
            "tuner_draft_accepted_tokens", "Drafted tokens accepted", arm, registry=r
        )
        self.duration = Histogram(
            "tuner_request_duration_seconds",
            "Arrival to last byte handed back",
            ["endpoint"],
            buckets=_SECONDS,
            registry=r,
        )
        self.overhead = Histogram(
            "tuner_proxy_overhead_seconds",
            "Time the proxy spends before sending upstream",
            buckets=_SECONDS,
            registry=r,
        )
        self.waited = Histogram(
            "tuner_gate_wait_seconds",
            "Time a request waited for another variant's requests to finish (the CPU gate)",
            ["class_key"],
            buckets=_SECONDS,
            registry=r,
        )
        self.joins = Counter(
            "tuner_gate_joins",
            "Requests served by the variant decoding now rather than wait at the CPU gate for "
            "their class's (the wait cost more than the class's variant saves)",
            ["class_key"],
            registry=r,
        )
        self.active = Histogram(
            "tuner_active_requests",
            "Generation requests in flight as a request arrived, itself included",
            buckets=_ACTIVE,
            registry=r,
        )
        self.batch = Histogram(
            "tuner_variant_batch_requests",
            "Routed requests of one variant in flight as a request of it was sent (past the CPU "
            "gate), itself included: the batch its instance decoded it in",
            buckets=_ACTIVE,
            registry=r,
        )
        self.decode = Histogram(
            "tuner_decode_tokens_per_second",
            "llama-server's decode speed per request",
            arm,
            buckets=_TOKENS_PER_S,
            registry=r,
        )

    def observe(self, record: RequestRecord) -> None:
        arm = (record.class_key or "unknown", record.variant or "default")
        self.requests.labels(record.endpoint, *arm, str(record.status)).inc()
        self.duration.labels(record.endpoint).observe(record.proxy_ms / 1000)
        if record.overhead_ms is not None:
            self.overhead.observe(max(record.overhead_ms, 0.0) / 1000)
        if record.session is not None:
            self.turns.labels(arm[0], record.session).inc()
            if record.session == "stayed" and record.role == "trial":
                self.turn_trials.labels(arm[0]).inc()
        if record.wait_ms is not None:
            self.waited.labels(arm[0]).observe(record.wait_ms / 1000)
        if record.role == "joined":
            self.joins.labels(arm[0]).inc()
        if record.active is not None:
            self.active.observe(record.active)
        if record.batch is not None:
            self.batch.observe(record.batch)
        t = record.timings
        if record.error is not None and record.error.startswith(CLIENT_GONE):
            self.abandoned.labels(record.endpoint).inc()
            if t is not None:
                self.abandoned_tokens.labels(record.endpoint).inc(t.predicted_n or 0)
        if t is None:
            return
        self.generated.labels(*arm).inc(t.predicted_n or 0)
        self.prompt.labels(*arm).inc(t.prompt_n or 0)
        self.cached.labels(*arm).inc(t.cache_n or 0)
        self.drafted.labels(*arm).inc(t.draft_n or 0)
        self.accepted.labels(*arm).inc(t.draft_n_accepted or 0)
        if t.predicted_per_second:
            self.decode.labels(*arm).observe(t.predicted_per_second)


class Metrics:
    """The daemon's registry: the per-request counters, and what other objects own, read
    when Prometheus scrapes (upstream state, the records' queues, ``collectors``)."""

    def __init__(
        self,
        requests: RequestMetrics,
        upstream: Callable[[], UpstreamClient],
        records: RecordStore,
        collectors: Iterable[Collector] = (),
    ) -> None:
        self.requests = requests
        self.registry = requests.registry
        for collector in (
            _StateCollector(upstream, records),
            ConsumersCollector(records.consumers),
            *collectors,
        ):
            self.registry.register(collector)
