"""Optional features and the extra that installs each: a single-box daemon needs neither
plots nor PostgreSQL, so ``matplotlib`` and ``psycopg`` are extras (``make serve`` and
``make test`` install both). A feature whose extra is missing says which to install."""

from __future__ import annotations

import importlib.util

from tuner.errors import ConfigError

__all__ = ["EXTRAS", "require"]

# module -> (extra, what needs it)
EXTRAS = {
    "matplotlib": ("plot", "plots (tuner report --plot, tuner bench)"),
    "psycopg": ("fleet", "a fleet's shared storage (TUNER_STORAGE_URL, report --storage-url)"),
}


def require(module: str) -> None:
    """Raise ``ConfigError`` (exit 2) naming the extra when ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        extra, feature = EXTRAS[module]
        raise ConfigError(
            f"{feature} needs {module}, which is not installed: pip install 'spec-tuner[{extra}]'"
        )
