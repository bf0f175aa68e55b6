"""What one drafted token cost, per variant, in a bench run: the counts model's ``c``, measured.

The tuner prices a request that generated ``n`` tokens, drafted ``d`` and had ``a``
accepted at ``n - a + c d`` plain decode steps (``tuner.tuning.counts``). Here each
speculative request that drafted is priced against its prompt's mean decode speed without
speculation (the ``none`` arm): its decode time in plain steps of that prompt, less its
``n - a`` target steps, is what its ``d`` drafted tokens cost; summed per variant (over
the static arms and, separately, the daemons' requests) and per spec type, ``c`` is that
sum over the drafted tokens, and per spec type within each class of prompts (an
``ngram-simple`` lookup scans the whole context each round, so its cost depends on the
prompts: why ``[guard] class_cost`` exists). ``drafted_per_step`` is ``d / (n - a)``: how
long the drafts that variant made were, per target step. ``request:first`` and
``request:later`` split each arm's requests by whether it was the first that arm sent to that
variant (the file's order is the order they ran): a preset's llama-server instance loads on
its first request, and that request decodes slower.

A per-variant ``c`` that differs by spec type is why ``[guard] cost_pool = "spec_type"``
exists: a variant that has served little priced like its own spec type, not like the pooled
cost of whatever served most (off by default: measured no better side by side).

    python -m benchmarks.drafted_cost DIR [--out FILE.json]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from benchmarks.common import run_main, usable
from benchmarks.exploration_cost import DAEMONS, baselines


class _Sums:
    __slots__ = ("drafted", "extra", "requests", "steps")

    def __init__(self) -> None:
        self.requests = 0
        self.extra = self.drafted = self.steps = 0.0

    def add(self, extra: float, drafted: float, steps: float) -> None:
        self.requests += 1
        self.extra += extra
        self.drafted += drafted
        self.steps += steps

    def dump(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "c": round(self.extra / self.drafted, 3),
            "drafted_per_step": round(self.drafted / self.steps, 2) if self.steps else None,
        }


def drafted_cost(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per source (``static``: the matrix arms; ``daemon``: tuner and challenger), each
    variant's and each spec type's measured cost of a drafted token, each spec type's in
    each class (``"CLASS type:SPEC"``), and ``request:first`` / ``request:later``: an arm's
    first request to a variant (its instance loading) and the rest."""
    rows = [r for r in rows if usable(r)]
    base = baselines(rows)
    sums: dict[str, dict[str, _Sums]] = defaultdict(lambda: defaultdict(_Sums))
    sent: set[tuple[str, str]] = set()  # (arm, variant) pairs that have had a request
    for row in rows:
        drafted, variant = float(row.get("drafted") or 0), str(row.get("variant") or "none")
        first = (row["arm"], variant) not in sent
        sent.add((row["arm"], variant))
        if row["arm"] == "none" or variant == "none" or drafted <= 0 or row["id"] not in base:
            continue
        n, accepted = float(row["tokens"]), float(row.get("accepted") or 0)
        steps = float(row["ms"]) * base[row["id"]]  # plain decode steps (tokens per ms)
        source = "daemon" if row["arm"] in DAEMONS else "static"
        spec = "type:" + variant.split(".")[0]
        nth = "request:first" if first else "request:later"
        for key in (variant, spec, f"{row.get('class') or '?'} {spec}", nth):
            sums[source][key].add(steps - (n - accepted), drafted, n - accepted)
    return {
        source: {key: each.dump() for key, each in sorted(by_key.items())}
        for source, by_key in sorted(sums.items())
    }


def main() -> None:
    run_main(__doc__, drafted_cost)


if __name__ == "__main__":
    main()
