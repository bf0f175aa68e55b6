"""Close rivals of a class's held variant, and the race that serves them. Pure.

Replays price a variant a class never served at a drafted-token cost set by the others,
and that price can be 10-15 % off its time (``tuner.tuning.pricing.unserved``): a class
that never serves such a rival never learns it was faster. A rival is **unresolved** while
its optimistic price over the held variant (its interval on the same requests, widened by
that pricing error, which shrinks as the rival's own requests in the class price its cost)
lies above the held variant's. The class races the unresolved ones by Thompson sampling:
each request draws every rival's log price from that spread and serves the rival that
drew highest if it drew above the held variant. A rival that is probably slower is drawn
rarely, one probably faster often, so what the race spends follows the gain it may find;
and in all it gives its rivals at most ``cap`` of the class's requests, the square root of
its traffic (a regret that grows as a bandit's does; rivals still unresolved after that
are too close to matter, or share one bias that serving each would only pay for again and
again: every ``ngram-simple`` variant a class never served is priced at the cost of all
traffic, not at its class's). A rival that served
and is still clearly slower has **lost** and is not raced again until drift re-opens the
class. One that is faster moves the class through the guard.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from tuner.stats import Interval

__all__ = ["MIN_RACED", "TOP", "Rival", "cap", "draw", "judge", "may_race"]

TOP = 3  # rivals raced at once: the few whose optimistic price is highest
MIN_RACED = 4  # a rival's served requests in the class before it can have lost
# the pricing error weighs ``PRICED_BY / (PRICED_BY + served)``: as a variant's own cost
# is shrunk toward where it starts by four requests' worth (``Calibration``)
PRICED_BY = 4.0


@dataclass(frozen=True, slots=True)
class Rival:
    """A variant priced close enough to the held one that only serving it tells them apart."""

    name: str
    ratio: float  # its price over the held variant's
    sd: float  # of the log ratio: the comparison's own spread and the pricing error left
    served: int  # its requests in the class (served by the policy, a trial or the race)
    raced: int  # of those, served by the race


def cap(seen: int) -> int:
    """The most requests the race gives rivals in a class that has seen ``seen``.

    >>> cap(0), cap(30), cap(116), cap(10_000)
    (4, 6, 11, 100)
    """
    return max(MIN_RACED, math.ceil(math.sqrt(seen)))


def may_race(seen: int, raced: Mapping[str, int]) -> bool:
    """Whether a class's race may serve another request (``cap``).

    >>> may_race(116, {"a": 6, "b": 4}), may_race(116, {"a": 11})
    (True, False)
    """
    return sum(raced.values()) < cap(seen)


def judge(
    over_held: Mapping[str, Interval],
    served: Mapping[str, int],
    raced: Mapping[str, int],
    *,
    error: float,
    z: float,
    lost: Set[str],
) -> tuple[list[Rival], set[str]]:
    """The unresolved rivals, highest optimistic price first, and the rivals that lost
    now. ``over_held``: each variant's price over the held one, with its
    interval at ``z``; ``served`` / ``raced``: its requests in the class, all and by the
    race; ``error``: the pricing error of an unserved variant in log terms; ``lost``: those
    that lost before.

    >>> close, far = Interval(0.90, 0.88, 0.92), Interval(0.60, 0.58, 0.62)
    >>> found, gone = judge({"a": close, "b": far}, {}, {}, error=0.1, z=1.64, lost=set())
    >>> [r.name for r in found], gone
    (['a'], set())
    >>> judge({"a": close}, {"a": 40}, {"a": 6}, error=0.1, z=1.64, lost=set())
    ([], {'a'})
    """
    found: list[tuple[float, Rival]] = []
    gone: set[str] = set()
    for name, over in over_held.items():
        if name in lost or over.value <= 0 or over.low <= 0:
            continue
        own = math.log(over.high / over.low) / (2 * z)
        n = served.get(name, 0)
        sd = math.hypot(own, error * PRICED_BY / (PRICED_BY + n))
        optimistic = math.log(over.value) + z * sd
        if optimistic <= 0:
            if n >= MIN_RACED:
                gone.add(name)  # measured by its own requests, and still slower
            continue
        found.append((optimistic, Rival(name, over.value, sd, n, raced.get(name, 0))))
    found.sort(key=lambda pair: -pair[0])
    return [rival for _, rival in found], gone


def draw(rivals: Sequence[Rival], rng: random.Random) -> str | None:
    """Thompson sampling over the first ``TOP`` rivals: the one to serve this request, or
    None for the held variant.

    >>> sure = Rival("a", 1.5, 0.01, 0, 0)
    >>> draw([sure], random.Random(1)), draw([Rival("b", 0.5, 0.01, 0, 0)], random.Random(1))
    ('a', None)
    """
    best, top = None, 0.0  # the held variant draws its own price: 0 in log over itself
    for rival in rivals[:TOP]:
        x = rng.gauss(math.log(rival.ratio), rival.sd)
        if x > top:
            best, top = rival.name, x
    return best
