from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.settings import load_settings


def test_defaults_listen_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNER_HOST", raising=False)
    settings = load_settings()
    assert settings.host == "127.0.0.1"
    assert settings.upstream_url is None


def test_priority_is_overrides_then_env_then_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "tuner.toml"
    config.write_text('port = 7000\nctx_size = 2048\nmodel = "/m.gguf"\n')
    monkeypatch.setenv("TUNER_CTX_SIZE", "8192")
    settings = load_settings(config, model=Path("/other.gguf"))
    assert settings.port == 7000
    assert settings.ctx_size == 8192
    assert settings.model == Path("/other.gguf")


def test_server_args_are_shell_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_SERVER_ARGS", "--threads 4 --chat-template 'a b'")
    assert load_settings().server_args == ["--threads", "4", "--chat-template", "a b"]


def test_external_mode_from_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_UPSTREAM_URL", "http://127.0.0.1:8080")
    assert str(load_settings().upstream_url) == "http://127.0.0.1:8080/"


@pytest.mark.parametrize("override", [{"port": 70000}, {"log_format": "xml"}, {"nonsense": 1}])
def test_bad_settings_raise_config_error(override: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        load_settings(**override)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml")


def test_a_bad_value_is_one_line_naming_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.errors import ConfigError
    from tuner.settings import load_settings

    monkeypatch.setenv("TUNER_PORT", "abc")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value).startswith("TUNER_PORT='abc': ") and "_FromFile" not in str(
        caught.value
    )
    monkeypatch.delenv("TUNER_PORT")
    config = tmp_path / "spec-tuner.toml"
    config.write_text("ctx_size = 5\n")
    with pytest.raises(ConfigError, match=r"spec-tuner.toml: ctx_size=5: ctx_size is 0"):
        load_settings(config)
    with pytest.raises(ConfigError, match=r"^--port='x': "):
        load_settings(port="x")
