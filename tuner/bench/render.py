"""A bench summary as a markdown report and a figure.

The figure has two panels: the ratio to baseline per class for every static arm
(grey), the per-class oracle (black) and the tuner after convergence (green); and
the tuner's (and a challenger's, purple) running ratio to baseline over its request
stream, next to the best single static arm and the oracle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.bench.beliefs import markdown_rows
from tuner.bench.rows import BASELINE_ARM, Measured, item_means, succeeded
from tuner.bench.schedule import CHALLENGER, TUNER
from tuner.extras import require

__all__ = ["markdown", "plot"]

ON, STATIC, ORACLE, OTHER = "#1b7837", "#bbbbbb", "#222222", "#762a83"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _interval(entry: Mapping[str, Any] | None) -> str:
    if not entry or not entry.get("interval"):
        return ""
    low, high = entry["interval"]
    return f" [{low:.2f}, {high:.2f}]"


def _exposure_note(exposure: Mapping[str, float] | None) -> list[str]:
    """A warning where the tuner met each prompt far more often than a static arm did (none
    where there is no static arm to compare with)."""
    if (
        not exposure
        or not exposure["static_arm"]
        or exposure["tuner"] <= 2 * exposure["static_arm"]
    ):
        return []
    return [
        "",
        f"Caution: the tuner met each prompt {exposure['tuner']:g} times on average, each "
        f"static arm {exposure['static_arm']:g}. An `ngram-mod` table outlives a request and "
        "drafts a prompt's earlier answers when the prompt comes again, so tuner / static "
        "ratios favour the tuner here; `--repeats` gives the static arms the same exposure.",
    ]


def _target_note(target: Mapping[str, Any]) -> str:
    """What a target's value rests on: the classes not converged, or the worst class."""
    if target.get("unconverged_classes"):
        return f" (not converged: {', '.join(target['unconverged_classes'])})"
    if target.get("class"):
        return f" ({target['class']}: {target.get('requests')} requests{_interval(target)})"
    return ""


def _tuner_rows(overall: Mapping[str, Any], arm: str) -> list[str]:
    """The overall table's rows of a tuner arm: its whole run and after convergence (the
    tuner's with the oracle on the same requests)."""
    interval = _interval({"interval": overall.get(f"{arm}_interval")})
    after = _x(overall[f"{arm}_ratio_after_convergence"])
    if arm == TUNER and overall.get("best_static"):
        after += f" (oracle on the same requests: {_x(overall['oracle_ratio_after_convergence'])})"
    return [
        f"| **{arm}, whole run** | {_x(overall[f'{arm}_ratio'])}{interval} | "
        f"{_x(overall.get(f'{arm}_alpha'))} |",
        f"| {arm}, after convergence | {after} | |",
    ]


def _against_statics(overall: Mapping[str, Any]) -> str:
    """The tuner against the best static arm and the oracle, or why there is no such line."""
    if not overall.get("best_static"):
        return (
            "No static arms in this run (`--matrix none`): the tuner is compared with no "
            "speculation only, and there is no best static arm or per-class oracle to judge it by."
        )
    return (
        f"Best single static arm: **{overall['best_static']}** "
        f"({_x(overall['best_static_ratio'])}); tuner / best static = "
        f"{_x(overall.get('tuner_vs_best_static'))}{_by_counts(overall, TUNER)}; "
        f"tuner / oracle = {_x(overall.get('tuner_vs_oracle'))}."
    )


def _by_counts(overall: Mapping[str, Any], arm: str) -> str:
    """`` (priced by counts: X)`` where the summary has a daemon's ratio to the best static
    arm by counts (runs analysed before it was added have none)."""
    found = overall.get(f"{arm}_vs_best_static_by_counts")
    return f" (priced by counts: {_x(found)})" if found is not None else ""


