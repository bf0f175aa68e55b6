"""The record ``tuner provision`` writes beside a binary it built (``build-info.json``): the
engine, the source it came from, its commit and the patches applied to it. A binary found
on PATH or named by the user has none; tarball builds print "commit unknown", so the commit
comes from here.

Version 1 (before patches) had no ``version`` key and reads as a build without patches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.upstream.sources import EngineName

__all__ = ["BUILD_INFO", "BuildInfo", "read_build_info"]

BUILD_INFO = "build-info.json"


class BuildInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: Literal[2] = 2
    engine: EngineName
    sdist: str  # "name==version"
    commit: str = Field(pattern=r"^[0-9a-f]{7,40}$")
    patches: tuple[str, ...] = ()  # ``Patch.name`` of each applied
    cuda: bool = False

    def write(self, folder: Path) -> None:
        (folder / BUILD_INFO).write_text(self.model_dump_json(indent=2) + "\n")


def _migrate(data: Any) -> Any:
    """Bring an older record to the current version (version 1: no key, no patches)."""
    if isinstance(data, dict) and "version" not in data:
        return {**data, "version": 2, "patches": []}
    return data


def read_build_info(binary: Path) -> BuildInfo | None:
    """The record beside ``binary``, or None where there is none or it does not read."""
    try:
        data = json.loads((binary.parent / BUILD_INFO).read_text())
        return BuildInfo.model_validate(_migrate(data))
    except (OSError, ValueError, ValidationError):
        return None
