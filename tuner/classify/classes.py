"""Class definitions (data in ``policies/classes.toml``) and the class of a request. Pure.

``classify(body, definitions)`` returns the class key (``code/echo/greedy``) and
the features it came from. ``parents`` gives the fallback chain a class with
too few observations borrows from.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.classify.features import Features, extract
from tuner.classify.prompt import view_of
from tuner.errors import ConfigError

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_DEFINITIONS",
    "FORMS",
    "ClassDefinitions",
    "Classification",
    "classify",
    "is_form",
    "load_definitions",
    "parents",
    "resolve",
]

CONTENT_TYPES = frozenset({"code", "data", "math", "prose", "question", "other"})
DEFAULT_DEFINITIONS = Path(__file__).resolve().parents[1] / "data" / "classes.toml"
ROOT = "all"


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    echo: float = Field(0.5, ge=0, le=1)
    greedy_max_temperature: float = Field(0.01, ge=0)


class Fallback(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    min_requests: int = Field(20, ge=1)


class Split(BaseModel):
    """Optional fourth part of the class key."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    form: bool = False  # chat (messages) and completion (prompt) requests apart


FORMS = ("messages", "prompt")  # the fourth part with ``split.form``: the request's form


class ClassDefinitions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = 1
    thresholds: Thresholds = Thresholds()
    groups: dict[str, list[str]]
    fallback: Fallback = Fallback()
    split: Split = Split()

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
        forms = [f"/{form}" for form in FORMS] if self.split.form else [""]
        return [
            f"{group}/{echo}/{sampling}{form}"
            for group in self.groups
            for echo in ("echo", "fresh")
            for sampling in ("greedy", "sampled")
            for form in forms
        ]


def load_definitions(path: Path | None = None) -> ClassDefinitions:
    path = path or DEFAULT_DEFINITIONS
    try:
        return ClassDefinitions.model_validate(tomllib.loads(path.read_text()))
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
    echo = "echo" if features.echo >= t.echo else "fresh"
    key = f"{definitions.group_of(features.content_type)}/{echo}/{features.sampling}"
    if definitions.split.form:
        key += f"/{FORMS[0] if features.chat else FORMS[1]}"
    return Classification(key, features)


def is_form(key: str) -> bool:
    """Whether a class key is one request form's share of a class (``split.form``).

    >>> is_form("code/echo/greedy/messages"), is_form("code/echo/greedy")
    (True, False)
    """
    return key.rpartition("/")[2] in FORMS


def parents(key: str) -> list[str]:
    """The class and its ancestors, most specific first.

    >>> parents("code/echo/greedy")
    ['code/echo/greedy', 'code/echo', 'code', 'all']
    """
    parts = key.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts), 0, -1)] + [ROOT]


def resolve(key: str, observations: Mapping[str, int], min_requests: int) -> str:
    """The most specific class in the chain with enough observations (else ``all``)."""
    for candidate in parents(key):
        if observations.get(candidate, 0) >= min_requests:
            return candidate
    return ROOT
