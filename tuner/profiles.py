"""Calibration profiles: measured costs keyed by model file and hardware fingerprint.

A profile holds the target's decode step time, its verify-cost curve ``T(n)``
(relative to one decode step), the draft's relative cost when a draft model is
configured, and how predicted and measured speedups compared per variant.
Profiles are JSON, written atomically (temp file, fsync, rename) under
``<state>/profiles/``; ``profiles/`` in the repository holds checked-in ones
and facts about known targets, validated by the same models.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

from tuner.atomic import write_atomic
from tuner.errors import ConfigError
from tuner.model.speedup import interpolated_curve

__all__ = [
    "Profile",
    "TargetFacts",
    "VariantCheck",
    "fingerprint_key",
    "hardware_fingerprint",
    "load_profile",
    "load_target",
    "model_key",
    "save_profile",
]


class VariantCheck(BaseModel):
    """Predicted versus measured speedup of one variant on the calibration workload."""

    model_config = ConfigDict(frozen=True)

    variant: str
    flags: list[str]
    requests: int
    tokens: int
    alpha: float | None
    rounds: int
    mean_draft: float | None  # drafted tokens per verify round
    measured_speedup: float
    predicted_speedup: float | None


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_key: str
    model_name: str
    hardware_key: str
    hardware: dict[str, Any]
    build: str | None = None
    created: float = Field(default_factory=time.time)
    decode_ms: float  # one plain decode step of the target
    verify_curve: list[tuple[int, float]]  # (n, T(n) / decode step)
    draft_cost: float | None = None  # draft step / target step, with a draft model
    checks: list[VariantCheck] = Field(default_factory=list)

    def verify(self, n: int) -> float:
        return interpolated_curve(self.verify_curve)(n)


class TargetFacts(BaseModel):
    """Facts about a known target for which no GGUF may be at hand (checked in under profiles/)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    architecture: str
    total_params_b: float
    active_params_b: float
    experts: int
    experts_used: int
    experts_shared: int = 0
    layers: int
    recurrent_layers: int = 0
    expert_fraction: float = Field(ge=0, le=1)
    state_ratio: float = Field(ge=0)
    draft_cost_measured: tuple[float, float] | None = None  # (low, high) c for a draft
    sources: list[str]
    notes: str = ""


def hardware_fingerprint() -> dict[str, Any]:
    """CPU model, cores, memory, and NVIDIA GPUs when NVML answers."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpus: list[dict[str, Any]] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
                gpus.append({"name": str(name), "memory_gib": round(int(memory) / 2**30, 1)})
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no NVML: a CPU machine
        gpus = []
    return {
        "cpu": cpu,
        "cores": psutil.cpu_count(logical=True),
        "ram_gib": round(psutil.virtual_memory().total / 2**30),
        "gpus": gpus,
    }


def fingerprint_key(fingerprint: dict[str, Any]) -> str:
    """A short stable key for a hardware fingerprint."""
    text = json.dumps(fingerprint, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def model_key(path: Path) -> str:
    """File name, size and a hash of the first MiB: stable across copies, cheap to compute."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(2**20))
    digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return f"{path.stem}-{digest.hexdigest()[:12]}"


def _profile_path(directory: Path, model: str, hardware: str) -> Path:
    return directory / f"{model}@{hardware}.json"


def save_profile(directory: Path, profile: Profile) -> Path:
    """Write atomically: a crash leaves the old profile or the new one, never half of one."""
    target = _profile_path(directory, profile.model_key, profile.hardware_key)
    return write_atomic(target, profile.model_dump_json(indent=2) + "\n")


def load_target(name: str, directories: list[Path]) -> TargetFacts:
    """Facts of a known target, from ``<dir>/targets/<name>.json``."""
    for directory in directories:
        path = directory / "targets" / f"{name}.json"
        if path.is_file():
            return TargetFacts.model_validate_json(path.read_text())
    known = known_targets(directories)
    raise ConfigError(f"no facts for target {name!r}; known: {', '.join(known) or 'none'}")


def known_targets(directories: list[Path]) -> list[str]:
    """The names ``load_target`` finds in these directories."""
    return sorted({p.stem for d in directories for p in (d / "targets").glob("*.json")})


SHIPPED_PROFILES = Path(__file__).resolve().parents[1] / "profiles"  # a checkout's profiles/


def profile_dirs(state_dir: Path) -> list[Path]:
    """Where profiles are looked up: the state dir, then a checkout's profiles/."""
    return [state_dir / "profiles", SHIPPED_PROFILES]


def load_profile(directories: list[Path], model: str, hardware: str) -> Profile | None:
    """The first profile found for this model and hardware, searching the directories in order."""
    for directory in directories:
        path = _profile_path(directory, model, hardware)
        if path.is_file():
            return Profile.model_validate_json(path.read_text())
    return None
