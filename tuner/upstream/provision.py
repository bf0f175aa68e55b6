"""Locate a llama-server binary, or build the pinned one of an engine once and cache it.

Order: the binary the user names, one on PATH of the engine asked for, a cached build, a
fresh build. The build downloads the engine's pinned PyPI sdist (``sources``), checks its
hash, builds only the ``llama-server`` target with CMake (CUDA when ``nvcc`` exists;
ggml-cpu's AMX kernels left out, see ``amx_off_flags``) as one static binary, and stores
it under ``<cache>/llama-server/<key>/``. A file lock keeps two processes from building at
once.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from tuner.errors import ProvisionError
from tuner.upstream.build_info import BuildInfo
from tuner.upstream.capabilities import engine_of
from tuner.upstream.patches import apply_patches, patches_tag
from tuner.upstream.sources import ENGINES, LLAMA_CPP, EngineName, Source, source_for

__all__ = [
    "NO_AMX",
    "amx_off_flags",
    "build_key",
    "build_llama_server",
    "built_engines",
    "cached_binary",
    "default_vocab",
    "gpu_count",
    "locate_llama_server",
    "stderr_progress",
    "want_cuda",
]

Progress = Callable[[str], None]
CudaMode = Literal["auto", "on", "off"]


def stderr_progress(message: str) -> None:
    print(f"[spec-tuner] {message}", file=sys.stderr, flush=True)


def gpu_count() -> int:
    """NVIDIA GPUs visible through NVML (0 when there is no driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml raises its own NVMLError tree, or OSError without a driver
        return 0


def want_cuda(mode: CudaMode = "auto") -> bool:
    """Build for CUDA when asked, or in auto mode when nvcc and a GPU are both there.

    nvcc alone is not enough: CPU-only images often ship the toolkit, and a CUDA
    build there takes long and then cannot run.
    """
    if mode != "auto":
        return mode == "on"
    return shutil.which("nvcc") is not None and gpu_count() > 0


# gcc and clang flags that keep ``-march=native`` from compiling ggml-cpu's AMX kernels
NO_AMX = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")


@functools.cache
def amx_off_flags() -> tuple[str, ...]:
    """Compiler flags that leave AMX out of the build, on a CPU that advertises AMX (empty
    elsewhere: ``-march=native`` only turns AMX on where the CPU has it).

    ggml-cpu's AMX matrix kernels in the pinned llama.cpp crash with an illegal instruction
    at their first tile instruction (``tilezero`` in ``tinygemm_kernel_amx``, on a Xeon with
    ``amx_tile``, during Gemma's warm-up): their tile configuration is never loaded as
    written (upstream pull request 26954, open). Without them the same matrix products
    (Q8_0 and Q4 weights) run on the AVX-512 kernels.
    """
    if platform.machine() not in ("x86_64", "AMD64") or "amx_tile" not in _cpu_flags():
        return ()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return ()
    probe = [cc, *NO_AMX, "-march=native", "-E", "-x", "c", os.devnull]
    result = subprocess.run(probe, capture_output=True, check=False)
    return NO_AMX if result.returncode == 0 else ()  # a compiler without AMX compiles none


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def build_key(cuda: bool | None = None, source: Source = LLAMA_CPP) -> str:
    """Cache key: engine, sdist version, the patches applied to it, backend and machine
    architecture (and ``noamx`` where AMX is left out), so that a build made before any of
    these was is not reused."""
    if cuda is None:
        cuda = want_cuda()
    patched = f"-{tag}" if (tag := patches_tag(source.patches)) else ""
    backend = "cuda" if cuda else "cpu"
    key = f"{source.key_prefix}{source.version}{patched}-{backend}-{platform.machine()}"
    return key + "-noamx" if amx_off_flags() else key


def cached_binary(cache_dir: Path, cuda: bool, source: Source = LLAMA_CPP) -> Path:
    return cache_dir / "llama-server" / build_key(cuda, source) / "llama-server"


def built_engines(cache_dir: Path, cuda: CudaMode = "auto") -> list[EngineName]:
    """The engines there is a binary of without building (on PATH or cached), in
    ``ENGINES`` order."""
    use_cuda = want_cuda(cuda)
    on_path = shutil.which("llama-server")
    path_engine = engine_of(Path(on_path)) if on_path else None
    return [
        e
        for e in ENGINES
        if e == path_engine or cached_binary(cache_dir, use_cuda, source_for(e)).is_file()
    ]


def _check_executable(path: Path, what: str) -> Path:
    if not path.is_file():
        raise ProvisionError(f"{what} not found: {path}")
    if not os.access(path, os.X_OK):
        raise ProvisionError(f"{what} is not executable: {path}")
    return path


def locate_llama_server(
    explicit: Path | None,
    cache_dir: Path,
    *,
    engine: EngineName = "llama.cpp",
    build: bool = True,
    cuda: CudaMode = "auto",
    progress: Progress = stderr_progress,
) -> Path:
    """Return a usable llama-server binary, building the engine's when nothing else is
    there. A binary the user names is used whatever its engine."""
    if explicit is not None:
        return _check_executable(explicit.expanduser(), "llama-server")
    on_path = shutil.which("llama-server")
    if on_path and engine_of(Path(on_path)) == engine:
        return Path(on_path)
    source = source_for(engine)
    use_cuda = want_cuda(cuda)
    cached = cached_binary(cache_dir, use_cuda, source)
    if cached.is_file():
        return cached
    if not build:
        flag = "" if engine == "llama.cpp" else f" --engine {engine}"
        raise ProvisionError(
            "no llama-server found: set TUNER_LLAMA_SERVER, put one on PATH, "
            f"or run `tuner provision{flag}` to build it"
        )
    return build_llama_server(cache_dir, cuda=use_cuda, source=source, progress=progress)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_llama_server(
    cache_dir: Path,
    *,
    cuda: bool = False,
    source: Source = LLAMA_CPP,
    progress: Progress = stderr_progress,
) -> Path:
    """Download the engine's pinned sdist and build llama-server into the cache (once)."""
    target = cached_binary(cache_dir, cuda, source)
    with _file_lock(cache_dir / "llama-server" / ".build.lock"):
        if target.is_file():  # another process built it while we waited
            return target
        sdist = _download_sdist(cache_dir / "downloads", source, progress)
        work = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir))
        try:
            tree = _extract_vendor(sdist, source, work, progress)
            apply_patches(tree, source.patches)
            write_build_info(tree, source)
            binary = _cmake_build(tree, work / "build", cuda, progress, source)
            _install(binary, target, cuda, source)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    progress(f"llama-server ready: {target}")
    return target


