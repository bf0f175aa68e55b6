"""What else the machine did while a bench ran: CPU time spent outside the bench, and steal.

Ratios measured side by side in one run compare even when the machine is busy (every arm
shares the slowdown), but absolute speeds do not, and a busy spell that hits one part of
the run more than another blurs the early-against-late readings. So the bench samples the
machine's CPU counters as it goes and records, in ``run.json`` (and so in ``summary.json``):

- ``other_share``: CPU time used by processes outside the bench (not the bench itself, its
  llama-servers or its daemons), as a share of the machine's capacity (wall time x cores);
- ``steal_share``: time the hypervisor gave this virtual machine's cores to someone else;
- both again per quarter of the run's wall time, and the worst sampling interval.

Taking a sample is IO (``sample``); turning samples into those shares is pure (``load``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import psutil

__all__ = ["CpuSample", "load", "sample"]

QUARTERS = 4


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU counters at one moment, all in seconds.

    ``busy_s``, ``steal_s`` and ``total_s`` are the machine's, summed over its cores;
    ``own_s`` is the bench's: this process and every process under it.
    """

    at: float
    busy_s: float
    steal_s: float
    total_s: float
    own_s: float


def _tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and its descendants, including children they have reaped."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # gone since it was listed: its time is in its parent's children_*
        total += t.user + t.system + t.children_user + t.children_system
    return total


def sample(root: psutil.Process | None = None) -> CpuSample:
    """The machine's and the bench's CPU counters now (``root``: this process)."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    steal = getattr(t, "steal", 0.0)
    busy = t.user + t.system + sum(getattr(t, f, 0.0) for f in ("nice", "irq", "softirq"))
    return CpuSample(
        at=time.monotonic(),
        busy_s=busy,
        steal_s=steal,
        total_s=busy + idle + steal,
        own_s=_tree_cpu_s(root or psutil.Process()),
    )


def _shares(first: CpuSample, last: CpuSample, cores: int) -> tuple[float, float]:
    """(other_share, steal_share) between two samples."""
    wall = last.at - first.at
    if wall <= 0 or cores <= 0:
        return 0.0, 0.0
    other = (last.busy_s - first.busy_s) - (last.own_s - first.own_s)
    total = last.total_s - first.total_s
    steal = (last.steal_s - first.steal_s) / total if total > 0 else 0.0
    return max(0.0, other) / (wall * cores), max(0.0, steal)


def load(samples: Sequence[CpuSample], cores: int) -> dict[str, Any]:
    """What else used the machine between the first and the last sample.

    >>> a = CpuSample(at=0.0, busy_s=0.0, steal_s=0.0, total_s=0.0, own_s=0.0)
    >>> b = CpuSample(at=10.0, busy_s=15.0, steal_s=1.0, total_s=20.0, own_s=12.0)
    >>> load([a, b], cores=2)["other_share"]  # 3 CPU-s of 20
    0.15
    """
    if len(samples) < 2:
        return {"seconds": 0.0, "cores": cores, "samples": len(samples)}
    ordered = sorted(samples, key=lambda s: s.at)
    first, last = ordered[0], ordered[-1]
    other, steal = _shares(first, last, cores)
    span = last.at - first.at
    # each quarter spans its first interval's start to its last interval's end (in order)
    spans: list[tuple[CpuSample, CpuSample] | None] = [None] * QUARTERS
    worst = 0.0
    for a, b in pairwise(ordered):
        worst = max(worst, _shares(a, b, cores)[0])
        middle = ((a.at + b.at) / 2 - first.at) / span if span > 0 else 0.0
        k = min(QUARTERS - 1, int(middle * QUARTERS))
        spans[k] = (spans[k] or (a, b))[0], b
    by_quarter = [None if q is None else _shares(*q, cores) for q in spans]
    return {
        "seconds": round(span, 1),
        "cores": cores,
        "samples": len(ordered),
        "own_cpu_s": round(last.own_s - first.own_s, 1),
        "other_cpu_s": round(other * span * cores, 1),
        "other_share": round(other, 4),
        "steal_share": round(steal, 4),
        "other_share_by_quarter": [None if q is None else round(q[0], 4) for q in by_quarter],
        "steal_share_by_quarter": [None if q is None else round(q[1], 4) for q in by_quarter],
        "worst_interval_other_share": round(worst, 4),
    }
