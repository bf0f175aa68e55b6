"""The provisioned llama-server's capabilities, read by running it."""

from __future__ import annotations

import json

import pytest

from tuner.settings import Settings
from tuner.upstream.build_info import BUILD_INFO
from tuner.upstream.capabilities import probe_capabilities
from tuner.upstream.provision import locate_llama_server
from tuner.upstream.sources import IK_LLAMA_CPP, LLAMA_CPP

pytestmark = pytest.mark.llama


def test_the_provisioned_build_knows_its_commit() -> None:
    """Built from a tarball, llama-server says "commit unknown"; the commit comes from the
    provisioned build's record next to it (what bench summaries and calibrations name)."""
    binary = locate_llama_server(None, Settings().cache_dir, build=False)
    caps = probe_capabilities(binary)
    assert caps.engine == "llama.cpp" and caps.router and "ngram-mod" in caps.spec_types
    info = binary.parent / BUILD_INFO
    if info.is_file():  # our own build (not one on PATH or named by the user)
        assert json.loads(info.read_text())["commit"] == LLAMA_CPP.commit
        assert caps.commit == LLAMA_CPP.commit
    else:
        assert caps.commit is None or len(caps.commit) >= 7


def test_the_provisioned_ik_llama_cpp_is_told_apart_by_its_own_help() -> None:
    """``tuner provision --engine ik_llama.cpp`` builds it under its own key; what it is
    comes from running it, not from that path."""
    binary = locate_llama_server(None, Settings().cache_dir, engine="ik_llama.cpp", build=False)
    caps = probe_capabilities(binary)
    assert caps.engine == "ik_llama.cpp" and caps.commit == IK_LLAMA_CPP.commit
    assert not caps.router and caps.autotune and "ngram-mod" in caps.spec_types
    assert json.loads((binary.parent / BUILD_INFO).read_text())["engine"] == "ik_llama.cpp"
    # built with the fix that keeps a cut answer's last round (tests/integration/
    # test_speculation_real.py checks its answers)
    assert not caps.cuts_last_round
