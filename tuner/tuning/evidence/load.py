"""The load a class's requests met: how many requests were in flight as each arrived (in all,
and of its variant as it was sent: the batch its instance decoded it in), how long they
waited at the CPU gate for another variant's requests, and how many joined the variant
decoding rather than wait (``tuner.tuning.pricing.waiting``).

Kept per class beside its evidence and persisted with it (``LoadRecord``), for
``tuner report``; ``/metrics`` has the same as histograms over all requests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pydantic import BaseModel, ConfigDict, NonNegativeFloat, NonNegativeInt

__all__ = ["Load", "LoadRecord"]


class LoadRecord(BaseModel):
    """``Load`` as the policy file stores it (absent from files written before it)."""

    model_config = ConfigDict(extra="forbid")

    requests: NonNegativeInt = 0
    in_flight: NonNegativeInt = 0
    busiest: NonNegativeInt = 0
    waited: NonNegativeInt = 0
    wait_s: NonNegativeFloat = 0.0
    joined: NonNegativeInt = 0
    sent: NonNegativeInt = 0
    batch: NonNegativeInt = 0
    widest: NonNegativeInt = 0


@dataclass(slots=True)
class Load:
    requests: int = 0  # requests that arrived with a count of those in flight
    in_flight: int = 0  # the sum of those counts, each itself included
    busiest: int = 0  # the most in flight at once as one arrived
    waited: int = 0  # requests that waited at the gate
    wait_s: float = 0.0  # ... and how long in all
    joined: int = 0  # served by the variant decoding now rather than wait for the class's
    sent: int = 0  # requests sent with a count of their variant's in flight
    batch: int = 0  # the sum of those counts, each itself included
    widest: int = 0  # the most of one variant in flight as one was sent

    def count(
        self, active: int | None, wait_ms: float | None, role: str | None, batch: int | None
    ) -> None:
        """One answered request: those in flight as it arrived, its wait at the gate (ms;
        none without a gate), its routing role and its variant's in flight as it was sent.

        >>> load = Load()
        >>> load.count(3, 1200.0, "exploit", 2); load.count(1, 0.0, "joined", 3)
        >>> load.mean_in_flight, load.waited, load.wait_s, load.joined, load.batch, load.widest
        (2.0, 1, 1.2, 1, 5, 3)
        """
        if active is not None:
            self.requests += 1
            self.in_flight += active
            self.busiest = max(self.busiest, active)
        if wait_ms is not None and wait_ms >= 1.0:  # admitted at once costs microseconds
            self.waited += 1
            self.wait_s += wait_ms / 1000
        self.joined += role == "joined"
        if batch is not None:
            self.sent += 1
            self.batch += batch
            self.widest = max(self.widest, batch)

    @property
    def mean_in_flight(self) -> float | None:
        return self.in_flight / self.requests if self.requests else None

    def copy(self) -> Load:
        return replace(self)

    def record(self) -> LoadRecord:
        return LoadRecord(**{**asdict(self), "wait_s": round(self.wait_s, 3)})

    @classmethod
    def of(cls, record: LoadRecord) -> Load:
        return cls(**record.model_dump())
