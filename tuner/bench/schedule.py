"""The order of a bench run: the tuner's request stream with the static matrix spread through it.

- The tuner arm sees the workload as live traffic: every item once per cycle, each
  cycle shuffled, cycles repeated until ``requests`` are reached.
- The matrix (no speculation and every static variant) measures each item ``repeats``
  times per arm. The arms of one item run back to back in a shuffled order (so the
  per-item ratios come from one moment), and these blocks are spread evenly through
  the tuner's stream (so slow machine drift touches every arm alike).
- A challenger (a second tuner, other tuning settings) gets the tuner's own stream: each
  tuner request is paired with the challenger's request of the same item, the two back
  to back in a random order, so the two tuners are compared side by side in one run.

Pure: the same arguments and seed give the same schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CHALLENGER", "TUNER", "Step", "schedule"]

TUNER = "tuner"
CHALLENGER = "challenger"


@dataclass(frozen=True, slots=True)
class Step:
    """One request of the run: which arm serves which workload item."""

    arm: str  # TUNER, CHALLENGER, or a static variant name ("none" is the baseline)
    item: int  # index into the workload
    repeat: int  # the tuner's position in its stream; the matrix's repetition


def tuner_stream(n_items: int, requests: int, rng: random.Random) -> list[int]:
    """Items in the order the tuner sees them: shuffled cycles over the workload."""
    stream: list[int] = []
    while n_items and len(stream) < requests:
        cycle = list(range(n_items))
        rng.shuffle(cycle)
        stream += cycle
    return stream[:requests]


def schedule(
    n_items: int,
    arms: Sequence[str],
    *,
    requests: int,
    repeats: int,
    seed: int,
    challenger: bool = False,
    baseline: int = 1,
) -> list[Step]:
    """Every request of a bench run, in the order to send them (with a challenger, the same
    schedule plus its requests: the rest does not move). ``baseline``: how often each block
    measures the first arm (no speculation, the denominator of every ratio), its
    measurements shuffled among the other arms'.

    >>> steps = schedule(3, ["none", "v"], requests=4, repeats=1, seed=0)
    >>> sum(s.arm == TUNER for s in steps), sum(s.arm != TUNER for s in steps)
    (4, 6)
    """
    rng = random.Random(seed)
    stream = tuner_stream(n_items, requests, rng)
    blocks: list[list[Step]] = []
    for repeat in range(repeats):
        for item in range(n_items):
            order = [*arms, *list(arms[:1]) * (baseline - 1)]
            rng.shuffle(order)
            blocks.append([Step(arm, item, repeat) for arm in order])
    rng.shuffle(blocks)
    if not stream:
        return [step for block in blocks for step in block]
    out: list[Step] = []
    coin = random.Random(seed + 1)  # its own: the schedule without a challenger is unchanged
    for k, item in enumerate(stream):
        pair = [Step(TUNER, item, k)]
        if challenger:
            pair.append(Step(CHALLENGER, item, k))
            coin.shuffle(pair)
        out += pair
        start, end = k * len(blocks) // len(stream), (k + 1) * len(blocks) // len(stream)
        for block in blocks[start:end]:
            out += block
    return out
