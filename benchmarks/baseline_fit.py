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

    python -m benchmarks.baseline_fit DIR [--out FILE.json]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.common import run_main, usable

PREFIXES = (30, 100)


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
    return {"measured_tok_s": round(measured, 2) if measured else None, "arms": arms}


def main() -> None:
    run_main(__doc__, baseline_fit)


if __name__ == "__main__":
    main()
