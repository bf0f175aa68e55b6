"""Every example in the package's docstrings runs (one had gone stale when a field became
required, unseen because nothing ran it)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest
from structlog.testing import capture_logs

import tuner

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tuner.__path__, "tuner.")
    if not m.name.endswith("__main__")  # importing it runs the CLI
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    with capture_logs():  # an example's return value is checked, not what it logs
        assert doctest.testmod(module).failed == 0


def test_every_package_is_walked() -> None:
    """Each folder of the package is a regular package, so its examples run too (a folder
    without ``__init__.py`` is skipped by the walk, and its examples went stale unseen)."""
    root = Path(tuner.__file__).parent
    folders = {p.parent for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    assert all((folder / "__init__.py").is_file() for folder in folders)
