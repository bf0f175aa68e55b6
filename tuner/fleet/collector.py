"""Prometheus view of the fleet's storage, read when ``GET /metrics`` is scraped.

tuner_fleet_storage_up                  1 while the shared database answers, else 0
tuner_fleet_storage_outages_total       times it stopped answering
tuner_fleet_events_pending              this daemon's evidence not yet written to it
tuner_fleet_events_written_total, tuner_fleet_events_absorbed_total
                                        events written, and other daemons' events taken in
tuner_fleet_events_dropped_total        events lost to a full outbox in a long outage
tuner_fleet_events_bad_total            rows read back that were not events (skipped)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tuner.fleet.sync import FleetSync

__all__ = ["FleetCollector"]


class FleetCollector(Collector):
    def __init__(self, fleet: FleetSync) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        f = self.fleet
        up = float(bool(f.up))
        yield GaugeMetricFamily(
            "tuner_fleet_storage_up", "1 while the fleet's database answers", value=up
        )
        yield CounterMetricFamily(
            "tuner_fleet_storage_outages",
            "Times the fleet's database stopped answering",
            value=f.outages,
        )
        yield GaugeMetricFamily(
            "tuner_fleet_events_pending",
            "Evidence events not yet written to the fleet's database",
            value=len(f.outbox),
        )
        for name, value, text in (
            ("written", f.written, "Evidence events written to the fleet's database"),
            ("absorbed", f.absorbed, "Other daemons' evidence events taken in"),
            ("dropped", f.dropped, "Evidence events dropped from a full outbox"),
            ("bad", f.bad, "Rows read from the fleet's database that were not events"),
        ):
            yield CounterMetricFamily(f"tuner_fleet_events_{name}", text, value=value)
