"""Capabilities are read from real help texts: mainline's, an older layout, and ik_llama.cpp's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tuner.upstream.build_info import BuildInfo
from tuner.upstream.capabilities import parse_capabilities, probe_capabilities
from tuner.upstream.patches import COUNT_EMITTED

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


def test_ik_llama_cpp_is_told_from_its_help_with_its_own_spec_type_list() -> None:
    """ik_llama.cpp 55d3c05 as built by ``tuner provision --engine ik_llama.cpp``: its
    version line has no build number words, its spec types are spelled ``ngram - mod``,
    and a draft model (``-md``) is the one type its ``--spec-type`` list leaves out."""
    caps = load("ik-55d3c05")
    assert caps.engine == "ik_llama.cpp"
    assert caps.commit == "55d3c05" and caps.build == 0
    assert caps.spec_types == {
        "none",
        "ngram-cache",
        "ngram-simple",
        "ngram-map-k",
        "ngram-map-k4v",
        "ngram-mod",
        "draft-simple",
    }
    assert caps.old_draft_flags and not caps.new_spec_flags
    assert not caps.router and caps.autotune and caps.metrics
    assert caps.has_flag("--spec-ngram-size-n") and caps.has_flag("-mtp")


def test_mainline_builds_are_not_taken_for_ik_llama_cpp() -> None:
    for name in ("0c1e570", "old-2025"):
        caps = load(name)
        assert caps.engine == "llama.cpp" and not caps.autotune


def test_a_current_ik_llama_cpp_speaks_its_stage_dialect() -> None:
    """ik_llama.cpp 8337e4c (August 2026), built from its repository: ``--spec-type
    TYPE[:k=v,...]`` with its own type names (``draft``, ``mtp``) read as spec-tuner's, the
    per-type and ``--draft-*`` flags gone, its autotune still there."""
    caps = load("ik-8337e4c")
    assert caps.engine == "ik_llama.cpp" and caps.commit == "8337e4c"
    assert caps.stages and not caps.old_draft_flags
    assert {"none", "ngram-mod", "ngram-simple", "draft-simple", "draft-mtp"} <= caps.spec_types
    assert "suffix" in caps.spec_types and "draft" not in caps.spec_types
    assert caps.autotune and not load("ik-55d3c05").stages


def test_a_current_ik_llama_cpp_answer_gives_its_draft_counts() -> None:
    """A whole answer of 8337e4c to ``speculative.n_max`` 4 (recorded from the build): its
    ``timings`` keep the draft counts where the records read them, beside the new
    ``draft_by_depth``; it drafted 4 in its one round, never more than the request's n_max."""
    import json

    from tuner.proxy.sse import extract_timings
    from tuner.records import Timings

    answer = json.loads((DATA / "answer-ik-8337e4c.json").read_text())
    timings = Timings.model_validate(extract_timings(answer))
    assert (timings.predicted_n, timings.draft_n, timings.draft_n_accepted) == (24, 4, 2)
    assert len(answer["timings"]["draft_by_depth"]) <= 4


def test_an_ik_build_cuts_its_last_round_unless_built_with_the_fix() -> None:
    """Whether an answer at max_tokens leaves out its last round's drafts is a fact of the
    build: ik_llama.cpp's own code does, the build ``tuner provision`` patches does not."""
    ik = load("ik-55d3c05")
    assert ik.cuts_last_round and not load("ik-8337e4c").patches
    assert not replace(ik, patches=frozenset({COUNT_EMITTED.name})).cuts_last_round
    assert not load("0c1e570").cuts_last_round


def test_only_an_instance_with_batching_slots_takes_a_request_beside_another() -> None:
    """Mainline's default slots decode concurrent requests together; ik_llama.cpp's one slot
    queues them (so joining its variant at the gate would only queue there)."""
    assert load("0c1e570").batches
    assert not load("ik-55d3c05").batches and not load("ik-8337e4c").batches


def test_a_provisioned_binary_is_read_with_its_build_record(tmp_path: Path) -> None:
    """``probe_capabilities`` runs the binary, then takes the commit its tarball build does
    not print and the patches it was built with from the record beside it."""
    binary = tmp_path / "llama-server"
    help_file = DATA / "help-ik-55d3c05.txt"
    binary.write_text(f'#!/bin/sh\n[ "$1" = --help ] && cat {help_file}\nexit 0\n')
    binary.chmod(0o755)
    bare = probe_capabilities(binary)
    assert bare.commit is None and bare.cuts_last_round
    BuildInfo(
        engine="ik_llama.cpp",
        sdist="ik-llama-cpp-python==0.1.5",
        commit="55d3c05",
        patches=(COUNT_EMITTED.name,),
    ).write(tmp_path)
    built = probe_capabilities(binary)
    assert built.commit == "55d3c05" and not built.cuts_last_round