def llama_cpp_sources(cache_dir: Path, progress: Progress = stderr_progress) -> Path:
    """The pinned llama-cpp-python sdist (llama.cpp sources), downloaded once into the cache."""
    return _download_sdist(cache_dir / "downloads", LLAMA_CPP, progress)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_sdist(dest: Path, source: Source, progress: Progress) -> Path:
    """The engine's sdist, downloaded once and checked against its pinned hash (a file
    that does not match is deleted, never built)."""
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / source.archive
    if not path.is_file():
        _pip_download(dest, source, progress)
    if _sha256(path) != source.sha256:
        path.unlink()
        raise ProvisionError(
            f"{source.archive} does not match its pinned SHA-256 {source.sha256}: deleted; "
            "run again to download it anew"
        )
    return path


def _pip_download(dest: Path, source: Source, progress: Progress) -> None:
    pinned = f"{source.sdist}=={source.version}"
    progress(f"downloading {pinned} ({source.engine} sources, {source.size_mb} MB, once)")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-binary",
        ":all:",
        "--quiet",
        "-d",
        str(dest),
        pinned,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not (dest / source.archive).is_file():
        raise ProvisionError(f"could not download {pinned}: {result.stderr}")


def _extract_vendor(sdist: Path, source: Source, work: Path, progress: Progress) -> Path:
    progress(f"unpacking {source.engine} sources")
    prefix = f"{source.archive.removesuffix('.tar.gz')}/{source.vendor}/"
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise ProvisionError(f"{sdist.name} has no {source.vendor}")
        archive.extractall(work / "src", members=members, filter="data")
    return work / "src" / prefix


