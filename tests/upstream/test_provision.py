"""How the pinned llama-server is built: AMX left out where the CPU advertises it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.upstream import provision


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
    assert provision.build_key(cuda=False) == f"{provision.SDIST_VERSION}-cpu-x86_64-noamx"
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
    assert provision.build_key(cuda=True) == f"{provision.SDIST_VERSION}-cuda-{arch}"


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
