"""The provisioned llama-server's capabilities, read by running it."""

from __future__ import annotations

import json

import pytest

from tuner.settings import Settings
from tuner.upstream.capabilities import BUILD_INFO, probe_capabilities
from tuner.upstream.provision import LLAMA_CPP_COMMIT, locate_llama_server

pytestmark = pytest.mark.llama


def test_the_provisioned_build_knows_its_commit() -> None:
    """Built from a tarball, llama-server says "commit unknown"; the commit comes from the
    provisioned build's record next to it (what bench summaries and calibrations name)."""
    binary = locate_llama_server(None, Settings().cache_dir, build=False)
    caps = probe_capabilities(binary)
    assert caps.router and "ngram-mod" in caps.spec_types
    info = binary.parent / BUILD_INFO
    if info.is_file():  # our own build (not one on PATH or named by the user)
        assert json.loads(info.read_text())["commit"] == LLAMA_CPP_COMMIT
        assert caps.commit == LLAMA_CPP_COMMIT
    else:
        assert caps.commit is None or len(caps.commit) >= 7
