"""A peer build's arms: naming them, their command lines, and their ratios in the summary."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.bench.test_analyse import CLASSES, static_rows, tuner_row
from tests.bench.test_render import assert_documented
from tuner.bench.analyse import summarize
from tuner.bench.peers import parse_peer_arm, peer_argv, peer_env, peer_options
from tuner.bench.render import markdown
from tuner.errors import ConfigError
from tuner.settings import Settings


def test_a_peer_arm_is_a_name_and_its_flags() -> None:
    assert parse_peer_arm("mod=--spec-type ngram-mod --spec-autotune") == (
        "peer:mod",
        ("--spec-type", "ngram-mod", "--spec-autotune"),
    )
    assert parse_peer_arm("quoted=--x 'a b'") == ("peer:quoted", ("--x", "a b"))


@pytest.mark.parametrize("text", ["no-flags", "=--spec-type x", "a b=--x", "a:b=--x", "x=--y 'z"])
def test_a_peer_arm_that_cannot_be_read_is_a_clear_error(text: str) -> None:
    with pytest.raises(ConfigError, match="--peer-arm"):
        parse_peer_arm(text)


def test_the_peers_own_baseline_is_not_an_arm_to_name() -> None:
    with pytest.raises(ConfigError, match="always there"):
        parse_peer_arm("none=--spec-type none")


def test_peer_options_are_checked_before_anything_starts(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("")
    assert peer_options(None, []) == (None, ())
    assert peer_options(str(binary), ["a=--x"]) == (binary.resolve(), (("peer:a", ("--x",)),))
    with pytest.raises(ConfigError, match="needs --peer"):
        peer_options(None, ["a=--x"])
    with pytest.raises(ConfigError, match="no such file"):
        peer_options(str(tmp_path / "missing"), [])
    with pytest.raises(ConfigError, match="used twice"):
        peer_options(str(binary), ["a=--x", "a=--y"])


def test_a_peer_server_gets_this_builds_model_context_threads_and_one_slot(
    tmp_path: Path,
) -> None:
    settings = Settings(ctx_size=2048, threads=3, server_args=["--ours-only"])
    argv = peer_argv(tmp_path / "srv", settings, tmp_path / "m.gguf", ["--spec-autotune"], 9)
    assert argv[0] == str(tmp_path / "srv") and argv[-1] == "--spec-autotune"
    flags = " ".join(argv)
    assert "--ctx-size 2048" in flags and "--threads 3" in flags and "-np 1" in flags
    assert "--port 9" in flags and f"-m {tmp_path / 'm.gguf'}" in flags
    assert "--ours-only" not in flags  # this build's extra flags may not exist in the peer's


def test_a_peer_finds_the_shared_libraries_beside_its_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/lib")
    env = peer_env(tmp_path / "llama-server")
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path.resolve()}:/opt/lib"
    assert env["PATH"] == os.environ["PATH"]
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert peer_env(tmp_path / "llama-server")["LD_LIBRARY_PATH"] == str(tmp_path.resolve())


def peer_rows() -> list[dict[str, Any]]:
    """The peer decodes twice as fast as this build; its arm doubles its own speed on code."""
    rows = []
    for item in range(4):
        rows.append({"arm": "peer:none", "item": item, "tokens": 100, "ms": 500, "repeat": 0})
        fast = 250 if CLASSES[item] == "code" else 500
        rows.append(
            {
                "arm": "peer:auto",
                "item": item,
                "tokens": 100,
                "ms": fast,
                "repeat": 0,
                "drafted": 40,
                "accepted": 30,
            }
        )
    return rows


def test_a_peer_arm_is_read_against_the_peers_own_baseline() -> None:
    rows = static_rows() + peer_rows() + [tuner_row(i % 4, "fast-code") for i in range(8)]
    meta = {"peer": "/p/llama-server", "peer_arms": {"peer:auto": "--spec-autotune"}}
    summary = summarize(rows, CLASSES, meta=meta)
    overall = summary["overall"]
    assert "peer:auto" not in summary["static_arms"] and overall["best_static"] == "fast-code"
    peers = overall["peers"]
    assert peers["baseline_tok_s"] == 200.0  # 100 tokens in 0.5 s, not over this build's none
    auto = peers["arms"]["peer:auto"]
    # code twice as fast, prose the same, over equal time: 4 / 3
    assert auto["ratio"] == pytest.approx(4 / 3, abs=1e-3) and auto["alpha"] == 0.75
    assert summary["classes"]["code"]["peers"]["arms"]["peer:auto"]["ratio"] == 2.0
    assert summary["classes"]["prose"]["peers"]["arms"]["peer:auto"]["ratio"] == 1.0
    assert_documented(summary)
    text = markdown(summary)
    assert "## Peer: /p/llama-server" in text and "200.0 tok/s" in text
    tuner = overall["tuner_ratio"]
    assert "| peer:auto | `--spec-autotune` | 1.333" in text
    assert f"| {tuner / auto['ratio']:.3f} |" in text


def test_a_run_without_the_peers_baseline_has_no_peer_ratios() -> None:
    rows = static_rows() + [r for r in peer_rows() if r["arm"] != "peer:none"]
    summary = summarize(rows, CLASSES)
    assert summary["overall"]["peers"] == {} and "## Peer" not in markdown(summary)


def test_the_engines_own_autotune_arms_are_summed_up_beside_the_tuner() -> None:
    """ik_llama.cpp's --spec-autotune runs as ``peer:autotune-<type>`` arms of its own
    binary: the summary names the engine, each autotune arm's ratio, the tuner over the best
    of them and the tuner's decode speed."""
    rows = static_rows() + peer_rows() + [tuner_row(i % 4, "fast-code") for i in range(8)]
    for row in rows:
        if row["arm"] == "peer:auto":
            row["arm"] = "peer:autotune-ngram-mod"
    summary = summarize(rows, CLASSES, meta={"engine": "ik_llama.cpp"})
    overall = summary["overall"]
    assert overall["engine"] == "ik_llama.cpp"
    assert overall["autotune"] == {"ngram-mod": pytest.approx(4 / 3, abs=1e-3)}
    tuner = overall["tuner_ratio"]
    assert overall["tuner_vs_best_autotune"] == pytest.approx(tuner / (4 / 3), abs=1e-3)
    assert overall["tuner_tok_s"] == pytest.approx(tuner * overall["baseline_tok_s"], abs=0.01)
    assert_documented(summary)
    text = markdown(summary)
    assert "engine ik_llama.cpp" in text and "Tuner / the engine's best autotune arm" in text
