from __future__ import annotations

from pathlib import Path

import pytest

from tuner.settings import Settings
from tuner.tuning.plan import tuning_config


def test_the_shipped_shares_differ_per_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per class 0.01 (measured with every variant loaded), one instance 0.03 (reloads)."""
    monkeypatch.delenv("TUNER_EXPLORE_SHARE", raising=False)
    monkeypatch.delenv("TUNER_TUNING_FILE", raising=False)
    config = tuning_config(Settings())
    assert config.budget.explore_share == 0.01
    assert config.single.explore_share == 0.03


def test_the_setting_overrides_both_shares(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``TUNER_EXPLORE_SHARE`` (e.g. 0 to stop exploring) wins over both of the file's."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text("[budget]\nexplore_share = 0.2\n[single]\nexplore_share = 0.4\n")
    monkeypatch.setenv("TUNER_TUNING_FILE", str(tuning))
    monkeypatch.delenv("TUNER_EXPLORE_SHARE", raising=False)
    config = tuning_config(Settings())
    assert (config.budget.explore_share, config.single.explore_share) == (0.2, 0.4)
    monkeypatch.setenv("TUNER_EXPLORE_SHARE", "0")
    config = tuning_config(Settings())
    assert (config.budget.explore_share, config.single.explore_share) == (0.0, 0.0)
