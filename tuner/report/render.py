"""The report as a terminal table, markdown or JSON; a class's trial history. Pure."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.report.data import ClassRow, Report
from tuner.report.outlook import Outlook
from tuner.tables import markdown_table, text_table

if TYPE_CHECKING:
    from tuner.tuning.search.studies import TrialRecord

__all__ = ["as_json", "as_markdown", "as_table", "history_markdown", "history_table"]

HEADERS = (
    "class",
    "policy",
    "alpha [95% Wilson]",
    "acc.len",
    "speedup [90%]",
    "predicted",
    "requests",
    "explored",
    "trials",
    "prompt cached",
    "load",
    "uses",
    "since",
    "why",
)
HISTORY_HEADERS = ("trial", "variant", "state", "speedup", "requests", "started", "finished")


def when(epoch: float | None) -> str | None:
    if epoch is None or epoch <= 0:
        return None
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))


def _interval(value: float | None, low: float | None, high: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{value:.2f}{unit}"
    return f"{value:.2f}{unit} [{low:.2f}, {high:.2f}]"


def _policy(row: ClassRow) -> str:
    text = row.variant if row.speculation else "speculation off"
    return f"{text} (override)" if row.override else text


def _cached(row: ClassRow) -> str | None:
    """The share of the class's prompt tokens the server's cache held, and the processing
    speed of the rest (a conversation that moves instance processes its history again)."""
    total = row.prompt_cached + row.prompt_processed
    if not total:
        return None
    rate = f", {row.prompt_tok_s:.0f} tok/s" if row.prompt_tok_s else ""
    moved = sum(row.turns_moved.values())
    trials = f" ({row.turns_trials} trials in place)" if row.turns_trials else ""
    kept = f", turns {row.turns_stayed} kept{trials} {moved} moved"
    turns = kept if row.turns_stayed or moved else ""
    return f"{row.prompt_cached / total:.0%}{rate}{turns}"


def _load(row: ClassRow) -> str | None:
    """Requests in flight as the class's arrived (mean, most), of their variant as they were
    sent (the batch), and where a CPU gate runs one variant at a time, its waits there and
    the requests that joined the variant decoding."""
    if row.in_flight is None:
        return None
    text = f"{row.in_flight:.1f} in flight (most {row.busiest})"
    if row.batch is not None:
        text += f", batch {row.batch:.1f} (most {row.widest})"
    if row.gate_waited:
        text += f", {row.gate_waited} waited {row.gate_wait_s:.1f} s"
    if row.gate_joined:
        text += f", {row.gate_joined} joined"
    return text


def _cells(row: ClassRow) -> list[object]:
    share = f"{row.exploration_share:.0%}" if row.exploration_share is not None else None
    if share is not None and row.exploration_cost is not None:
        share += f" (cost {row.exploration_cost:.0%})"
    return [
        row.class_key,
        _policy(row),
        _interval(row.alpha, row.alpha_low, row.alpha_high),
        row.accepted_length,
        _interval(row.speedup, row.speedup_low, row.speedup_high, "x"),
        f"{row.predicted_speedup:.2f}x" if row.predicted_speedup is not None else None,
        row.requests,
        share,
        row.trials,
        _cached(row),
        _load(row),
        row.served_by if row.served_by not in (None, row.class_key) else None,
        when(row.since),
        row.reason,
    ]


def _hardware(hw: dict[str, Any] | None) -> str:
    if not hw:
        return "unknown"
    gpus = ", ".join(str(g.get("name")) for g in hw.get("gpus") or []) or "no GPU"
    return f"{hw.get('cpu')}, {hw.get('cores')} cores, {hw.get('ram_gib')} GiB RAM, {gpus}"


def _outlook(view: Outlook) -> list[str]:
    """What a daemon with the current settings starts with, before it has served anything."""
    engine = "the engine measured faster here (auto)" if view.engine == "auto" else view.engine
    head = f"model {view.model} on {engine}"
    if view.tuning_off:
        return [f"{head}; tuning is off ({view.tuning_off})"]
    return [
        f"{head}; tuning is on, over {len(view.classes)} classes: {', '.join(view.classes)}",
        "every class starts without speculation"
        + (
            "; from the first requests their answers are replayed through the n-gram "
            "variants, and the one that measures fastest on all traffic serves every class "
            "once it measures above 1x on two requests"
            if view.replays
            else ""
        ),
        f"a class has a policy of its own after {view.own_policy_after} measured requests "
        "(it borrows its parent's until then); each trial of another variant is measured "
        f"on {view.trial_requests} of its requests, within {view.explore_share:.0%} of its "
        "time (tuner variants: the search space and the prior's predictions)",
    ]


def _header(report: Report) -> list[str]:
    if report.unreadable:
        return [
            f"the policy file in {report.state_dir} could not be read (the reason is logged); "
            "the daemon replaces it with its next save"
        ]
    if not report.found:
        return [
            f"no policies yet in {report.state_dir}: the daemon writes them there once it "
            "has served requests with tuning on (TUNER_TUNE=true)",
            *(_outlook(report.outlook) if report.outlook else []),
            *_abandoned(report),
        ]
    expected = report.expected_speedup
    traffic = sum(1 for row in report.classes if row.requests)
    single = report.single
    one = (
        [
            f"one variant loaded at a time: {single.get('active')} serves all traffic "
            f"({single.get('reason')}; reload {single.get('reload_s')} s"
            f"{'' if single.get('reload_measured') else ' (guessed)'}, "
            f"{single.get('switches')} switches, {single.get('windows')} windows explored); "
            "the per-class policies below are what each class would choose alone"
        ]
        if single
        else []
    )
    held = [
        f"quarantined: {name} until {when(entry.get('until')) or '?'} UTC ({entry.get('reason')})"
        for name, entry in report.quarantine.items()
        if isinstance(entry, dict)
    ]
    fleet = report.fleet
    shared = (
        [
            f"fleet: {fleet.get('url')}, {len(fleet.get('daemons') or [])} daemons; policies "
            f"as {fleet.get('shown')} saved them (evidence pooled from all)"
        ]
        if fleet
        else []
    )
    return [
        *one,
        *held,
        *shared,
        f"model: {report.model}  engine: {report.engine or 'llama.cpp'}  build: {report.build}",
        *_engines(report.engines),
        f"hardware: {_hardware(report.hardware)}",
        f"state: {report.state_dir}  saved: {when(report.saved) or '-'} UTC",
        f"traffic: {report.requests} requests in {traffic} classes; expected speedup of the "
        "current policies over no speculation (traffic-weighted): "
        + (f"{expected:.2f}x" if expected is not None else "-"),
        *_abandoned(report),
    ]


def _abandoned(report: Report) -> list[str]:
    if not report.abandoned:
        return []
    return [
        f"abandoned: {report.abandoned} requests whose client hung up (cancelled upstream), "
        f"{report.abandoned_tokens} tokens generated for them"
    ]


def _engines(choice: dict[str, Any] | None) -> list[str]:
    """TUNER_ENGINE=auto's measurement: each engine's tok/s and why one serves."""
    if not choice:
        return []
    speeds = ", ".join(
        f"{r['engine']} {r['tok_s']:.1f} tok/s" if r.get("tok_s") else f"{r['engine']} -"
        for r in choice.get("results", [])
    )
    return [f"engines (auto): {speeds}; {choice.get('engine')}: {choice.get('why')}"]


def _rows(report: Report) -> tuple[tuple[str, ...], list[list[object]]]:
    """The table; a fleet's has a column of how many daemons each class's evidence is from."""
    if report.fleet is None:
        return HEADERS, [_cells(row) for row in report.classes]
    return (*HEADERS[:7], "daemons", *HEADERS[7:]), [
        [*(c := _cells(row))[:7], row.daemons, *c[7:]] for row in report.classes
    ]


def as_table(report: Report) -> str:
    lines = _header(report)
    if report.classes:
        lines += ["", text_table(*_rows(report))]
    return "\n".join(lines) + "\n"


def as_markdown(report: Report) -> str:
    lines = ["# spec-tuner report", ""] + [f"- {line}" for line in _header(report)]
    if report.classes:
        lines += ["", markdown_table(*_rows(report))]
    return "\n".join(lines) + "\n"


def as_json(report: Report) -> str:
    return json.dumps(report.public(), indent=2) + "\n"


def _history_cells(trials: Sequence[TrialRecord]) -> list[list[object]]:
    def short(iso: str | None) -> str | None:
        return iso[:19].replace("T", " ") if iso else None

    return [
        [t.number, t.variant, t.state, t.value, t.requests, short(t.started), short(t.finished)]
        for t in trials
    ]


def history_table(class_key: str, trials: Sequence[TrialRecord]) -> str:
    if not trials:
        return f"no trials recorded for class {class_key!r}\n"
    title = f"trials of class {class_key} (speedup over no speculation):"
    return f"{title}\n{text_table(HISTORY_HEADERS, _history_cells(trials))}\n"


def history_markdown(class_key: str, trials: Sequence[TrialRecord]) -> str:
    if not trials:
        return f"No trials recorded for class `{class_key}`.\n"
    return (
        f"## Trials of `{class_key}`\n\n"
        + markdown_table(HISTORY_HEADERS, _history_cells(trials))
        + "\n"
    )