def _same_work_note(overall: Mapping[str, Any]) -> list[str]:
    """What identical work took on the daemon's instances against the matrix's."""
    parts = []
    for arm in (TUNER, CHALLENGER):
        found = overall.get(f"{arm}_same_work")
        if found:
            parts.append(
                f"{arm} {_x(found['time_ratio'])}{_interval(found)} over {found['pairs']} "
                f"requests ({found['extra_seconds']:+.1f} s)"
            )
    if not parts:
        return []
    return [
        "",
        "Same work (a daemon's requests that drafted and accepted exactly what a static arm's "
        "request of the same prompt did; their decode time over its, above 1 slower): "
        + "; ".join(parts)
        + ". This is the serving path alone, not a choice; the whole-run ratios carry it.",
    ]


def _machine_line(load: Mapping[str, Any] | None) -> list[str]:
    """What else used the machine while the run went (``tuner.bench.machine``); none if unknown."""
    if not load or "other_share" not in load:
        return []
    quarters = ", ".join(
        "?" if q is None else f"{q:.0%}" for q in load.get("other_share_by_quarter") or []
    )
    return [
        f"- other processes: {load['other_share']:.1%} of the machine's CPU during the run "
        f"(by quarter {quarters}; worst interval {load.get('worst_interval_other_share', 0):.0%}); "
        f"steal {load.get('steal_share', 0):.1%}"
    ]


def _targets_table(summary: Mapping[str, Any]) -> list[str]:
    """The targets as a table, with the challenger's beside the tuner's when there is one."""
    targets = summary.get("targets") or {}
    theirs = summary.get("challenger_targets") or {}
    if not targets:
        return []
    head, rule = "| target | measured | wanted | met |", "|---|---|---|---|"
    if theirs:
        head, rule = head + " challenger | met |", rule + "---|---|"
    lines = ["## Targets", "", head, rule]
    for name, t in targets.items():
        line = (
            f"| {name} | {t['value']}{_target_note(t)} | {t['target']} "
            f"| {'yes' if t['met'] else 'no'} |"
        )
        other = theirs.get(name)
        if other:
            line += f" {other['value']}{_target_note(other)} | {'yes' if other['met'] else 'no'} |"
        elif theirs:
            line += " - | - |"
        lines.append(line)
    return [*lines, ""]


def _peer_rows(summary: Mapping[str, Any]) -> list[str]:
    """The peer's arms, each over the peer's own run without speculation, and the tuner's
    ratio over each (both ratios over each binary's own baseline, on the same prompts)."""
    overall = summary["overall"]
    peers = overall.get("peers")
    if not peers:
        return []
    tuner = overall.get("tuner_ratio")
    lines = [
        "",
        f"## Peer: {summary.get('peer', '?')} (ratio to its own run without speculation)",
        "",
        f"Its decode without speculation: {peers['baseline_tok_s']:.1f} tok/s "
        f"(this build's: {overall['baseline_tok_s']:.1f} tok/s).",
        "",
        "| arm | flags | ratio | alpha | tuner / arm |",
        "|---|---|---|---|---|",
    ]
    flags = summary.get("peer_arms") or {}
    for arm, entry in sorted(peers["arms"].items(), key=lambda kv: -kv[1]["ratio"]):
        versus = _x(tuner / entry["ratio"]) if tuner and entry["ratio"] else "-"
        lines.append(
            f"| {arm} | `{flags.get(arm, '?')}` | {_x(entry['ratio'])}{_interval(entry)} | "
            f"{_x(entry['alpha'])} | {versus} |"
        )
    return lines


def _engine_rows(overall: Mapping[str, Any]) -> list[str]:
    """The tuners in tokens per second (engines compare so), and the tuner against the
    engine's own autotune."""
    speeds = [
        f"{who} {overall[f'{who}_tok_s']:.1f} tok/s"
        for who in (TUNER, CHALLENGER)
        if overall.get(f"{who}_tok_s") is not None
    ]
    lines = ["", f"Decode speed on this run's prompts: {'; '.join(speeds)}."] if speeds else []
    if chosen := overall.get("tuner_engine"):
        measured = ", ".join(f"{e} {v:.1f}" for e, v in (chosen.get("tok_s") or {}).items())
        lines.append(
            f"The tuner (engine auto) served on {chosen['engine']}: {chosen['why']} "
            f"(calibration tok/s: {measured or 'none measured'})."
        )
    if overall.get("tuner_vs_best_autotune") is not None:
        lines.append(
            f"Tuner / the engine's best autotune arm: {_x(overall['tuner_vs_best_autotune'])}."
        )
    return lines


