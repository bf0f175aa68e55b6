from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.daemon.plan import tuning_config
from tuner.errors import ConfigError
from tuner.settings import Settings, load_settings, retired_in_environment


def test_the_shipped_shares_differ_per_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per class 0.01 (measured with every variant loaded), one instance 0.03 (reloads)."""
    monkeypatch.delenv("TUNER_TUNING_FILE", raising=False)
    config = tuning_config(Settings())
    assert config.budget.explore_share == 0.01
    assert config.single.explore_share == 0.03
    assert config.seed is None


def test_the_share_and_the_seed_are_the_tuning_files_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``TUNER_EXPLORE_SHARE`` and ``TUNER_SEED`` are no longer read (the daemon says so);
    in a config file they are refused, naming where they went."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text("seed = 7\n[budget]\nexplore_share = 0.2\n")
    monkeypatch.setenv("TUNER_TUNING_FILE", str(tuning))
    monkeypatch.setenv("TUNER_EXPLORE_SHARE", "0")
    config = tuning_config(Settings())
    assert (config.budget.explore_share, config.seed) == (0.2, 7)
    assert retired_in_environment() == [
        "TUNER_EXPLORE_SHARE is no longer read: set the tuning file's [budget] explore_share"
    ]
    old = tmp_path / "spec-tuner.toml"
    old.write_text("seed = 3\n")
    with pytest.raises(ConfigError, match="seed=3: no longer a setting: set the tuning file"):
        load_settings(old)


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


def test_an_override_for_no_class_is_refused_at_start_with_its_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``prose`` is a content type, not a class (its group is ``text``): an override for it
    would do nothing, so the tuning file is refused, naming it; class keys and the levels
    above them are taken."""
    tuning = tmp_path / "tuning.toml"
    monkeypatch.setenv("TUNER_TUNING_FILE", str(tuning))
    tuning.write_text('[overrides.prose]\noff = true\n[overrides."code/echo"]\noff = true\n')
    with pytest.raises(ConfigError, match="'prose'") as refused:
        tuning_config(Settings())
    assert "'code/echo'" not in str(refused.value)
    tuning.write_text('[overrides.text]\noff = true\n[overrides."code/echo/greedy"]\noff = true\n')
    assert set(tuning_config(Settings()).overrides) == {"text", "code/echo/greedy"}


@pytest.mark.parametrize("command", ["variants", "serve"])
def test_tuner_refuses_an_override_for_no_class(tmp_path: Path, command: str) -> None:
    """As a user runs it: ``tuner variants`` and ``tuner serve`` exit non-zero naming it."""
    tuning = tmp_path / "tuning.toml"
    tuning.write_text("[overrides.prose]\noff = true\n")
    env = {**os.environ, "TUNER_TUNING_FILE": str(tuning), "TUNER_STATE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "tuner", command],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode != 0
    assert "prose" in done.stderr


IK_HELP = Path(__file__).parents[1] / "upstream" / "data" / "help-ik-55d3c05.txt"


@pytest.mark.parametrize("honoured", [True, False])
def test_pool_members_share_an_instance_where_the_engine_takes_settings_per_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, honoured: bool
) -> None:
    """ik_llama.cpp: variants that differ only in n_max / n_min share one process when the
    probe found the fields honoured; otherwise each runs with its own --draft-max."""
    from tuner.daemon import plan
    from tuner.tuning.variants import parse_name
    from tuner.upstream.capabilities import parse_capabilities
    from tuner.upstream.launch import Prepared

    asked: list[list[str]] = []

    def probe(argv: object, binary: Path, cache_dir: Path) -> bool:
        assert callable(argv)
        asked.append(argv(1234))
        return honoured

    monkeypatch.setattr(plan, "honours_request_fields", probe)
    caps = parse_capabilities(IK_HELP.read_text())
    prepared = Prepared(Path("/bin/llama-server"), caps, tmp_path / "m.gguf", None)
    names = ["none", "ngram-mod.match12.max16", "ngram-mod.match12.max64", "ngram-simple.n3.m16"]
    settings = Settings(state_dir=tmp_path, ctx_size=4096, spec_args=["--threads-draft", "1"])
    members = {
        m.name: m for m in plan.pool_members([parse_name(n) for n in names], settings, prepared)
    }
    (command,) = asked  # the probe: an n-gram instance of this model, on a small context
    assert command[:3] == ["/bin/llama-server", "-m", str(tmp_path / "m.gguf")]
    assert "ngram-simple" in command and command[command.index("--ctx-size") + 1] == "1024"
    small, large = members["ngram-mod.match12.max16"], members["ngram-mod.match12.max64"]
    assert (small.flags == large.flags) is honoured
    assert "--threads-draft" in small.flags and "--threads-draft" not in members["none"].flags
    if honoured:
        assert small.fields == {"speculative.n_max": 16, "speculative.n_min": 12}
        assert members["ngram-simple.n3.m16"].fields == {"speculative.n_max": 16}
    else:
        assert not small.fields and "--draft-max" in large.flags
    assert not members["none"].fields
