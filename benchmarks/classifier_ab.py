"""The classifier of the working tree against one of a git revision: same answers? how fast?

Both are loaded into one process (the revision's ``tuner`` package renamed) and called
alternately on the same body, so a VM's minute-to-minute drift hits both alike; the ratio of
medians is what a change did. The answers are compared on every labeled and workload prompt.
Usage: python benchmarks/classifier_ab.py [--against REV] [--calls N]
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.classifier_speed import PROSE, prompt_of  # noqa: E402
from benchmarks.common import emit  # noqa: E402
from tuner.classify import classify, load_definitions  # noqa: E402


def load_revision(rev: str, into: Path) -> Any:
    """The ``tuner.classify`` package of ``rev``, importable as ``tuner_<rev>.classify``."""
    name = "tuner_" + re.sub(r"\W", "_", rev)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "tuner"],
                             capture_output=True, check=True).stdout  # fmt: skip
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    (into / "tuner").rename(into / name)
    for path in (into / name).rglob("*.py"):
        text = re.sub(r"\btuner\.", f"{name}.", path.read_text())
        path.write_text(text.replace("from tuner import", f"from {name} import"))
    sys.path.insert(0, str(into))
    return importlib.import_module(f"{name}.classify")


def prompts() -> list[dict[str, Any]]:
    files = [*sorted((ROOT / "tests" / "classify").glob("*.jsonl")),
             *sorted((ROOT / "benchmarks" / "workloads").glob("*.jsonl"))]  # fmt: skip
    bodies = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]
    for body in list(bodies):  # long versions: the windows and the numpy paths
        if isinstance(body.get("prompt"), str):
            bodies.append(
                {**body, "prompt": body["prompt"] * (3000 // (len(body["prompt"]) + 1) + 1)}
            )
    return bodies + [{"prompt": prompt_of(n * 1024)} for n in (1, 8, 128)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="HEAD", help="git revision to compare with")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = load_revision(args.against, Path(tmp))
        new_defs, old_defs = load_definitions(), old.load_definitions()
        bodies = prompts()
        differ = [
            i for i, body in enumerate(bodies)
            if classify(body, new_defs).features.as_dict()
            != old.classify(body, old_defs).features.as_dict()
        ]  # fmt: skip
        cases = {
            "code_8kb": {"prompt": prompt_of(8 * 1024), "temperature": 0},
            "chat_8kb": {"messages": [{"role": "user", "content": prompt_of(8 * 1024)}]},
            "prose_8kb": {"prompt": (PROSE * 60)[: 8 * 1024]},
            "code_128kb": {"prompt": prompt_of(128 * 1024)},
        }
        speed = {}
        for name, body in cases.items():
            times: tuple[list[float], list[float]] = ([], [])
            for i in range(args.calls + 100):
                t0 = time.perf_counter_ns()
                old.classify(body, old_defs)
                t1 = time.perf_counter_ns()
                classify(body, new_defs)
                t2 = time.perf_counter_ns()
                if i >= 100:  # warm-up
                    times[0].append((t1 - t0) / 1000)
                    times[1].append((t2 - t1) / 1000)
            old_us, new_us = statistics.median(times[0]), statistics.median(times[1])
            speed[name] = {"old_median_us": round(old_us, 1), "new_median_us": round(new_us, 1),
                           "new_over_old": round(new_us / old_us, 3)}  # fmt: skip
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.against],
                         capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    emit({"against": sha, "prompts": len(bodies), "features_differ": len(differ),
          "first_differing": differ[:10], "speed": speed}, args.out)  # fmt: skip


if __name__ == "__main__":
    main()