def markdown(summary: Mapping[str, Any]) -> str:
    """The summary as markdown: run facts, targets, overall arms, per-class table."""
    overall = summary["overall"]
    hardware = summary.get("hardware") or {}
    lines = [
        "# spec-tuner bench",
        "",
        f"- model: {summary.get('model', '?')}, engine {overall.get('engine', 'llama.cpp')}, "
        f"build {summary.get('build', '?')}",
        f"- machine: {hardware.get('cpu', '?')}, {hardware.get('cores', '?')} cores"
        + "".join(f", {gpu.get('name', 'a GPU')}" for gpu in hardware.get("gpus") or []),
        f"- workload: {summary.get('workload')} prompts; {summary['requests']} requests "
        f"({summary['errors']} errors); seed {summary.get('seed')}; "
        f"tuner exploration share {summary.get('explore_share')}",
        f"- baseline decode: {overall['baseline_tok_s']:.1f} tok/s",
        *_machine_line(summary.get("machine")),
        "",
    ]
    lines += _targets_table(summary)
    lines += ["## Overall (ratio to no speculation, 90 % interval)", ""]
    lines += ["| arm | ratio | tok/s | alpha |", "|---|---|---|---|"]
    for arm, entry in sorted(overall["arms"].items(), key=lambda kv: -kv[1]["ratio"]):
        ratio = f"{_x(entry['ratio'])}{_interval(entry)}"
        lines.append(f"| {arm} | {ratio} | {entry['tok_s']:.1f} | {_x(entry['alpha'])} |")
    if overall.get("best_static"):
        lines += [
            f"| **per-class oracle** | {_x(overall['oracle_ratio'])} | |",
            f"| per-prompt oracle | {_x(overall['per_prompt_oracle_ratio'])} | |",
        ]
    if "tuner_ratio" in overall:
        lines += _tuner_rows(overall, TUNER)
        if "challenger_ratio" in overall:
            lines += _tuner_rows(overall, CHALLENGER)
        lines += ["", _against_statics(overall)]
        lines += _exposure_note(overall.get("requests_per_prompt"))
        lines += _same_work_note(overall)
        if overall.get("challenger_vs_tuner") is not None:
            side = _interval({"interval": overall.get("challenger_vs_tuner_interval")})
            counts = _interval({"interval": overall.get("challenger_vs_tuner_by_counts_interval")})
            lines += [
                "",
                f"Side by side ({summary.get('challenger_tuning', 'challenger')}, "
                f"{overall['side_by_side_pairs']} pairs of the same prompt): challenger / tuner "
                f"= **{_x(overall['challenger_vs_tuner'])}**{side}; priced by counts "
                f"{_x(overall.get('challenger_vs_tuner_by_counts'))}{counts}; challenger / "
                f"best static = {_x(overall.get('challenger_vs_best_static'))}"
                f"{_by_counts(overall, CHALLENGER)}.",
            ]
    lines += _peer_rows(summary)
    lines += _engine_rows(overall)
    lines += ["", "## Per class", ""]
    header = "| class | prompts | baseline tok/s | oracle | best static here |"
    rule = "|---|---|---|---|---|"
    if "tuner_ratio" in overall:
        header += " tuner | tuner after conv. | final variant | converged after | roles |"
        rule += "---|---|---|---|---|"
    if "challenger_ratio" in overall:
        header += " challenger | its final variant |"
        rule += "---|---|"
    lines += [header, rule]
    for key, c in summary["classes"].items():
        best = f"{c['oracle']} {_x(c['oracle_ratio'])}"
        static = overall.get("best_static")
        here = c["arms"].get(static) if static else None
        row = (
            f"| {key} | {c['prompts']} | {c['baseline_tok_s']:.1f} | {best} | "
            f"{_x(here['ratio']) if here else '-'} |"
        )
        if "tuner_ratio" in overall:
            roles = ", ".join(f"{r} {n}" for r, n in (c.get("tuner_roles") or {}).items())
            row += (
                f" {_x(c.get('tuner_ratio'))} | {_x(c.get('tuner_ratio_after_convergence'))}"
                f"{_interval({'interval': c.get('tuner_interval_after_convergence')})} | "
                f"{c.get('final_variant') or '-'} | {c.get('converged_after', '-')} of "
                f"{c.get('tuner_requests', 0)} | {roles} |"
            )
        if "challenger_ratio" in overall:
            row += (
                f" {_x(c.get('challenger_ratio'))} | {c.get('challenger_final_variant') or '-'} |"
            )
        lines.append(row)
    if summary.get("pricing"):
        lines += ["", *markdown_rows(summary["pricing"])]
    return "\n".join(lines) + "\n"


