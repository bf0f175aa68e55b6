"""What the benchmark scripts share."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit(result: dict[str, Any], out: Path | None, *, quiet: bool = False) -> None:
    """Print the result as JSON (unless quiet) and write it to ``out`` when given."""
    text = json.dumps(result, indent=2)
    if not quiet:
        print(text)
    if out:
        out.write_text(text + "\n")
