"""The tuner's declarative defaults: the shipped ``policies/tuning.toml``, validated.

The package reads it as ``tuner/data/tuning.toml``, a link to that one copy (a wheel holds
its content).

Search spaces, exploration budget, guard thresholds, the prior's acceptance
guesses, and user overrides (pin a class to a variant, forbid spec types, force
speculation off). Overrides are looked up along the class's fallback chain, so
an override for ``code`` covers ``code/echo/greedy``.
"""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.classify.classes import ClassDefinitions, parents
from tuner.errors import ConfigError
from tuner.logs import get_logger
from tuner.tuning.variants import PARAMS, parse_name

__all__ = [
    "Budget",
    "Guard",
    "Override",
    "Prior",
    "TuningConfig",
    "check_overrides",
    "load_tuning",
    "tuning_text",
]

log = get_logger(__name__)

ParamValue = int | float


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    explore_share: float = Field(0.01, ge=0.0, le=1.0)
    trial_requests: int = Field(6, ge=1)
    min_trial_requests: int = Field(3, ge=1)
    max_trials: int = Field(12, ge=0)
    patience: int = Field(4, ge=0)
    min_class_requests: int = Field(8, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> Budget:
        if self.min_trial_requests > self.trial_requests:
            raise ValueError("min_trial_requests must not exceed trial_requests")
        return self


class Guard(_Strict):
    confidence: float = Field(0.90, gt=0.5, lt=1.0)
    min_gain: float = Field(1.02, ge=1.0)
    drift_window: int = Field(24, ge=4)
    replay: bool = True  # every answer measures every ngram-simple variant exactly
    replay_mod: bool = True  # ... and, through a simulated table, every ngram-mod variant


class Prior(_Strict):
    alpha_echo: float = Field(0.70, ge=0.0, lt=1.0)
    alpha_fresh: float = Field(0.30, ge=0.0, lt=1.0)
    sampled_scale: float = Field(0.80, ge=0.0, le=1.0)
    enqueue: int = Field(3, ge=0)
    ngram_match: float = Field(0.15, gt=0.0, le=1.0)
    ngram_copy_tokens: float = Field(16.0, ge=1.0)
    # per spec type, relative to the class's guess: n-gram caches and k4v maps draft less
    alpha_scale: dict[str, float] = Field(
        default_factory=lambda: {"ngram-cache": 0.5, "ngram-map-k4v": 0.9}
    )


class Single(_Strict):
    """One variant loaded at a time (router capacity 1): see ``tuner.tuning.runtime.single``."""

    horizon_s: float = Field(600.0, gt=0.0)
    window: int = Field(8, ge=1)
    # share of requests (and of the horizon's decoding) exploration windows may take; its own
    # key: the budget's lower default was measured with every variant loaded, not with reloads
    explore_share: float = Field(0.03, ge=0.0, le=1.0)


class Override(_Strict):
    pin: str | None = None
    off: bool = False
    forbid: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _known(self) -> Override:
        if self.pin is not None:
            parse_name(self.pin)  # ValueError names what is wrong
        unknown = [t for t in self.forbid if t not in PARAMS]
        if unknown:
            raise ValueError(f"forbid: unknown spec type {unknown[0]!r}")
        return self


class TuningConfig(_Strict):
    seed: int | None = None  # the search's seed, for reproducible runs (the bench sets it)
    budget: Budget = Budget()
    guard: Guard = Guard()
    prior: Prior = Prior()
    single: Single = Single()
    search: dict[str, dict[str, list[ParamValue]]] = Field(default_factory=dict)
    overrides: dict[str, Override] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _non_empty(self) -> TuningConfig:
        for spec_type, space in self.search.items():
            for param, values in space.items():
                if not values:
                    raise ValueError(f"search.{spec_type}.{param}: give at least one value")
        return self

    def override_for(self, class_key: str) -> Override:
        """The override that applies to a class: its own, else the nearest parent's.

        ``forbid`` lists add up along the chain; ``pin`` and ``off`` come from the
        most specific entry that sets them.
        """
        pin: str | None = None
        off: bool | None = None
        forbid: list[str] = []
        for key in dict.fromkeys(parents(class_key)):
            found = self.overrides.get(key)
            if found is None:
                continue
            forbid.extend(found.forbid)
            if pin is None and found.pin is not None:
                pin = found.pin
            if off is None and (found.off or found.pin is not None):
                off = found.off
        return Override(pin=pin, off=bool(off), forbid=tuple(dict.fromkeys(forbid)))


def tuning_text(path: Path | None = None) -> str:
    """A tuning file's text; the shipped one's when ``path`` is None."""
    if path is None:
        return files("tuner.data").joinpath("tuning.toml").read_text(encoding="utf-8")
    return path.read_text(encoding="utf-8")


def load_tuning(path: Path | None = None) -> TuningConfig:
    """Read and validate a tuning TOML; the shipped defaults when ``path`` is None."""
    try:
        data: dict[str, Any] = tomllib.loads(tuning_text(path))
        return TuningConfig.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"cannot read the tuning file {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ConfigError(f"invalid tuning file {path or 'tuning.toml'}: {exc}") from exc


def check_overrides(config: TuningConfig, definitions: ClassDefinitions) -> None:
    """Refuse overrides whose key is no class nor a level above one: such an entry would
    silently do nothing (``prose`` is a content type; its group is the class)."""
    known = definitions.levels()
    unknown = sorted(set(config.overrides) - known)
    if unknown:
        names = ", ".join(repr(key) for key in unknown)
        levels = ", ".join(sorted(k for k in known if "/" not in k))
        raise ConfigError(
            f"tuning file: [overrides] {names}: not a class key; keys are a class such as "
            f"'code/echo/greedy' or a level above it ({levels})"
        )
