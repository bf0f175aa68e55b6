"""The ``tuner`` command line: a thin layer over functions that tests call without argv."""

from tuner.cli.main import main

__all__ = ["main"]
