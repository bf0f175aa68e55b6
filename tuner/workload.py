"""Workload files: one JSON object per line with an ``id`` and a ``prompt`` or ``messages``.

Optional per line: ``max_tokens``, ``temperature``, ``seed`` (sampling seed, so a
sampled line replays the same way), ``class_hint``. Used by
``tuner calibrate`` (and the classifier and bench commands). Errors name the
line. ``DEFAULT_WORKLOAD`` is a copy of the project's development workload,
shipped with the package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from tuner.errors import ConfigError

__all__ = ["DEFAULT_WORKLOAD", "WorkloadItem", "load_workload", "parse_workload"]

DEFAULT_WORKLOAD = Path(__file__).with_name("data") / "dev.jsonl"


class WorkloadItem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    id: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int | None = None
    class_hint: str | None = None

    @model_validator(mode="after")
    def _one_input(self) -> WorkloadItem:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("needs exactly one of 'prompt' or 'messages'")
        return self

    def request(self, max_tokens: int | None = None) -> tuple[str, dict[str, Any]]:
        """The OpenAI endpoint and body that replay this item."""
        body: dict[str, Any] = {
            "max_tokens": max_tokens or self.max_tokens,
            "temperature": self.temperature,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.messages is not None:
            return "/v1/chat/completions", {**body, "messages": self.messages}
        return "/v1/completions", {**body, "prompt": self.prompt}


def parse_workload(lines: list[str], source: str = "<workload>") -> list[WorkloadItem]:
    items: list[WorkloadItem] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(WorkloadItem.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as exc:
            detail = str(exc).splitlines()[0] if isinstance(exc, json.JSONDecodeError) else exc
            raise ConfigError(f"{source}:{number}: {detail}") from exc
    if not items:
        raise ConfigError(f"{source}: no workload items")
    return items


def load_workload(path: Path) -> list[WorkloadItem]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read workload {path}: {exc}") from exc
    return parse_workload(text.splitlines(), str(path))
