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


@pytest.mark.parametrize(
    ("spec_args", "replay"),
    [("--spec-synth-len 2", False), ("--spec-synth-rates 0.5,0.25", False), ("--threads 2", True)],
)
def test_forced_acceptance_turns_replays_off(
    monkeypatch: pytest.MonkeyPatch, spec_args: str, replay: bool
) -> None:
    """A server that accepts drafts at a forced rate makes a replay of the answer's tokens
    meaningless (on the synthetic MoE it crowned ngram-mod variants that lost there)."""
    monkeypatch.delenv("TUNER_TUNING_FILE", raising=False)
    monkeypatch.setenv("TUNER_SPEC_ARGS", spec_args)
    assert tuning_config(Settings()).guard.replay is replay