def plot(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Write the two-panel figure (PNG or any format matplotlib knows)."""
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(16, 7), layout="constrained")
    fig.suptitle(f"spec-tuner bench: {summary.get('model', '?')}, {summary['requests']} requests")
    _per_class(left, summary)
    _running(right, summary, rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _per_class(ax: Any, summary: Mapping[str, Any]) -> None:
    classes = list(summary["classes"].items())
    ax.axvline(1.0, color=ORACLE, lw=1, ls="--")
    for y, (_, c) in enumerate(classes):
        ratios = [a["ratio"] for a in c["arms"].values()]
        ax.scatter(ratios, [y] * len(ratios), color=STATIC, s=18, zorder=2)
        ax.scatter([c["oracle_ratio"]], [y], color=ORACLE, marker="|", s=300, zorder=3)
        late = c.get("tuner_ratio_after_convergence")
        if late is not None:
            ax.scatter([late], [y], color=ON, marker="D", s=40, zorder=4)
    ax.set_yticks(range(len(classes)), [k for k, _ in classes], fontsize=8)
    ax.set_xlabel("decode tok/s relative to no speculation")
    ax.set_title("Per class: static arms (grey), oracle (|), tuner after convergence (green)")
    ax.grid(alpha=0.3)


def _cumulative(
    rows: Sequence[Mapping[str, Any]], arm: str, base: Mapping[int, Measured]
) -> list[float]:
    """An arm's cumulative ratio to no speculation over its requests, in order."""
    tokens = seconds = base_tokens = base_seconds = 0.0
    ys: list[float] = []
    for r in rows:
        if r["arm"] != arm or int(r["item"]) not in base:
            continue
        own, baseline = Measured.of(r), base[int(r["item"])]
        tokens, seconds = tokens + own.tokens, seconds + own.seconds
        base_tokens, base_seconds = base_tokens + baseline.tokens, base_seconds + baseline.seconds
        ys.append((tokens / seconds) / (base_tokens / base_seconds))
    return ys


def _running(ax: Any, summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> None:
    ok = succeeded(rows)
    base = item_means([r for r in ok if r["arm"] not in (TUNER, CHALLENGER)])[BASELINE_ARM]
    for arm, color in ((TUNER, ON), (CHALLENGER, OTHER)):
        ys = _cumulative(ok, arm, base)
        if ys:
            ax.plot(range(1, len(ys) + 1), ys, color=color, label=f"{arm} (cumulative)")
    overall = summary["overall"]
    if overall.get("best_static"):
        ax.axhline(
            overall["best_static_ratio"],
            color=STATIC,
            lw=2,
            label=f"best static: {overall['best_static']}",
        )
        ax.axhline(overall["oracle_ratio"], color=ORACLE, lw=1, ls=":", label="per-class oracle")
    ax.axhline(1.0, color=ORACLE, lw=1, ls="--", label="no speculation")
    ax.set_xlabel("tuner requests")
    ax.set_ylabel("cumulative ratio to no speculation")
    ax.set_title("The tuner learning online")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
