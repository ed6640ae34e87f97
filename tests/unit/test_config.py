import dataclasses

import pytest

from quarry import errors
from quarry.config import REPOSITORY_CACHE_SECONDS, Settings, load_settings, settings_table
from quarry.graveler.refs import RefManager


def test_defaults_without_environment():
    settings = load_settings(env={})
    assert settings == Settings()
    assert settings.port_of("kv-gateway") == 7401
    assert settings.port_of("range-writer") == 7405
    assert settings.metrics_port_of("committer") == 9403
    assert settings.effective_kv_url.startswith("sqlite:///")
    assert settings.effective_kv_url.endswith("/.quarry/kv.db")


def test_environment_overrides_and_types():
    settings = load_settings(
        env={
            "QUARRY_KV_GATEWAY_PORT": "9999",
            "QUARRY_KV_LIMITER_ENABLED": "true",
            "QUARRY_KV_AMORTIZE_READS": "false",
            "QUARRY_KV_URL": "memory://",
        }
    )
    assert settings.kv_gateway_port == 9999
    assert settings.kv_limiter_enabled is True
    assert settings.kv_amortize_reads is False
    assert settings.effective_kv_url == "memory://"


def test_file_then_environment(tmp_path):
    path = tmp_path / "quarry.toml"
    path.write_text('kv_url = "memory://"\nkv_gateway_port = 8000\nlog_level = "DEBUG"\n')
    settings = load_settings(
        env={"QUARRY_CONFIG_FILE": str(path), "QUARRY_KV_GATEWAY_PORT": "8001"}
    )
    assert settings.kv_url == "memory://"
    assert settings.log_level == "DEBUG"
    assert settings.kv_gateway_port == 8001  # the environment wins over the file


def test_bad_values_are_refused_clearly(tmp_path):
    with pytest.raises(errors.InvalidArgument, match="QUARRY_KV_GATEWAY_PORT"):
        load_settings(env={"QUARRY_KV_GATEWAY_PORT": "lots"})
    with pytest.raises(errors.InvalidArgument, match="QUARRY_KV_LIMITER_ENABLED"):
        load_settings(env={"QUARRY_KV_LIMITER_ENABLED": "maybe"})
    path = tmp_path / "bad.toml"
    path.write_text("no_such_setting = 1\n")
    with pytest.raises(errors.InvalidArgument, match="no_such_setting"):
        load_settings(env={"QUARRY_CONFIG_FILE": str(path)})


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().kv_url = "memory://"  # type: ignore[misc]


def test_every_setting_is_documented():
    rows = settings_table()
    assert len(rows) == len(Settings.__dataclass_fields__)
    for env_name, _default, description in rows:
        assert env_name.startswith("QUARRY_")
        assert description, f"{env_name} has no description comment in quarry/config.py"


def test_descriptions_live_with_the_fields():
    from dataclasses import fields

    from quarry.config import describe_settings

    by_name = {f.name: f for f in fields(Settings)}
    for info in describe_settings():
        assert info.description == by_name[info.name].metadata["description"]
        assert info.env == "QUARRY_" + info.name.upper()
        assert info.type in (str, int, float, bool)
    # One description per setting: a description copied onto its neighbours (every *_PORT
    # once said "Address services bind to") is caught here.
    descriptions = [info.description for info in describe_settings()]
    assert len(set(descriptions)) == len(descriptions)
    port = next(i for i in describe_settings() if i.name == "committer_port")
    assert "port" in port.description and "committer" in port.description


def test_addresses_follow_ports_unless_given():
    settings = load_settings(
        env={
            "QUARRY_KV_GATEWAY_PORT": "9999",
            "QUARRY_COMMITTER_PORT": "9998",
            "QUARRY_COMMITTER_ADDRESS": "elsewhere:7403",
        }
    )
    assert settings.kv_gateway_address == "127.0.0.1:9999"
    assert settings.address_of("kv-gateway") == "127.0.0.1:9999"
    assert settings.address_follows_port("kv-gateway")
    # Given explicitly: kept, whatever the port.
    assert settings.committer_address == "elsewhere:7403"
    assert not settings.address_follows_port("committer")
    assert Settings().branch_manager_address == "127.0.0.1:7402"
    # replace() keeps a derived address derived and an explicit one explicit.
    moved = settings.replace(kv_gateway_port=9000, committer_port=9001)
    assert moved.kv_gateway_address == "127.0.0.1:9000"
    assert moved.committer_address == "elsewhere:7403"
    assert (
        settings.replace(kv_gateway_address="x:1").replace(kv_gateway_port=2).kv_gateway_address
        == "x:1"
    )
    # The dialled host is the listen host when it names one host, else loopback.
    assert Settings(listen_host="0.0.0.0").range_writer_address == "127.0.0.1:7405"
    assert Settings(listen_host="127.0.0.2").range_writer_address == "127.0.0.2:7405"
    assert Settings(listen_host="::1").range_writer_address == "[::1]:7405"


