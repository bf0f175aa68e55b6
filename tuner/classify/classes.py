"""Class definitions (data in ``tuner/data/classes.toml``) and the class of a request. Pure.

``classify(body, definitions)`` returns the class key (``code/echo/greedy``) and
the features it came from; a fill-in-the-middle request (``/infill``) is code whose answer
copies its context, so it is always ``code/echo``. ``parents`` gives the chain of levels a
class's evidence counts at, and where a class with too little of its own borrows a policy
from.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.classify.features import Features, extract
from tuner.classify.prompt import is_infill, view_of
from tuner.errors import ConfigError
from tuner.logs import get_logger

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_DEFINITIONS",
    "ClassDefinitions",
    "Classification",
    "classify",
    "load_definitions",
    "parents",
]

CONTENT_TYPES = frozenset({"code", "data", "math", "prose", "question", "other"})
DEFAULT_DEFINITIONS = Path(__file__).resolve().parents[1] / "data" / "classes.toml"
ROOT = "all"

log = get_logger(__name__)


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    echo: float = Field(0.5, ge=0, le=1)
    greedy_max_temperature: float = Field(0.01, ge=0)


class ClassDefinitions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = 1
    thresholds: Thresholds = Thresholds()
    groups: dict[str, list[str]]

    @model_validator(mode="after")
    def _every_type_once(self) -> ClassDefinitions:
        seen = [t for types in self.groups.values() for t in types]
        unknown = set(seen) - CONTENT_TYPES
        if unknown:
            raise ValueError(
                f"unknown content types {sorted(unknown)}; known: {sorted(CONTENT_TYPES)}"
            )
        missing, doubled = CONTENT_TYPES - set(seen), {t for t in seen if seen.count(t) > 1}
        if missing or doubled:
            raise ValueError(
                f"each content type must be in exactly one group (missing {sorted(missing)}, "
                f"repeated {sorted(doubled)})"
            )
        if any("/" in g or g == ROOT for g in self.groups):
            raise ValueError(f"group names may not contain '/' or be {ROOT!r}")
        return self

    def group_of(self, content_type: str) -> str:
        for group, types in self.groups.items():
            if content_type in types:
                return group
        return next(iter(self.groups))

    def all_classes(self) -> list[str]:
        return [
            f"{group}/{echo}/{sampling}"
            for group in self.groups
            for echo in ("echo", "fresh")
            for sampling in ("greedy", "sampled")
        ]

    def levels(self) -> set[str]:
        """Every class key and every level above one (``code/echo``, ``code``, ``all``)."""
        return {level for key in self.all_classes() for level in parents(key)}


def load_definitions(path: Path | None = None) -> ClassDefinitions:
    path = path or DEFAULT_DEFINITIONS
    try:
        data = tomllib.loads(path.read_text())
        return ClassDefinitions.model_validate(data)
    except (OSError, tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ConfigError(f"bad class definitions {path}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Classification:
    key: str
    features: Features


def classify(body: Any, definitions: ClassDefinitions) -> Classification:
    """The class of a request body (chat or completion). Never raises on odd input."""
    safe = body if isinstance(body, dict) else {}
    t = definitions.thresholds
    features = extract(view_of(safe), safe, t.greedy_max_temperature)
    if is_infill(safe):  # code whose answer copies its context: n-gram drafting's best case
        features = replace(features, content_type="code", echo=max(features.echo, t.echo))
    echo = "echo" if features.echo >= t.echo else "fresh"
    key = f"{definitions.group_of(features.content_type)}/{echo}/{features.sampling}"
    return Classification(key, features)


def parents(key: str) -> list[str]:
    """The class and its ancestors, most specific first.

    >>> parents("code/echo/greedy")
    ['code/echo/greedy', 'code/echo', 'code', 'all']
    """
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)] + [ROOT]
