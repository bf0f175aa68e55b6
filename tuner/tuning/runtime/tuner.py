"""What the daemon's service and the proxy talk to: a ``Tuner``.

Two strategies implement it: the per-class engine (``engine.Engine``, where each
variant is an instance of its own, loaded beside the others) and the one-at-a-time tuner
(``single.SingleVariant``, where one instance fits and one variant serves all traffic). The
service is built with one of them and never asks which.
"""

from __future__ import annotations

from typing import Any, Protocol

from tuner.records import RequestRecord
from tuner.sessions.moves import Turn
from tuner.tuning.policy.guard import Decision
from tuner.tuning.pricing.waiting import Busy

__all__ = ["Tuner"]


class Tuner(Protocol):
    # whether a conversation's later turn is routed to where its history is cached (each
    # variant an instance of its own) and answered requests are replayed for evidence
    @property
    def per_class(self) -> bool: ...

    def route(
        self,
        class_key: str | None,
        turn: Turn | None = None,
        busy: Busy | None = None,
        *,
        opens: bool = False,
    ) -> Decision:
        """The variant for one request (the request path: reads state, never waits);
        ``turn``: a conversation's later turn; ``busy``: the CPU gate, where one is;
        ``opens``: it may open a conversation (no history held anywhere)."""
        ...

    def observe(self, record: RequestRecord) -> None:
        """One finished request, off the request path."""
        ...

    def reevaluate(self) -> None:
        """The periodic re-decision (drift; the one-at-a-time tuner's choice)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the policy file keeps of this tuner beside the classes' evidence."""
        ...
