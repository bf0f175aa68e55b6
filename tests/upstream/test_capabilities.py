"""Capabilities are read from real help texts: this build's, and an older layout."""

from __future__ import annotations

from pathlib import Path

from tuner.upstream.capabilities import parse_capabilities

DATA = Path(__file__).with_name("data")


def load(name: str):  # type: ignore[no-untyped-def]
    return parse_capabilities(
        (DATA / f"help-{name}.txt").read_text(), (DATA / f"version-{name}.txt").read_text()
    )


def test_current_build_has_spec_types_new_flags_and_router() -> None:
    caps = load("0c1e570")
    assert caps.commit == "0c1e570" and caps.version == "0.5.0-dev" and caps.build == 1
    assert caps.spec_types == {
        "none",
        "draft-simple",
        "draft-eagle3",
        "draft-mtp",
        "draft-dflash",
        "draft-dspark",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "ngram-cache",
    }
    assert caps.new_spec_flags and not caps.old_draft_flags
    assert caps.router and caps.metrics
    for flag in ("--alias", "-a", "--no-webui", "--spec-ngram-mod-n-match", "-md"):
        assert caps.has_flag(flag), flag


def test_older_build_uses_old_draft_flags() -> None:
    caps = load("old-2025")
    assert caps.build == 4567 and caps.commit == "abc1234"
    assert caps.old_draft_flags and not caps.new_spec_flags
    assert not caps.router
    assert caps.spec_types == {"none", "draft-simple"}
    assert caps.has_flag("--draft-p-min") and caps.has_flag("--metrics")


def test_garbage_help_gives_empty_capabilities() -> None:
    caps = parse_capabilities("usage: something else\n", "")
    assert not caps.flags and not caps.spec_types and caps.build is None


def test_a_build_without_git_reports_its_version_but_no_commit() -> None:
    help_text = (DATA / "help-0c1e570.txt").read_text()
    caps = parse_capabilities(help_text, "version: 0.5.0-dev (build 0, commit unknown)\n")
    assert caps.version == "0.5.0-dev" and caps.build == 0 and caps.commit is None
    assert caps.router and "ngram-mod" in caps.spec_types
