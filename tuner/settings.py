"""One typed settings object, built once in the entry point and passed down.

Sources, highest priority first: keyword arguments (the CLI), environment
variables prefixed ``TUNER_``, an optional TOML file (``--config`` or
``TUNER_CONFIG``), then the defaults below. Nothing else in the package reads
``os.environ``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal

import platformdirs
from pydantic import Field, HttpUrl, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tuner.errors import ConfigError
from tuner.upstream.sources import EngineSetting

__all__ = ["Settings", "load_settings"]

APP_NAME = "spec-tuner"


def _split_args(value: Any) -> Any:
    """Accept extra server args as a shell-quoted string or as a list."""
    if isinstance(value, str):
        return shlex.split(value)
    return value


def _split_keys(value: Any) -> Any:
    """Accept API keys as one comma- or space-separated string, or as a list."""
    if isinstance(value, str):
        return [key for key in value.replace(",", " ").split() if key]
    return value


# settings that moved out of the daemon's settings (0.2.0), and where they are now
RETIRED = {
    "explore_share": "the tuning file's [budget] explore_share",
    "seed": "the tuning file's top-level seed",
}


def retired_in_environment() -> list[str]:
    """A line for each retired ``TUNER_*`` variable still set (the daemon logs them)."""
    return [
        f"TUNER_{name.upper()} is no longer read: set {where}"
        for name, where in RETIRED.items()
        if f"TUNER_{name.upper()}" in os.environ
    ]


class Settings(BaseSettings):
    """Everything the daemon can be told, with its defaults."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="forbid", frozen=True)

    # The proxy.
    host: str = Field("127.0.0.1", description="address the proxy listens on")
    port: int = Field(8088, ge=0, le=65535, description="port the proxy listens on")

    # The upstream llama-server.
    upstream_url: HttpUrl | None = Field(
        None, description="use a llama-server you run yourself at this URL (external mode)"
    )
    llama_server: Path | None = Field(
        None, description="llama-server binary; default: PATH, then a cached build"
    )
    engine: EngineSetting = Field(
        "auto",
        description="the llama-server engine when no binary is named: auto (both built and "
        "measured here; the faster one serves), llama.cpp (mainline) or ik_llama.cpp",
    )
    llama_cuda: Literal["auto", "on", "off"] = Field(
        "auto", description="build llama-server for CUDA: auto = nvcc and a GPU present"
    )
    model: Path | None = Field(None, description="target GGUF; default: Gemma 3 270M Q4_K_M")
    draft_model: Path | None = Field(None, description="draft GGUF for draft-model speculation")
    model_alias: str | None = Field(None, description="model id served; default: file stem")
    server_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="extra llama-server flags, shell-quoted"
    )
    spec_args: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="extra flags for every speculative preset only, shell-quoted "
        "(draft offload, benchmarking switches such as --spec-synth-len)",
    )
    ctx_size: int = Field(
        0,
        description="llama-server context size; 0: the largest the model and memory allow "
        "(up to 32768) without fewer instances loaded",
    )
    threads: int | None = Field(None, ge=1, description="llama-server threads; default: its own")
    startup_timeout_s: float = Field(600.0, gt=0, description="wait this long for /health")
    request_timeout_s: float = Field(600.0, gt=0, description="upstream read timeout")
    # llama-server pings a silent stream every 30 s, so a streaming answer that sends nothing
    # for three pings has a stuck instance, however slow the machine
    stall_timeout_s: float = Field(
        90.0, gt=0, description="a streaming answer silent this long is cut, its instance reloaded"
    )
    drain_timeout_s: int = Field(
        30, ge=0, description="on SIGTERM, wait this long for in-flight requests to finish"
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="largest request body")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="accepted Bearer keys; empty: no authentication"
    )
    max_concurrent: int = Field(
        256, ge=1, description="requests in flight before new ones get 429 with Retry-After"
    )

    classes_file: Path | None = Field(
        None, description="class definitions TOML; default: the shipped tuner/data/classes.toml"
    )

    # The tuner.
    tune: bool = Field(True, description="search and switch variants per class (router mode)")
    tuning_file: Path | None = Field(
        None,
        description="search spaces, budget, guard, overrides; default: policies/tuning.toml",
    )
    max_instances: int = Field(
        12,
        ge=1,
        description="most variants loaded at once (fewer if memory is short); every load "
        "of an evicted variant costs a model load and empties its n-gram tables",
    )
    exclusive_variants: Literal["auto", "on", "off"] = Field(
        "auto",
        description="one variant decoding at a time (auto: on for CPU builds, whose "
        "instances compete for the same cores)",
    )

    # Where things live.
    state_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_state_dir(APP_NAME)),
        description="request records, studies, policies",
    )
    storage_url: str | None = Field(
        None,
        description="PostgreSQL URL a fleet of daemons shares its studies and evidence on "
        "(postgresql://user@host/db); default: local files in the state dir only",
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path(platformdirs.user_cache_dir(APP_NAME)),
        description="llama-server builds and downloads",
    )

    # Logs.
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    _split_server_args = field_validator("server_args", "spec_args", mode="before")(_split_args)
    _split_api_keys = field_validator("api_keys", mode="before")(_split_keys)

    @field_validator("ctx_size")
    @classmethod
    def _context(cls, value: int) -> int:
        if value != 0 and value < 256:
            raise ValueError("ctx_size is 0 (sized for the model) or at least 256")
        return value

    @field_validator("storage_url")
    @classmethod
    def _postgres(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("storage_url must be a postgresql:// URL")
        return value or None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))

    @property
    def records_dir(self) -> Path:
        return self.state_dir / "records"


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Build the settings from overrides, environment and an optional TOML file."""
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"config file not found: {config_file}")

    class _FromFile(Settings):
        model_config = SettingsConfigDict(toml_file=config_file)

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return _FromFile(**given)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, given, config_file)) from exc
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _explain(exc: ValidationError, given: dict[str, Any], config_file: Path | None) -> str:
    """One line per bad value: where it came from (a ``--flag``, ``TUNER_*`` or the config
    file), the setting, what it accepts."""
    lines = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "?"
        env = f"TUNER_{name.upper()}"
        if name in given:
            source = f"--{name.replace('_', '-')}"
        elif env in os.environ:
            source = env
        else:
            source = f"{config_file}: {name}" if config_file else name
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and name in RETIRED:
            message = f"no longer a setting: set {RETIRED[name]}"
        lines.append(f"{source}={error.get('input')!r}: {message}")
    return "\n".join(lines)
