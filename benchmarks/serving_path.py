"""The serving path alone: one variant through a daemon pinned to it against a plain
llama-server started with that variant's flags, request by request.

The daemon serves on its router (mainline) or pool (ik_llama.cpp) as a user's would, every
class pinned to ``--variant``, so nothing is learned; the plain server gets the flags a
static arm of ``tuner bench`` gets (the matrix's), on the same binary, context and threads.
Each prompt goes to both back to back (alternating which first), greedy; pairs whose draft
counts differ are left out, and the rest give the ratio of decode times (llama-server's
``predicted_ms``, daemon over plain: above 1 the daemon's instance decoded slower)::

    python -m benchmarks.serving_path --engine ik_llama.cpp --prompts 40
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import emit, start_llama_server, start_tuner
from tuner.bench.run import matrix_variants
from tuner.daemon.plan import pool_members
from tuner.settings import Settings
from tuner.upstream.launch import prepare, server_argv
from tuner.workload import load_workload

Z90 = 1.645


def plain_argv(settings: Settings, variant: str) -> list[str]:
    """A static arm's command line for ``variant`` (its flags on the command line), without
    host and port."""
    prepared = prepare(settings)
    (member,) = pool_members(
        matrix_variants([variant], prepared), settings, prepared, per_request=False
    )
    argv = server_argv(
        prepared.binary, settings, prepared.capabilities, model=prepared.model, draft=None, port=0
    )
    at = argv.index("--host")
    del argv[at : at + 4]  # host and port: start_llama_server gives its own
    return argv + list(member.flags)


def decode(url: str, path: str, body: dict[str, Any]) -> tuple[float, int, int]:
    timings = httpx.post(url + path, json=body, timeout=600).json()["timings"]
    return timings["predicted_ms"], timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)


def run(engine: str, variant: str, workload: Path, prompts: int) -> dict[str, Any]:
    settings = Settings(engine=engine, threads=2)
    items = load_workload(workload)[:prompts]
    logs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        (state / "tuning.toml").write_text(f'[overrides.all]\npin = "{variant}"\n')
        env = {
            "TUNER_ENGINE": engine,
            "TUNER_THREADS": "2",
            "TUNER_TUNING_FILE": str(state / "tuning.toml"),
        }
        daemon, proxy = start_tuner(state, env)
        plain, direct = start_llama_server(plain_argv(settings, variant), timeout_s=120)
        try:
            for i, item in enumerate(items):
                path, body = item.request()
                body = {**body, "model": "x", "temperature": 0.0}
                order = [proxy, direct] if i % 2 == 0 else [direct, proxy]
                got = {url: decode(url, path, body) for url in order}
                if got[proxy][1:] == got[direct][1:]:  # the same drafts, the same work
                    logs.append(math.log(got[proxy][0] / got[direct][0]))
        finally:
            for proc in (plain, daemon):
                proc.terminate()
                proc.wait(timeout=60)
    mean = statistics.fmean(logs)
    se = statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "engine": engine,
        "variant": variant,
        "pairs": len(logs),
        "of": len(items),
        "daemon_over_plain": round(math.exp(mean), 4),
        "interval_90": [round(math.exp(mean - Z90 * se), 4), round(math.exp(mean + Z90 * se), 4)],
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--engine", choices=("llama.cpp", "ik_llama.cpp"), default="llama.cpp")
    cli.add_argument("--variant", default="ngram-mod.match24.max16")
    cli.add_argument("--workload", type=Path, default=Path("benchmarks/workloads/real.jsonl"))
    cli.add_argument("--prompts", type=int, default=40)
    cli.add_argument("--out", type=Path)
    args = cli.parse_args()
    emit(run(args.engine, args.variant, args.workload, args.prompts), args.out)


if __name__ == "__main__":
    main()
