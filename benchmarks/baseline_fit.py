"""Baseline decode speed without controls: fitted from a run's speculative requests alone.

A speculative request that generated ``n`` tokens, drafted ``d`` and had ``a`` accepted took
``n - a`` target steps and verified ``d`` drafts (``tuner.tuning.counts``), so its decode time
is about ``t1 (n - a) + t1 c_v d`` with ``t1`` one plain decode step and ``c_v`` what one
drafted token of its variant ``v`` costs. Least squares on every speculative request (each
weighted by its own time, so every request counts by its relative error) gives ``t1`` and so
the speed without speculation, ``1 / t1``, with no request run without speculation. Per arm
(the daemons' and each static arm's speculative requests), over its first 30 and 100 and all
of them, beside the speed measured on the run's ``none`` requests: how far a daemon could
price drafted tokens without controls.

``engine``: per daemon arm, what ``[guard] baseline = "fitted"`` would have priced at:
the engine's own fit (``Calibration.step_time``, unweighted, one cost per variant) over that
arm's requests in the order they ran, its plain requests after the first two left out (the
two that anchor the fit; a fitted daemon sends no other controls), after its first 20, 40,
100 and all requests.

    python -m benchmarks.baseline_fit DIR [--out FILE.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import run_main, usable
from benchmarks.exploration_cost import DAEMONS
from tuner.tuning.counts import Calibration

PREFIXES = (30, 100)
ENGINE_PREFIXES = (20, 40, 100)
ANCHORS = 2  # plain requests a fitted daemon runs, all traffic's first


def fit(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """``1 / t1`` (tokens per second without speculation) and each variant's ``c`` from
    speculative requests; None without at least one more request than unknowns."""
    variants = sorted({str(r["variant"]) for r in rows})
    if len(rows) <= 1 + len(variants):
        return None
    x = np.zeros((len(rows), 1 + len(variants)))
    y = np.zeros(len(rows))
    for i, row in enumerate(rows):
        x[i, 0] = int(row["tokens"]) - int(row["accepted"])
        x[i, 1 + variants.index(str(row["variant"]))] = int(row["drafted"])
        y[i] = float(row["ms"]) / 1000.0
    weight = 1.0 / y
    coef, *_ = np.linalg.lstsq(x * weight[:, None], y * weight, rcond=None)
    step = float(coef[0])
    if step <= 0:
        return None
    return {
        "requests": len(rows),
        "tok_s": round(1.0 / step, 2),
        "cost": {v: round(float(k) / step, 3) for v, k in zip(variants, coef[1:], strict=True)},
    }


def baseline_fit(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The measured no-speculation speed, and per arm the fitted one over growing prefixes."""
    rows = [r for r in rows if usable(r)]
    base = [r for r in rows if r.get("variant") == "none"]
    measured = (
        sum(int(r["tokens"]) for r in base) / sum(float(r["ms"]) / 1000.0 for r in base)
        if base
        else None
    )
    arms: dict[str, Any] = {}
    for arm in sorted({str(r["arm"]) for r in rows}):
        spec = [
            r for r in rows
            if r["arm"] == arm and r.get("variant") != "none" and int(r.get("drafted") or 0) > 0
        ]  # fmt: skip
        fits = {}
        for first in (*[p for p in PREFIXES if p < len(spec)], len(spec)):
            found = fit(spec[:first])
            if found is not None:
                found["over_measured"] = round(found["tok_s"] / measured, 3) if measured else None
                fits[str(first)] = found
        if fits:
            arms[arm] = fits
    engine = {
        arm: found
        for arm in DAEMONS
        if (found := engine_fit([r for r in rows if r["arm"] == arm], measured))
    }
    return {
        "measured_tok_s": round(measured, 2) if measured else None,
        "arms": arms,
        "engine": engine,
    }


def engine_fit(rows: Sequence[dict[str, Any]], measured: float | None) -> dict[str, Any]:
    """The engine's fitted speed (``Calibration.step_time``) over growing prefixes of one
    daemon's requests, as run, with only its first ``ANCHORS`` plain requests kept."""
    kept, plain = [], 0
    for row in rows:
        if row.get("variant") == "none":
            plain += 1
            if plain > ANCHORS:
                continue
        kept.append(row)
    marks = {p for p in ENGINE_PREFIXES if p < len(kept)} | {len(kept)}
    out: dict[str, Any] = {}
    calibration = Calibration()  # fed once, in order, read at each mark
    for done, row in enumerate(kept, 1):
        counts = (int(row["tokens"]), int(row.get("drafted") or 0),
                  int(row.get("accepted") or 0))  # fmt: skip
        calibration.add("all", str(row["variant"]), counts, float(row["ms"]) / 1000.0)
        step = calibration.step_time() if done in marks else None
        if step is not None:
            tok_s = 1.0 / step
            out[str(done)] = {
                "tok_s": round(tok_s, 2),
                "over_measured": round(tok_s / measured, 3) if measured else None,
            }
    return out


def main() -> None:
    run_main(__doc__, baseline_fit)


if __name__ == "__main__":
    main()
