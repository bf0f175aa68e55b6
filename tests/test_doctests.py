"""Every example in the package's docstrings runs (one had gone stale when a field became
required, unseen because nothing ran it)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tuner

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(tuner.__path__, "tuner.")
    if not m.name.endswith("__main__")  # importing it runs the CLI
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    assert doctest.testmod(module).failed == 0
