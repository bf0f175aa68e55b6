"""What a drafted token costs by how long a variant's rounds may be. Pure.

One round of speculation verifies its drafts in one batch: part of what the round costs
comes once per round, the rest per drafted token, so a variant that may draft long rounds
(``ngram-mod`` to 64 tokens) pays less per drafted token than one capped at 16. Its own
served requests price each variant (``tuner.tuning.evidence.counts.CostFit``); before a
variant has served, the served variants' costs, fitted as ``c = s + j / L`` on their most
tokens per round ``L``, price it better than their plain average does (measured in
docs/benchmarks.md, "Pricing against time").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["MIN_DRAFTED", "by_length"]

MIN_DRAFTED = 64.0  # a served variant's drafted tokens before its cost joins the fit


def by_length(points: Sequence[tuple[int, float, float]]) -> Callable[[int], float] | None:
    """The cost at draft length ``L`` fitted on ``points`` (``L``, cost, drafted tokens:
    the weight) by weighted least squares on ``1 / L``; between the fitted lengths only (a
    length outside them gets the nearest one's cost, never an extrapolation). None without
    two lengths of at least ``MIN_DRAFTED`` drafted tokens each.

    >>> fit = by_length([(16, 0.45, 1000.0), (64, 0.36, 3000.0)])
    >>> [round(fit(n), 3) for n in (16, 32, 64, 8, 128)]
    [0.45, 0.39, 0.36, 0.45, 0.36]
    >>> by_length([(16, 0.45, 1000.0), (16, 0.40, 500.0)]) is None
    True
    """
    used = [(1.0 / n, c, w) for n, c, w in points if n > 0 and w >= MIN_DRAFTED]
    if len({x for x, _, _ in used}) < 2:
        return None
    total = sum(w for _, _, w in used)
    mean_x = sum(w * x for x, _, w in used) / total
    mean_c = sum(w * c for _, c, w in used) / total
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in used)
    slope = sum(w * (x - mean_x) * (c - mean_c) for x, c, w in used) / spread
    low, high = min(x for x, _, _ in used), max(x for x, _, _ in used)

    def cost(length: int) -> float:
        x = min(high, max(low, 1.0 / max(1, length)))
        return max(0.0, mean_c + slope * (x - mean_x))

    return cost
