"""Batching: how many requests decode together, in the buckets the decision keeps apart,
and what a drafted token costs in each.

Where an instance batches (mainline's slots), concurrent requests share each step, and each
sequence's drafts lengthen the step all of them wait for: a drafted token costs more, in
each request's own steps, the more decode together (``batched_cost``). The counts a class
measured (what its variants draft and accept) do not depend on the load, so one class's
evidence prices every batch; only the cost moves, and it is fitted on requests that decoded
alone, over all classes. The buckets: 1, 2, 3-4 and 5 or more, from the four-client runs,
where three and four decoded at the same step time and two apart from both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tuner.model.speedup import CostModel, batched_cost, batched_curve

__all__ = ["BATCHES", "batch_of", "costs_in_batch", "model_in_batch"]

BATCHES = (1, 2, 4, 8)  # each bucket priced as this many decoding together


def batch_of(in_flight: int | None) -> int:
    """The bucket of a request that arrives with ``in_flight`` generation requests (itself
    included; None: not counted, taken as alone).

    >>> [batch_of(n) for n in (None, 1, 2, 3, 4, 5, 12)]
    [1, 1, 2, 4, 4, 8, 8]
    """
    if in_flight is None or in_flight <= 1:
        return 1
    return next((batch for batch in BATCHES if batch >= in_flight), BATCHES[-1])


def costs_in_batch(
    costs: Mapping[str, tuple[float, float]], batch: int
) -> dict[str, tuple[float, float]]:
    """Drafted-token costs (and their standard errors) fitted alone, in a ``batch``: the
    error scaled by how fast the batched cost moves with the cost alone.

    >>> [round(x, 3) for x in costs_in_batch({"v": (0.3, 0.1)}, 4)["v"]]
    [0.632, 0.111]
    """
    if batch <= 1:
        return dict(costs)
    out = {}
    for name, (c, se) in costs.items():
        slope = batch / (1.0 + (batch - 1) * c) ** 2 if 0.0 < c < 1.0 else 1.0
        out[name] = (batched_cost(c, batch), se * slope)
    return out


def model_in_batch(cost: CostModel, batch: int) -> CostModel:
    """The cost model of one sequence among ``batch`` decoding together (the prior's, before
    a drafted token's cost is measured)."""
    if batch <= 1:
        return cost
    return replace(cost, verify=batched_curve(cost.verify, batch))