def write_build_info(tree: Path, source: Source) -> None:
    """``common/build-info.cpp`` from its template where the tree ships the template
    without the script that fills it (ik_llama.cpp's sdist): the build then finds the
    file made and the server's ``--version`` names the pinned commit."""
    template, target = tree / "common" / "build-info.cpp.in", tree / "common" / "build-info.cpp"
    if target.exists() or not template.is_file():
        return
    if (tree / "common" / "cmake" / "build-info-gen-cpp.cmake").is_file():
        return  # the build writes it itself
    values = {
        "BUILD_NUMBER": "0",
        "BUILD_COMMIT": source.commit,
        "BUILD_COMPILER": "cc",
        "BUILD_TARGET": platform.machine(),
    }
    text = template.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    target.write_text(text)


_PERCENT = re.compile(rb"^\[\s*(\d+)%\]")


def _cmake_build(
    tree: Path, build_dir: Path, cuda: bool, progress: Progress, source: Source = LLAMA_CPP
) -> Path:
    configure = [
        "cmake",
        "-S",
        str(tree),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DBUILD_SHARED_LIBS=OFF",
        f"-DGGML_CUDA={'ON' if cuda else 'OFF'}",
        *source.cmake,
    ]
    if amx_off_flags():  # before -march=native on the command line, so that they hold
        flags = " ".join(amx_off_flags())
        configure += [f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    if shutil.which("cmake") is None:
        raise ProvisionError("cmake is needed to build llama-server (apt-get install cmake g++)")
    progress(f"configuring {source.engine} {source.commit} ({'CUDA' if cuda else 'CPU'})")
    _run_logged(configure, build_dir.parent / "configure.log", progress=None)
    jobs = str(os.cpu_count() or 2)
    about = f"about {source.minutes} min on 2 cores, once"
    progress(f"building {source.engine} llama-server with {jobs} jobs ({about})")
    build = ["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", jobs]
    _run_logged(build, build_dir.parent / "build.log", progress=progress)
    binary = build_dir / "bin" / "llama-server"
    if not binary.is_file():
        raise ProvisionError(f"the build finished without {binary}")
    return binary


def _run_logged(cmd: list[str], log: Path, progress: Progress | None) -> None:
    """Run a build step, keep its log, report percent steps as they pass."""
    started, last = time.monotonic(), -1
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            match = _PERCENT.match(line)
            if progress and match and int(match.group(1)) >= last + 5:
                last = int(match.group(1))
                progress(f"  {last:3d}% built, {time.monotonic() - started:4.0f} s")
        code = proc.wait()
    if code != 0:
        tail = log.read_bytes()[-3000:].decode(errors="replace")
        raise ProvisionError(f"{cmd[0]} failed (exit {code}); log {log}:\n{tail}")


def _install(binary: Path, target: Path, cuda: bool, source: Source = LLAMA_CPP) -> None:
    """Copy the binary into place atomically, with a note of what it is."""
    staging = target.parent.with_name(target.parent.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    shutil.copy2(binary, staging / "llama-server")
    BuildInfo(
        engine=source.engine,
        sdist=f"{source.sdist}=={source.version}",
        commit=source.commit,
        patches=tuple(patch.name for patch in source.patches),
        cuda=cuda,
    ).write(staging)
    shutil.rmtree(target.parent, ignore_errors=True)
    os.replace(staging, target.parent)


def default_vocab(cache_dir: Path, name: str = "llama-spm") -> Path:
    """A llama.cpp test vocabulary (``llama-spm``, ``qwen35``, ...) from the cached sources
    (downloaded once if absent)."""
    from tuner.synthetic.moe import vocab_from_sdist

    return vocab_from_sdist(llama_cpp_sources(cache_dir), cache_dir / "vocab", name)
