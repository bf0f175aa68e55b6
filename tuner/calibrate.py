"""``tuner calibrate``: measure what the speedup model needs, then check it against reality.

1. Start llama-server on the target with no speculation. Time one decode step
   (``ignore_eos`` generations) and the verify-cost curve ``T(n)``: the time to
   process ``n`` new tokens on a cached prefix, for n = 1..64, relative to one
   decode step (with ``--swa-full`` so sliding-window models reuse the prefix
   exactly). Prompt processing computes logits only for the last position
   while verification computes them for all, so this is a lower bound; the
   checks below show how much it misses.
2. With a draft model, time the draft's decode step the same way: ``c``.
3. For each variant (spec type and flags), start llama-server with it, replay
   the workload, and count tokens, drafted and accepted tokens and verify
   rounds (``/metrics`` deltas). Predict the speedup from those counts and the
   curve, measure it against the no-speculation run, and derive the effective
   draft cost that would explain the difference.

The result is a ``Profile`` saved under ``<state>/profiles/``.
"""

from __future__ import annotations

import json
import random
import re
import statistics
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import UpstreamError
from tuner.model.speedup import interpolated_curve
from tuner.profiles import (
    Profile,
    VariantCheck,
    fingerprint_key,
    hardware_fingerprint,
    model_key,
)
from tuner.settings import Settings
from tuner.upstream.capabilities import Capabilities
from tuner.upstream.client import UpstreamClient
from tuner.upstream.launch import server_argv
from tuner.upstream.process import ManagedServer, free_port
from tuner.upstream.provision import Progress
from tuner.workload import WorkloadItem

__all__ = [
    "DEFAULT_VARIANTS",
    "VariantRun",
    "calibrate",
    "decode_step_ms",
    "post_json",
    "predicted_speedup",
    "replay_each",
    "temporary_server",
    "verify_curve",
]

