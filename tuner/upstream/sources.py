"""The llama-server engines the daemon builds, each from a pinned source a fresh machine reaches.

Both come from PyPI source distributions that vendor the engine's whole tree: mainline
llama.cpp in ``llama-cpp-python`` and ik_llama.cpp (faster CPU kernels, per-request draft
settings, its own per-step autotune) in ``ik-llama-cpp-python``. Each archive is checked
against its SHA-256 before anything in it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from tuner.upstream.patches import COUNT_EMITTED, RELEASE_REFUSED, Patch

__all__ = ["ENGINES", "SOURCES", "EngineName", "EngineSetting", "Source", "source_for"]

EngineName = Literal["llama.cpp", "ik_llama.cpp"]
ENGINES: tuple[EngineName, ...] = get_args(EngineName)
# TUNER_ENGINE: one of them, or "auto": the faster one on this machine, measured
EngineSetting = Literal["auto", "llama.cpp", "ik_llama.cpp"]


@dataclass(frozen=True, slots=True)
class Source:
    """Where one engine's llama-server comes from and how it is configured."""

    engine: EngineName
    sdist: str  # PyPI project
    version: str
    sha256: str
    vendor: str  # the engine's tree inside the archive
    commit: str  # the engine commit that tree is
    size_mb: int
    minutes: int  # a build on 2 cores, to tell the user what to expect
    cmake: tuple[str, ...]  # configure flags beyond the shared ones
    key_prefix: str  # the cache folder's name starts with it
    patches: tuple[Patch, ...] = ()  # applied to the tree before it is built

    @property
    def archive(self) -> str:
        """The file name pip downloads."""
        return f"{self.sdist.replace('-', '_')}-{self.version}.tar.gz"


LLAMA_CPP = Source(
    engine="llama.cpp",
    sdist="llama-cpp-python",
    version="0.3.36",
    sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    vendor="vendor/llama.cpp",
    commit="0c1e570",
    size_mb=77,
    minutes=7,
    cmake=("-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF"),
    key_prefix="",  # the key builds made before there were two engines still match
)

# The sdist lacks the script that writes common/build-info.cpp; the build writes it from
# its template (``provision.write_build_info``). The server is one of its examples. Its
# answers count a verify round's tokens before emitting them, and a refused prompt keeps its
# slot loading it (``patches``).
IK_LLAMA_CPP = Source(
    engine="ik_llama.cpp",
    sdist="ik-llama-cpp-python",
    version="0.1.5",
    sha256="33c67eb99e4dcab5e611050433243815709b8b3067753f9ce18375013cf002ad",
    vendor="vendor/ik_llama.cpp",
    commit="55d3c05",
    size_mb=42,
    minutes=9,
    cmake=("-DLLAMA_BUILD_EXAMPLES=ON", "-DGGML_IQK_FA_ALL_QUANTS=OFF"),
    key_prefix="ik-",
    patches=(COUNT_EMITTED, RELEASE_REFUSED),
)

SOURCES: dict[EngineName, Source] = {s.engine: s for s in (LLAMA_CPP, IK_LLAMA_CPP)}


def source_for(engine: EngineName) -> Source:
    return SOURCES[engine]
