"""The README's configuration table names every setting, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.settings import Settings

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_setting_is_documented() -> None:
    rows = re.findall(r"^\| `TUNER_([A-Z_]+)` \| `([a-z_]+)` \|", README.read_text(), re.M)
    assert {env.lower() for env, _ in rows} == set(Settings.model_fields)
    assert all(env.lower() == key for env, key in rows)
