"""``tuner report --plot FILE.png``: four panels that show what was decided and why.

1. Speedup per class with its 90 % interval: the chosen variant's measured speedup,
   or, where speculation is off, the best variant tried (hollow, grey).
2. Predicted versus measured speedup for every (class, variant) with evidence.
3. Acceptance alpha per class and variant (a heat map, values written in).
4. Tuning history: each trial's speedup over time, one line per class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.extras import require
from tuner.report.data import ArmRow, ClassRow, Report

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from tuner.tuning.search.studies import TrialRecord

__all__ = ["plot_report"]

ON, OFF, NEUTRAL = "#1b7837", "#999999", "#444444"


def _best_tried(row: ClassRow) -> ArmRow | None:
    tried = [a for a in row.arms if a.variant != "none" and a.speedup is not None]
    return max(tried, key=lambda a: a.speedup or 0.0, default=None)


def _speedups(ax: Axes, rows: Sequence[ClassRow]) -> None:
    ax.axvline(1.0, color=NEUTRAL, lw=1, ls="--")
    for y, row in enumerate(rows):
        if row.speculation and row.speedup is not None:
            low, high = row.speedup_low or row.speedup, row.speedup_high or row.speedup
            err = [[row.speedup - low], [high - row.speedup]]
            ax.errorbar(row.speedup, y, xerr=err, fmt="o", color=ON, capsize=4)
            ax.annotate(
                row.variant,
                (row.speedup, y),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=8,
                color=ON,
            )
            continue
        best = _best_tried(row)
        if best is not None and best.speedup is not None:
            low, high = best.speedup_low or best.speedup, best.speedup_high or best.speedup
            err = [[best.speedup - low], [high - best.speedup]]
            ax.errorbar(best.speedup, y, xerr=err, fmt="o", mfc="white", color=OFF, capsize=4)
            ax.annotate(
                f"off (best tried: {best.variant})",
                (best.speedup, y),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=8,
                color=OFF,
            )
        else:
            ax.plot(1.0, y, "x", color=OFF)
            ax.annotate(
                "off (nothing measured)",
                (1.0, y),
                xytext=(6, 6),
                textcoords="offset points",
                fontsize=8,
                color=OFF,
            )
    ax.set_yticks(range(len(rows)), [r.class_key for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("decode speedup over no speculation (90 % interval)")
    ax.set_title("Speedup per class: chosen variant (green) or best tried when off (grey)")
    ax.grid(axis="x", alpha=0.3)


def _predicted_vs_measured(ax: Axes, rows: Sequence[ClassRow]) -> None:
    xs, ys, colors = [], [], []
    for row in rows:
        for arm in row.arms:
            if arm.predicted is None or arm.speedup is None or arm.variant == "none":
                continue
            xs.append(arm.predicted)
            ys.append(arm.speedup)
            colors.append(ON if row.speculation and arm.variant == row.variant else OFF)
    if not xs:
        ax.text(
            0.5, 0.5, "no variant measured yet", ha="center", va="center", transform=ax.transAxes
        )
    else:
        ax.scatter(xs, ys, c=colors, s=28, alpha=0.8)
        low, high = min(xs + ys + [1.0]) - 0.05, max(xs + ys + [1.0]) + 0.05
        ax.plot(
            [low, high], [low, high], color=NEUTRAL, lw=1, ls="--", label="measured = predicted"
        )
        ax.axhline(1.0, color=NEUTRAL, lw=0.5)
        ax.axvline(1.0, color=NEUTRAL, lw=0.5)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("predicted speedup (speedup model)")
    ax.set_ylabel("measured speedup")
    ax.set_title("Predicted vs measured, every class x variant (green: chosen)")
    ax.grid(alpha=0.3)


def _alphas(ax: Axes, rows: Sequence[ClassRow]) -> None:
    variants = sorted({a.variant for r in rows for a in r.arms if a.alpha is not None})
    shown = [r for r in rows if any(a.alpha is not None for a in r.arms)]
    if not variants or not shown:
        ax.text(
            0.5, 0.5, "no drafts recorded yet", ha="center", va="center", transform=ax.transAxes
        )
        ax.set_axis_off()
        return
    import numpy as np

    grid = np.full((len(shown), len(variants)), np.nan)
    for i, row in enumerate(shown):
        for arm in row.arms:
            if arm.alpha is not None:
                grid[i, variants.index(arm.variant)] = arm.alpha
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i in range(len(shown)):
        for j in range(len(variants)):
            if not np.isnan(grid[i, j]):
                ax.text(
                    j,
                    i,
                    f"{grid[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if grid[i, j] < 0.6 else "black",
                )
    ax.set_xticks(range(len(variants)), variants, rotation=40, ha="right", fontsize=7)
    ax.set_yticks(range(len(shown)), [r.class_key for r in shown], fontsize=8)
    ax.figure.colorbar(image, ax=ax, label="acceptance alpha")
    ax.set_title("Acceptance alpha per class and variant")


def _history(ax: Axes, histories: Mapping[str, Sequence[TrialRecord]]) -> None:
    import numpy as np

    drawn = False
    for key, trials in sorted(histories.items()):
        points = [
            (datetime.fromisoformat(t.finished), float(t.value))
            for t in trials
            if t.finished and t.value is not None
        ]
        if points:
            times = np.array([p[0] for p in points], dtype="datetime64[ms]")
            ax.plot(times, np.array([p[1] for p in points]), "o-", ms=4, label=key)
            drawn = True
    if not drawn:
        ax.text(
            0.5, 0.5, "no finished trials yet", ha="center", va="center", transform=ax.transAxes
        )
    else:
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

        locator = AutoDateLocator()  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        ax.axhline(1.0, color=NEUTRAL, lw=1, ls="--")
        ax.legend(fontsize=7, loc="best")
    ax.set_xlabel("trial finished (UTC)")
    ax.set_ylabel("trial speedup")
    ax.set_title("Tuning history: each trial's speedup over time")
    ax.grid(alpha=0.3)


def plot_report(report: Report, histories: Mapping[str, Sequence[TrialRecord]], path: Path) -> Path:
    """Write the four-panel figure to ``path`` (PNG, or any format matplotlib knows)."""
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in report.classes if r.requests or r.arms]
    fig, axes = plt.subplots(2, 2, figsize=(17, 11), layout="constrained")
    title = f"spec-tuner: {report.model or 'no policies yet'}"
    if report.build:
        title += f" (build {report.build})"
    if report.expected_speedup is not None:
        title += (
            f", expected speedup {report.expected_speedup:.2f}x over {report.requests} requests"
        )
    fig.suptitle(title)
    _speedups(axes[0][0], rows)
    _predicted_vs_measured(axes[0][1], rows)
    _alphas(axes[1][0], rows)
    _history(axes[1][1], histories)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
