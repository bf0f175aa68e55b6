"""The order of a bench run: the tuner's request stream, each prompt's static arms beside it.

- The tuner arm sees the workload as live traffic: every item once per cycle, each
  cycle shuffled, cycles repeated until ``requests`` are reached.
- The matrix (no speculation and every static variant) measures each item ``repeats``
  times per arm. The arms of one item run back to back in a shuffled order (so the
  per-item ratios come from one moment), and each such block runs right beside a tuner
  request of the same item (before or after it, at random): the item's j-th block beside
  an occurrence drawn from the j-th of ``repeats`` equal stretches of the item's
  occurrences in the stream. So the tuner's request and the static arms' requests of a
  prompt are seconds apart, and the machine's drift (on a 2-core VM its decode speed moved
  by a third within a run) drops out of every per-prompt ratio instead of only on average;
  a stateful drafter's table in a static arm also sees the prompts in the tuner's order.
  Blocks beyond an item's occurrences (more repeats than the stream meets it) are spread
  evenly through the stream.
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
    place = random.Random(seed + 2)  # its own: the challenger's coin stays as it was
    beside, rest = _beside(stream, blocks, repeats, place)
    rng.shuffle(rest)
    if not stream:
        return [step for block in rest for step in block]
    out: list[Step] = []
    coin = random.Random(seed + 1)  # its own: the schedule without a challenger is unchanged
    for k, item in enumerate(stream):
        pair = [Step(TUNER, item, k)]
        if challenger:
            pair.append(Step(CHALLENGER, item, k))
            coin.shuffle(pair)
        mine = [step for block in beside.get(k, []) for step in block]
        out += [*mine, *pair] if place.random() < 0.5 else [*pair, *mine]
        start, end = k * len(rest) // len(stream), (k + 1) * len(rest) // len(stream)
        for block in rest[start:end]:
            out += block
    return out


def _beside(
    stream: Sequence[int], blocks: Sequence[list[Step]], repeats: int, rng: random.Random
) -> tuple[dict[int, list[list[Step]]], list[list[Step]]]:
    """Which stream position each matrix block runs beside (the item's j-th block at an
    occurrence drawn from the j-th of ``repeats`` stretches of its occurrences), and the
    blocks of items the stream meets too rarely or not at all."""
    where: dict[int, list[int]] = {}
    for k, item in enumerate(stream):
        where.setdefault(item, []).append(k)
    beside: dict[int, list[list[Step]]] = {}
    rest: list[list[Step]] = []
    for block in blocks:
        item, j = block[0].item, block[0].repeat
        seen = where.get(item, [])
        lo, hi = j * len(seen) // repeats, (j + 1) * len(seen) // repeats
        if hi <= lo:
            rest.append(block)
            continue
        beside.setdefault(seen[rng.randrange(lo, hi)], []).append(block)
    return beside, rest
