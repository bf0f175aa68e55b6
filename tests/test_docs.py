"""The docs: every setting in the configuration table; a short README, links in the repo."""

from __future__ import annotations

import re
from pathlib import Path

from tuner.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "configuration.md"


def test_every_setting_is_documented() -> None:
    rows = re.findall(r"^\| `TUNER_([A-Z_]+)` \| `([a-z_]+)` \|", CONFIGURATION.read_text(), re.M)
    assert {env.lower() for env, _ in rows} == set(Settings.model_fields)
    assert all(env.lower() == key for env, key in rows)


def test_the_readme_is_a_short_page_whose_links_stay_in_the_repo() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 300
    for page in pages:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            assert "://" not in target, (page.name, target)
            assert (page.parent / target).exists(), (page.name, target)
