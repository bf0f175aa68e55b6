"""The prompt classifier: request body in, class key and features out. No IO."""

from tuner.classify.classes import (
    ClassDefinitions,
    Classification,
    classify,
    load_definitions,
    parents,
)
from tuner.classify.features import Features

__all__ = [
    "ClassDefinitions",
    "Classification",
    "Features",
    "classify",
    "load_definitions",
    "parents",
]
