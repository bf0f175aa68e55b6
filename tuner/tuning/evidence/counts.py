"""A request's counts, and speedups and acceptance from them with their intervals. Pure.

A speculative request that generated ``n`` tokens, drafted ``d`` and had ``a`` of them
accepted ran ``n - a`` target steps and verified ``d`` extra tokens. Priced in plain
decode steps, it took ``n - a + c * d`` where ``c`` is what one drafted token costs
(drafting plus verifying it), so its speedup over no speculation is::

    n / (n - a + c * d)

The counts come from llama-server's ``timings`` and carry no timing noise (greedy
decoding repeats them exactly), and the formula needs no baseline request on the same
prompt. What it needs is ``c`` per variant: a property of the model, the machine and
the variant more than of the prompt, so it is calibrated on every class's requests
pooled (``tuner.tuning.pricing.costfit``), from each request's decode time against
one plain step's time. A trial judged this way compares variants by what they accept on the class's
prompts, not by a ratio of two small samples of wall-clock speeds on different prompts
(docs/tuning.md has the measurements behind this choice).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, NamedTuple

from pydantic import BeforeValidator

from tuner.stats import Interval

__all__ = [
    "Counts",
    "StoredCounts",
    "alpha_interval",
    "count_speedup",
    "log_interval",
    "parse_counts",
    "ratio_of_sums",
    "ratio_se",
    "served_counts",
]

MIN_REL = 0.01  # the narrowest relative half-width an interval gets (model error)


class Counts(NamedTuple):
    """One request's counts, as llama-server's ``timings`` report them."""

    tokens: int  # generated
    drafted: int
    accepted: int


def parse_counts(value: object) -> Counts:
    """Counts read back from JSON (a policy file, a fleet event) as ``[tokens, drafted,
    accepted]``: three integers, none negative, no more accepted than drafted; raises
    ValueError on anything else. The one parser of stored counts.

    >>> parse_counts([64, 20, 12])
    Counts(tokens=64, drafted=20, accepted=12)
    >>> parse_counts([64, 2, 3])
    Traceback (most recent call last):
    ...
    ValueError: counts [64, 2, 3]: more accepted than drafted
    """
    if not isinstance(value, list | tuple) or len(value) != 3:
        raise ValueError(f"counts {value!r}: not [tokens, drafted, accepted]")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value):
        raise ValueError(f"counts {value!r}: not three integers of at least 0")
    counts = Counts(*value)
    if counts.accepted > counts.drafted:
        raise ValueError(f"counts {value!r}: more accepted than drafted")
    return counts


# a field of stored counts (a policy file's, a fleet event's), checked by ``parse_counts``
StoredCounts = Annotated[Counts, BeforeValidator(parse_counts)]


def served_counts(tokens: int, drafted: int | None, accepted: int | None) -> Counts:
    """A request's counts from the server's ``timings``: nothing drafted where it says
    nothing, and never more accepted than drafted (stored counts are checked so).

    >>> served_counts(64, None, None), served_counts(64, 2, 3)
    (Counts(tokens=64, drafted=0, accepted=0), Counts(tokens=64, drafted=2, accepted=2))
    """
    drafted = drafted or 0
    return Counts(tokens, drafted, min(accepted or 0, drafted))


def ratio_of_sums(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """``sum(x) / sum(y)`` over paired values and its standard error (delta method).

    >>> r, se = ratio_of_sums([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    >>> r, se
    (2.0, 0.0)
    """
    n, sx, sy = len(x), math.fsum(x), math.fsum(y)
    if n == 0 or sy <= 0:
        raise ValueError("ratio_of_sums needs values with a positive sum of y")
    r = sx / sy
    if n < 2:
        return r, math.inf
    return r, ratio_se(math.fsum((a - r * b) ** 2 for a, b in zip(x, y, strict=True)), n, sy)


def ratio_se(resid: float, n: int, sum_y: float) -> float:
    """Standard error of ``sum x / sum y`` from ``sum (x - r y)^2`` over ``n >= 2`` pairs."""
    return math.sqrt(resid / (n * (n - 1))) / (sum_y / n)


def count_speedup(counts: Sequence[Counts], c: float, c_se: float, z: float) -> Interval | None:
    """The speedup of requests over no speculation from their counts, with an interval.

    Token-weighted (``sum n / sum (n - a + c d)``, as total decode time would be); the
    interval covers the spread between the requests and the uncertainty of ``c``.

    >>> s = count_speedup([(100, 100, 80), (100, 100, 80)], 0.5, 0.0, 1.64)
    >>> round(s.value, 3), s.low < s.value < s.high
    (1.429, True)
    >>> count_speedup([(100, 0, 0)], 0.5, 0.1, 1.64).value
    1.0
    """
    rows = [(n, d, a) for n, d, a in counts if n > 0]
    if not rows:
        return None
    work = [n - a + c * d for n, d, a in rows]
    if min(work) <= 0:
        return None
    r, se = ratio_of_sums([float(n) for n, _, _ in rows], work)
    drafted = math.fsum(float(d) for _, d, _ in rows)
    return log_interval(r, se, c_se * drafted / math.fsum(work), z)  # d log r / d c


def log_interval(r: float, se: float, rel_c: float, z: float) -> Interval:
    """A ratio of sums ``r`` (standard error ``se`` from the spread between requests) with
    a cost's relative error ``rel_c``: symmetric in log, never narrower than ``MIN_REL``.

    >>> s = log_interval(2.0, 0.0, 0.0, 1.0)
    >>> round(s.low * s.high, 6), round(s.high / s.value, 4)
    (4.0, 1.0101)
    """
    rel = math.hypot(se / r if math.isfinite(se) else 1.0, rel_c, MIN_REL)
    return Interval(r, r * math.exp(-z * rel), r * math.exp(z * rel))


def alpha_interval(counts: Sequence[Counts], z: float) -> Interval | None:
    """Acceptance over requests, with an interval from
    the spread between requests (a prompt's drafts are accepted or not together, so a
    binomial interval over all drafted tokens is far too narrow); None without two
    requests that drafted.

    >>> rows = [Counts(20, 10, 8), Counts(20, 10, 6), Counts(20, 0, 0), Counts(20, 10, 7)]
    >>> a = alpha_interval(rows, 1.64)
    >>> round(a.value, 2), a.low < 0.7 < a.high
    (0.7, True)
    """
    rows = [(float(c.accepted), float(c.drafted)) for c in counts if c.drafted > 0]
    if len(rows) < 2:
        return None
    r, se = ratio_of_sums([a for a, _ in rows], [d for _, d in rows])
    return Interval(r, max(0.0, r - z * se), min(1.0, r + z * se))