def test_toml_port_moves_the_address(tmp_path):
    path = tmp_path / "quarry.toml"
    path.write_text("range_writer_port = 8123\n")
    settings = load_settings(env={"QUARRY_CONFIG_FILE": str(path)})
    assert settings.range_writer_address == "127.0.0.1:8123"


def test_cache_sizes_reach_the_committed_caches(tmp_path):
    from quarry.committed import CommittedManager

    settings = load_settings(
        env={
            "QUARRY_HOME": str(tmp_path),
            "QUARRY_RANGE_CACHE_BYTES": "1000",
            "QUARRY_METARANGE_CACHE_BYTES": "0",
        }
    )
    manager = CommittedManager.from_settings(settings)
    try:
        assert manager._loader._ranges.max_bytes == 1000
        assert manager._loader._metaranges.max_bytes == 0
    finally:
        manager.close()
    with pytest.raises(errors.InvalidArgument, match="range_cache_bytes must be 0 or more"):
        load_settings(env={"QUARRY_RANGE_CACHE_BYTES": "-1"})


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_span_timeout_must_be_positive(value):
    # 0 would give every span to the coordinator after killing the workers it just started.
    with pytest.raises(errors.InvalidArgument, match="range_writer_span_timeout_seconds"):
        load_settings(env={"QUARRY_RANGE_WRITER_SPAN_TIMEOUT_SECONDS": value})
    assert load_settings(env={}).range_writer_span_timeout_seconds == 600.0


@pytest.mark.parametrize("value", ["0", "1.5", "2"])
def test_a_drop_grace_within_the_repository_cache_refuses_to_start(value):
    # A reader may hold a repository record this long (REPOSITORY_CACHE_SECONDS) and still
    # read the staging tokens it names: the dropper must not delete them before.
    with pytest.raises(errors.InvalidArgument) as refused:
        load_settings(env={"QUARRY_STAGING_DROP_GRACE_SECONDS": value})
    assert "QUARRY_STAGING_DROP_GRACE_SECONDS" in refused.value.message
    assert f"{REPOSITORY_CACHE_SECONDS:g} s" in refused.value.message
    assert load_settings(env={"QUARRY_STAGING_DROP_GRACE_SECONDS": "2.5"})
    assert RefManager.REPOSITORY_TTL_SECONDS == REPOSITORY_CACHE_SECONDS


@pytest.mark.parametrize("text", [b"kv_url = [", b"\xff\xfe", b"a = " + b"[" * 50_000])
def test_a_config_file_that_is_not_toml_names_the_file(tmp_path, text):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(text)
    with pytest.raises(errors.InvalidArgument, match="bad.toml: not valid TOML"):
        load_settings({"QUARRY_CONFIG_FILE": str(bad)})


@pytest.mark.parametrize(
    "address",
    ["kv-gateway:7401", "10.0.0.7:7401", "[::1]:7401", "dns:///kv.example:7401", "unix:/run/kv"],
)
def test_addresses_grpc_can_dial_are_kept_as_given(address):
    assert load_settings({"QUARRY_KV_GATEWAY_ADDRESS": address}).kv_gateway_address == address


def test_retention_rules_nested_too_deeply_are_invalid_rules():
    from quarry.retention import InvalidRetentionRules, RetentionRules

    with pytest.raises(InvalidRetentionRules):
        RetentionRules.from_json("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QUARRY_KV_GATEWAY_PORT", "70000"),
        ("QUARRY_S3_GATEWAY_PORT", "-1"),
        ("QUARRY_CONSOLE_PORT", "65536"),
        ("QUARRY_METRICS_BASE_PORT", "65533"),
        ("QUARRY_METRICS_BASE_PORT", "-1"),
        ("QUARRY_MAX_WORKERS", "0"),
        ("QUARRY_REQUEST_RETENTION_SECONDS", "-1"),
        ("QUARRY_SHUTDOWN_GRACE_SECONDS", "inf"),
        ("QUARRY_LOG_LEVEL", "LOUD"),
        ("QUARRY_HTTP_IDLE_SECONDS", "0"),
        ("QUARRY_KV_GATEWAY_ADDRESS", "kv-gateway"),
        ("QUARRY_COMMITTER_ADDRESS", "committer:70000"),
        ("QUARRY_BRANCH_MANAGER_ADDRESS", "http://branch-manager:7402"),
        ("QUARRY_RANGE_WRITER_ADDRESS", ":7405"),
    ],
)
def test_values_that_would_turn_into_something_else_are_refused_by_name(variable, value):
    """A port out of range was wrapped modulo 65536 (and the banner showed the value given);
    the others failed later with a traceback."""
    with pytest.raises(errors.InvalidArgument) as refused:
        load_settings({variable: value})
    assert variable in refused.value.message or variable.lower()[7:] in refused.value.message
