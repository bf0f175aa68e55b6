"""Re-price a `tuner bench` run's evidence with the engine's pricing, and check it against
the run's static arms (``tuner.bench.beliefs``), without running anything.

The daemon's policy file keeps each class's recent requests, served and replayed; an engine
restored from it rebuilds its calibration from them and prices every variant again. Printed
for the engine's pricing (``by_length``: a variant that never served starts at the served
variants' cost at its draft length) and for the pooled cost every unserved variant had
before it, on the same evidence; and the figures the live daemon wrote when it stopped.

    python benchmarks/reprice.py RUN_DIR [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tuner.bench.beliefs import beliefs
from tuner.tuning.config import load_tuning
from tuner.tuning.runtime.engine import Engine
from tuner.tuning.variants import parse_name

FIELDS = ("pairs", "within_tolerance", "inside_interval", "mean_error", "median_ratio")


def reprice(run: Path, pooled: bool) -> dict[str, Any] | None:
    document = json.loads((run / "tuner-state" / "policies.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    engine = Engine(load_tuning(), [parse_name(n) for n in document["variants"]], None)
    if pooled:
        engine.costfit.lengths = {}  # as before the length fit; restore rebuilds on it
    engine.restore(document["classes"])
    speedups = {k: c.get("speedups", {}) for k, c in engine.snapshot().items()}
    return beliefs(summary["classes"], speedups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    summary = json.loads((args.run / "summary.json").read_text())
    found = {
        "live": summary.get("pricing"),
        "by_length": reprice(args.run, pooled=False),
        "pooled": reprice(args.run, pooled=True),
    }
    for name, result in found.items():
        print(name, {k: result[k] for k in FIELDS} if result else None)
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
