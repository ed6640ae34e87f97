import pytest

from quarry import errors
from quarry.config import Settings, load_settings, settings_table


def test_defaults_without_environment():
    settings = load_settings(env={})
    assert settings == Settings()
    assert settings.port_of("kv-gateway") == 7401
    assert settings.port_of("range-writer") == 7405
    assert settings.metrics_port_of("committer") == 9403
    assert settings.effective_kv_url.startswith("sqlite:///")
    assert settings.effective_kv_url.endswith("/.quarry/kv.db")


def test_environment_overrides_and_types():
    settings = load_settings(env={"QUARRY_KV_GATEWAY_PORT": "9999",
                                  "QUARRY_KV_LIMITER_ENABLED": "true",
                                  "QUARRY_KV_AMORTIZE_READS": "false",
                                  "QUARRY_KV_URL": "memory://"})
    assert settings.kv_gateway_port == 9999
    assert settings.kv_limiter_enabled is True
    assert settings.kv_amortize_reads is False
    assert settings.effective_kv_url == "memory://"


def test_file_then_environment(tmp_path):
    path = tmp_path / "quarry.toml"
    path.write_text('kv_url = "memory://"\nkv_gateway_port = 8000\nlog_level = "DEBUG"\n')
    settings = load_settings(env={"QUARRY_CONFIG_FILE": str(path),
                                  "QUARRY_KV_GATEWAY_PORT": "8001"})
    assert settings.kv_url == "memory://"
    assert settings.log_level == "DEBUG"
    assert settings.kv_gateway_port == 8001  # the environment wins over the file


def test_bad_values_are_refused_clearly(tmp_path):
    with pytest.raises(errors.InvalidArgument, match="QUARRY_KV_GATEWAY_PORT"):
        load_settings(env={"QUARRY_KV_GATEWAY_PORT": "lots"})
    with pytest.raises(errors.InvalidArgument, match="QUARRY_KV_LIMITER_ENABLED"):
        load_settings(env={"QUARRY_KV_LIMITER_ENABLED": "maybe"})
    path = tmp_path / "bad.toml"
    path.write_text('no_such_setting = 1\n')
    with pytest.raises(errors.InvalidArgument, match="no_such_setting"):
        load_settings(env={"QUARRY_CONFIG_FILE": str(path)})


def test_settings_are_frozen():
    with pytest.raises(Exception):
        Settings().kv_url = "memory://"  # type: ignore[misc]


def test_every_setting_is_documented():
    rows = settings_table()
    assert len(rows) == len(Settings.__dataclass_fields__)
    for env_name, _default, description in rows:
        assert env_name.startswith("QUARRY_")
        assert description, f"{env_name} has no description comment in quarry/config.py"
