"""``tuner measure``: acceptance, tokens per step and speedup per class and variant, from records.

For each (class, variant) arm:

- ``alpha``: accepted / drafted tokens, with a Wilson 95 % interval;
- ``tokens_per_step``: tokens per target forward pass. A step either decodes one
  token or verifies a draft and yields its accepted tokens plus one, so
  ``steps = predicted_n - accepted`` and this is ``predicted_n / steps``;
- ``mean_draft``: drafted tokens per step (the effective draft length times the
  share of steps that drafted at all);
- decode tok/s (llama-server's ``predicted_per_second``) with a 95 % interval.

``compare`` sets an arm against its class's baseline arm (the no-speculation
variant): the measured speedup is the ratio of mean decode speeds, its interval
from the delta method on the log ratio, and ``effective_c`` the draft cost that
makes Leviathan's formula reproduce it.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from tuner.cli.commands import settings_from_args
from tuner.model.speedup import effective_draft_cost
from tuner.records import RequestRecord, read_records
from tuner.stats import Interval, mean_interval, ratio_interval, wilson
from tuner.tables import text_table
from tuner.tuning.variants import BASELINE

__all__ = ["ArmStats", "Comparison", "arm_stats", "cmd_measure", "compare"]

DEFAULT_CLASS = "all"
DEFAULT_VARIANT = "default"


@dataclass(frozen=True, slots=True)
class ArmStats:
    class_key: str
    variant: str
    requests: int
    tokens: int
    drafted: int
    accepted: int
    alpha: Interval | None
    tokens_per_step: float
    mean_draft: float
    tok_s: Interval
    tok_s_samples: tuple[float, ...]


def _key(record: RequestRecord) -> tuple[str, str]:
    return (record.class_key or DEFAULT_CLASS, record.variant or DEFAULT_VARIANT)


def arm_stats(records: Iterable[RequestRecord]) -> dict[tuple[str, str], ArmStats]:
    """Aggregate successful generation records by (class, variant)."""
    groups: dict[tuple[str, str], list[RequestRecord]] = defaultdict(list)
    for record in records:
        t = record.timings
        if record.status == 200 and record.error is None and t and t.predicted_per_second:
            groups[_key(record)].append(record)
    out: dict[tuple[str, str], ArmStats] = {}
    for (class_key, variant), rows in groups.items():
        tokens = sum(r.timings.predicted_n or 0 for r in rows if r.timings)
        drafted = sum(r.timings.draft_n or 0 for r in rows if r.timings)
        accepted = sum(r.timings.draft_n_accepted or 0 for r in rows if r.timings)
        steps = max(tokens - accepted, 1)
        speeds = [float(r.timings.predicted_per_second or 0) for r in rows if r.timings]
        out[(class_key, variant)] = ArmStats(
            class_key=class_key,
            variant=variant,
            requests=len(rows),
            tokens=tokens,
            drafted=drafted,
            accepted=accepted,
            alpha=wilson(accepted, drafted),
            tokens_per_step=tokens / steps,
            mean_draft=drafted / steps,
            tok_s=mean_interval(speeds),
            tok_s_samples=tuple(speeds),
        )
    return out


@dataclass(frozen=True, slots=True)
class Comparison:
    arm: ArmStats
    baseline: ArmStats
    speedup: Interval
    effective_c: float | None


def compare(arm: ArmStats, baseline: ArmStats) -> Comparison:
    """Measured speedup of ``arm`` over ``baseline`` (ratio of mean decode speeds)."""
    interval = ratio_interval(arm.tok_s_samples, baseline.tok_s_samples)
    ratio = interval.value
    effective = None
    if arm.alpha is not None and arm.mean_draft > 0:
        effective = effective_draft_cost(ratio, min(arm.alpha.value, 0.999), arm.mean_draft)
    return Comparison(arm, baseline, interval, effective)


def cmd_measure(args: argparse.Namespace) -> int:
    """Live statistics per (class, variant) from the daemon's request records."""

    settings = settings_from_args(args)
    arms = arm_stats(read_records(settings.records_dir))
    if not arms:
        print(f"no successful requests recorded in {settings.records_dir}")
        return 0
    rows = []
    for (class_key, variant), arm in sorted(arms.items()):
        baseline = arms.get((class_key, BASELINE.name))
        result = compare(arm, baseline) if baseline and variant != BASELINE.name else None
        alpha = arm.alpha
        rows.append(
            [
                class_key,
                variant,
                arm.requests,
                arm.tokens,
                f"{alpha.value:.2f} [{alpha.low:.2f}, {alpha.high:.2f}]" if alpha else None,
                arm.tokens_per_step,
                arm.tok_s.value,
                f"{result.speedup.value:.2f} [{result.speedup.low:.2f}, {result.speedup.high:.2f}]"
                if result
                else None,
                result.effective_c if result else None,
            ]
        )
    headers = [
        "class",
        "variant",
        "requests",
        "tokens",
        "alpha [95%]",
        "tok/step",
        "tok/s",
        "speedup [95%]",
        "effective c",
    ]
    print(text_table(headers, rows))
    if not any(variant == BASELINE.name for _, variant in arms):
        print(
            f"\nno '{BASELINE.name}' baseline recorded yet: speedups appear once the tuner runs it"
        )
    return 0
