from __future__ import annotations

from pathlib import Path

from tests.bench.test_analyse import CLASSES, static_rows, tuner_row
from tuner.bench.analyse import summarize
from tuner.bench.render import markdown, plot


def test_markdown_has_targets_arms_and_classes(tmp_path: Path) -> None:
    rows = static_rows() + [tuner_row(i % 4, "meh") for i in range(8)]
    summary = summarize(rows, CLASSES, meta={"model": "m.gguf", "workload": 4})
    text = markdown(summary)
    assert "## Targets" in text and "| fast-code |" in text
    assert "| code | 2 |" in text and "| prose | 2 |" in text
    assert "Best single static arm: **fast-code**" in text
    by_counts = summary["overall"]["tuner_vs_best_static_by_counts"]
    assert f"(priced by counts: {by_counts:.3f}); tuner / oracle" in text
    older = summary | {"overall": summary["overall"] | {"tuner_vs_best_static_by_counts": None}}
    assert "priced by counts:" not in markdown(older)  # a summary from before the field
    # the worst class is named, with the requests (4 per class here) its figure rests on
    worst = summary["targets"]["worst_class_after_convergence"]
    assert f"({worst['class']}: 4 requests [" in text
    # 8 tuner requests over 4 prompts, each static arm twice: no caution
    assert summary["overall"]["requests_per_prompt"] == {"tuner": 2.0, "static_arm": 2.0}
    assert "Caution" not in text
    many = summarize(rows + [tuner_row(i % 4, "meh") for i in range(24)], CLASSES)
    assert many["overall"]["requests_per_prompt"]["tuner"] == 8.0
    assert "Caution: the tuner met each prompt 8 times on average, each static arm 2" in (
        markdown(many)
    )
    out = plot(summary, rows, tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_without_a_tuner_arm() -> None:
    text = markdown(summarize(static_rows(), CLASSES))
    assert "## Targets" not in text and "tuner" not in text.split("## Per class")[1]


def test_markdown_without_static_arms_judges_against_baseline_only() -> None:
    rows = [r for r in static_rows() if r["arm"] == "none"]
    rows += [tuner_row(i % 4, "fast-code") for i in range(8)]
    text = markdown(summarize(rows, CLASSES))
    assert "No static arms in this run (`--matrix none`)" in text
    assert "**None**" not in text and "per-class oracle |" not in text
    assert "oracle on the same requests" not in text and "Caution" not in text
    assert "| worst_class_after_convergence |" in text
    assert "| tuner_vs_oracle_after_convergence |" not in text


def documented_fields() -> set[str]:
    """Every backticked name in docs/bench-summary.md's summary.json table."""
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / "bench-summary.md").read_text()
    table = text.split("`summary.json` (schema `spec-tuner/bench/1`):")[1].split("\n###")[0]
    names = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        for name in re.findall(r"`([^`]+)`", cell):
            names.update(re.split(r"[.,]\s*", name.replace("<key>", "").replace("<arm>", "")))
    for cell in re.findall(r"^\|[^|]+\| ([^|]+) \|", table, re.M):
        names.update(re.findall(r"`([a-z_]+)`", cell))
    return {n.strip() for n in names if n.strip()}


def assert_documented(summary: dict[str, object]) -> None:
    fields = documented_fields()
    overall = summary["overall"]
    classes = summary["classes"]
    assert isinstance(overall, dict) and isinstance(classes, dict)
    keys = set(summary) | set(overall) | {k for c in classes.values() for k in c}
    keys |= {k for arms in [overall["arms"]] for a in arms.values() for k in a}
    missing = keys - fields
    assert not missing, f"summary fields missing from docs/bench-summary.md: {sorted(missing)}"


def test_the_docs_document_every_summary_field() -> None:
    rows = static_rows() + [tuner_row(i % 4, "meh") for i in range(8)]
    summary = summarize(rows, CLASSES, meta={"model": "m.gguf", "workload": 4})
    assert_documented(summary)


def challenger_run() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [*static_rows()]
    for k in range(8):
        rows.append(tuner_row(k % 4, "meh") | {"repeat": k})
        rows.append(tuner_row(k % 4, "none") | {"arm": "challenger", "repeat": k})
    return rows


def test_markdown_and_plot_show_the_challenger(tmp_path: Path) -> None:
    rows = challenger_run()
    meta = {"model": "m.gguf", "workload": 4, "challenger_tuning": "/x/other.toml"}
    summary = summarize(rows, CLASSES, meta=meta)
    text = markdown(summary)
    assert "| **challenger, whole run** | 1.000" in text
    assert "Side by side (/x/other.toml, 8 pairs of the same prompt): challenger / tuner" in text
    by_counts = summary["overall"]["challenger_vs_tuner_by_counts"]
    assert by_counts is not None and f"; priced by counts {by_counts:.3f}" in text
    vs_static = summary["overall"]["challenger_vs_best_static_by_counts"]
    assert f"(priced by counts: {vs_static:.3f})." in text
    assert "| challenger | its final variant |" in text
    assert "| target | measured | wanted | met | challenger | met |" in text
    assert "| challenger |" not in text.split("## Overall")[1].split("| **per-class")[0]
    out = plot(summary, rows, tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_document_every_challenger_field() -> None:
    meta = {"model": "m.gguf", "workload": 4, "challenger_tuning": "/x/other.toml"}
    assert_documented(summarize(challenger_run(), CLASSES, meta=meta))


def test_markdown_says_what_else_used_the_machine() -> None:
    rows = static_rows() + [tuner_row(i % 4, "meh") for i in range(8)]
    load = {
        "other_share": 0.12,
        "steal_share": 0.004,
        "other_share_by_quarter": [0.0, 0.45, None, 0.02],
        "worst_interval_other_share": 0.9,
    }
    text = markdown(summarize(rows, CLASSES, meta={"machine": load}))
    assert "- other processes: 12.0% of the machine's CPU during the run (by quarter 0%, " in text
    assert "45%, ?, 2%; worst interval 90%); steal 0.4%" in text
    assert "other processes" not in markdown(summarize(rows, CLASSES))