VERIFY_NS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
DEFAULT_VARIANTS: dict[str, list[str]] = {
    "ngram-simple": ["--spec-type", "ngram-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
    "ngram-cache": ["--spec-type", "ngram-cache"],
}
_DRAFTS = re.compile(r"^llamacpp:spec_decode_num_drafts_total\s+([0-9.e+]+)", re.M)
_PREFIX = (
    "The committee met on Tuesday to review the quarterly figures. Revenue rose in every "
    "region except the north, where a supplier strike delayed two shipments. The chair "
    "asked for a plan to recover the lost orders before the end of the year, and the "
    "finance team agreed to report weekly until the backlog is cleared. "
) * 3


@dataclass(frozen=True, slots=True)
class VariantRun:
    requests: int
    tokens: int
    predicted_ms: float
    drafted: int
    accepted: int
    rounds: int

    @property
    def tok_s(self) -> float:
        return 1000.0 * self.tokens / self.predicted_ms if self.predicted_ms else 0.0


def predicted_speedup(
    run: VariantRun, verify: Callable[[float], float], draft_cost: float = 0.0
) -> float | None:
    """Speedup predicted from a run's counts and the cost curve (time in decode steps).

    Steps that drafted nothing cost 1; each verify round costs its drafting
    (``mean_draft * draft_cost``) plus ``T(mean_draft + 1)``.

    >>> run = VariantRun(1, tokens=100, predicted_ms=1, drafted=60, accepted=40, rounds=20)
    >>> round(predicted_speedup(run, lambda n: 1.0), 3)  # 60 steps: 40 plain + 20 rounds
    1.667
    """
    if run.tokens <= 0:
        return None
    steps = run.tokens - run.accepted
    plain = max(steps - run.rounds, 0)
    if run.rounds == 0:
        return run.tokens / max(plain, 1)
    mean_draft = run.drafted / run.rounds
    time = plain + run.rounds * (mean_draft * draft_cost + verify(mean_draft + 1))
    return run.tokens / time


async def post_json(client: UpstreamClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.open("POST", path, content=json.dumps(body).encode())
    data = await response.aread()
    await response.aclose()
    if response.status_code >= 400:
        raise UpstreamError(f"{path} answered {response.status_code}: {data[:300]!r}")
    result: dict[str, Any] = json.loads(data)
    return result


async def _drafts_total(client: UpstreamClient) -> int:
    response = await client.open("GET", "/metrics")
    text = (await response.aread()).decode()
    await response.aclose()
    match = _DRAFTS.search(text)
    return int(float(match.group(1))) if match else 0


@asynccontextmanager
async def temporary_server(
    binary: Path, settings: Settings, caps: Capabilities, model: Path, extra: list[str], name: str
) -> AsyncIterator[UpstreamClient]:
    port = free_port()
    client = UpstreamClient(f"http://127.0.0.1:{port}", read_timeout_s=settings.request_timeout_s)
    argv = server_argv(binary, settings, caps, model=model, draft=None, port=port) + extra
    log = settings.state_dir / "logs" / f"calibrate-{name}.log"
    server = ManagedServer(argv, client, log_path=log, startup_timeout_s=settings.startup_timeout_s)
    await server.start()
    try:
        await server.wait_ready(settings.startup_timeout_s)
        yield client
    finally:
        await server.stop()
        await client.aclose()


async def decode_step_ms(client: UpstreamClient, repeats: int = 3, n: int = 64) -> float:
    times = []
    for i in range(repeats):
        body = {
            "prompt": f"{i}. Once upon a time",
            "n_predict": n,
            "ignore_eos": True,
            "temperature": 0,
            "cache_prompt": False,
        }
        timings = (await post_json(client, "/completion", body))["timings"]
        times.append(float(timings["predicted_ms"]) / float(timings["predicted_n"]))
    return float(statistics.median(times))


async def verify_curve(
    client: UpstreamClient, ns: Sequence[int], repeats: int, seed: int = 0
) -> list[tuple[int, float]]:
    """Median ms to process n new tokens on a cached prefix, per n."""
    prefix: list[int] = (await post_json(client, "/tokenize", {"content": _PREFIX}))["tokens"]
    pool = sorted(set(prefix))
    rng = random.Random(seed)
    base = {"n_predict": 0, "cache_prompt": True, "id_slot": 0, "temperature": 0}
    await post_json(client, "/completion", {**base, "prompt": prefix})
    samples: dict[int, list[float]] = {}
    for n in ns:
        for _ in range(repeats):
            extra = [rng.choice(pool) for _ in range(n)]
            body = {**base, "prompt": prefix + extra}
            timings = (await post_json(client, "/completion", body))["timings"]
            # Key by what was processed: a random token may match the cache, and
            # sliding-window models may re-process more than the new tokens.
            processed = int(timings.get("prompt_n", 0))
            if 0 < processed <= max(ns):
                samples.setdefault(processed, []).append(float(timings["prompt_ms"]))
    if not samples:
        raise UpstreamError("prompt cache was never reused; cannot measure the verify curve")
    return sorted((n, statistics.median(ms)) for n, ms in samples.items())


async def replay_each(
    client: UpstreamClient, items: Sequence[WorkloadItem], max_tokens: int | None = None
) -> list[dict[str, Any]]:
    """Send each item once, in order; return llama-server's ``timings`` for each."""
    results = []
    for item in items:
        path, body = item.request(max_tokens)
        results.append((await post_json(client, path, body))["timings"])
    return results


async def _replay(
    client: UpstreamClient, items: Sequence[WorkloadItem], max_tokens: int
) -> VariantRun:
    before = await _drafts_total(client)
    each = await replay_each(client, items, max_tokens)
    rounds = await _drafts_total(client) - before
    return VariantRun(
        requests=len(each),
        tokens=sum(int(t.get("predicted_n", 0)) for t in each),
        predicted_ms=sum(float(t.get("predicted_ms", 0.0)) for t in each),
        drafted=sum(int(t.get("draft_n", 0)) for t in each),
        accepted=sum(int(t.get("draft_n_accepted", 0)) for t in each),
        rounds=rounds,
    )


async def calibrate(
    *,
    binary: Path,
    settings: Settings,
    caps: Capabilities,
    model: Path,
    draft: Path | None,
    items: Sequence[WorkloadItem],
    variants: dict[str, list[str]],
    max_tokens: int = 64,
    repeats: int = 3,
    progress: Progress = print,
) -> Profile:
    """Measure costs and check predictions; returns the profile (not yet saved)."""
    progress("measuring decode step and verify curve (no speculation)")
    # A full-size sliding-window cache lets the prefix be reused exactly (Gemma 3 and kin).
    base_flags = ["--spec-type", "none"] + (["--swa-full"] if caps.has_flag("--swa-full") else [])
    async with temporary_server(binary, settings, caps, model, base_flags, "none") as client:
        decode_ms = await decode_step_ms(client, repeats)
        raw_curve = await verify_curve(client, VERIFY_NS, repeats)
        progress(f"replaying {len(items)} prompts without speculation")
        baseline = await _replay(client, items, max_tokens)
    curve = [(n, ms / decode_ms) for n, ms in raw_curve]
    draft_cost = None
    if draft is not None:
        progress("measuring the draft model's decode step")
        async with temporary_server(binary, settings, caps, draft, [], "draft") as client:
            draft_cost = await decode_step_ms(client, repeats) / decode_ms
        variants = {**variants, "draft-simple": ["--spec-type", "draft-simple", "-md", str(draft)]}
    verify = interpolated_curve(curve)
    checks = []
    for name, flags in variants.items():
        progress(f"replaying {len(items)} prompts with {name}")
        async with temporary_server(binary, settings, caps, model, flags, name) as client:
            run = await _replay(client, items, max_tokens)
        cost = draft_cost if name == "draft-simple" and draft_cost is not None else 0.0
        checks.append(
            VariantCheck(
                variant=name,
                flags=flags,
                requests=run.requests,
                tokens=run.tokens,
                alpha=run.accepted / run.drafted if run.drafted else None,
                rounds=run.rounds,
                mean_draft=run.drafted / run.rounds if run.rounds else None,
                measured_speedup=run.tok_s / baseline.tok_s if baseline.tok_s else 0.0,
                predicted_speedup=predicted_speedup(run, verify, cost),
            )
        )
    fingerprint = hardware_fingerprint()
    return Profile(
        model_key=model_key(model),
        model_name=model.stem,
        hardware_key=fingerprint_key(fingerprint),
        hardware=fingerprint,
        build=caps.commit,
        decode_ms=decode_ms,
        verify_curve=curve,
        draft_cost=draft_cost,
        checks=checks,
    )
