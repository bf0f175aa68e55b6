"""The record beside a provisioned binary: written, read back, and read from its first
version, which had no version key and no patches."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.upstream.build_info import BUILD_INFO, BuildInfo, read_build_info


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    info = BuildInfo(engine="llama.cpp", sdist="llama-cpp-python==0.3.36", commit="0c1e570")
    info.write(tmp_path)
    assert read_build_info(tmp_path / "llama-server") == info


def test_a_first_version_record_reads_as_a_build_without_patches(tmp_path: Path) -> None:
    """What builds made before patches wrote (tuner 0.2.0)."""
    old = {
        "engine": "ik_llama.cpp",
        "sdist": "ik-llama-cpp-python==0.1.5",
        "commit": "55d3c05",
        "cuda": False,
    }
    (tmp_path / BUILD_INFO).write_text(json.dumps(old))
    info = read_build_info(tmp_path / "llama-server")
    assert info is not None and info.version == 2
    assert info.engine == "ik_llama.cpp" and info.commit == "55d3c05" and info.patches == ()


def test_a_missing_or_unreadable_record_is_none(tmp_path: Path) -> None:
    assert read_build_info(tmp_path / "llama-server") is None
    (tmp_path / BUILD_INFO).write_text('{"engine": "ik_llama.cpp", "commit": "not hex"}')
    assert read_build_info(tmp_path / "llama-server") is None
    (tmp_path / BUILD_INFO).write_text("{")
    assert read_build_info(tmp_path / "llama-server") is None
