"""load_credentials / write_credentials: the environment first, then QUARRY_HOME's file,
else none; the file is written mode 0600 and the secret never shows in a repr."""

from __future__ import annotations

import json
import os
import pickle
import stat

import pytest

from quarry.client import Credentials, load_credentials, write_credentials
from quarry.client.credentials import InvalidCredentialsFile
from quarry.spark.common import Connection

ENV = {"QUARRY_ACCESS_KEY_ID": "AKIAQENV", "QUARRY_SECRET_ACCESS_KEY": "env-secret"}


def test_missing_everywhere_is_none(tmp_path):
    assert load_credentials(tmp_path, env={}) is None


def test_the_environment_wins_over_the_file(tmp_path):
    write_credentials(Credentials("AKIAQFILE", "file-secret"), tmp_path)
    assert load_credentials(tmp_path, env=ENV) == Credentials("AKIAQENV", "env-secret")
    assert load_credentials(tmp_path, env={}) == Credentials("AKIAQFILE", "file-secret")


def test_half_the_environment_is_refused(tmp_path):
    with pytest.raises(InvalidCredentialsFile, match="both"):
        load_credentials(tmp_path, env={"QUARRY_ACCESS_KEY_ID": "AKIAQENV"})


def test_the_default_home_is_quarry_home(tmp_path, monkeypatch):
    monkeypatch.setenv("QUARRY_HOME", str(tmp_path))
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    write_credentials(Credentials("AKIAQHOME", "home-secret"))
    assert (tmp_path / "credentials.json").exists()
    assert load_credentials() == Credentials("AKIAQHOME", "home-secret")


def test_written_mode_0600_whatever_the_umask_and_the_old_file(tmp_path):
    """Safety: the secret is never readable by others, not even when an older file was
    world-readable or the umask allows it."""
    path = tmp_path / "credentials.json"
    path.write_text("{}")
    path.chmod(0o666)
    old = os.umask(0)
    try:
        write_credentials(Credentials("AKIAQ1", "s3cret"), tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "access_key_id": "AKIAQ1",
        "secret_access_key": "s3cret",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["credentials.json"]  # no temporary left


def test_a_malformed_file_is_a_clear_error(tmp_path):
    (tmp_path / "credentials.json").write_text('{"access_key_id": "x"}')
    with pytest.raises(InvalidCredentialsFile) as caught:
        load_credentials(tmp_path, env={})
    assert caught.value.reason == "INVALID_CREDENTIALS_FILE"


def test_the_secret_stays_out_of_reprs_but_travels_pickled():
    """Spark ships the Connection to executors in the task closure (pickled); its repr (what
    logs and plans could show) never holds the secret."""
    creds = Credentials("AKIAQ1", "very-secret-value")
    connection = Connection("127.0.0.1:1", "127.0.0.1:2", credentials=creds)
    assert "very-secret-value" not in repr(creds)
    assert "very-secret-value" not in repr(connection) and "very-secret" not in str(connection)
    assert pickle.loads(pickle.dumps(connection)).credentials == creds


def test_the_drivers_connection_carries_its_credentials(tmp_path, monkeypatch):
    from quarry.config import load_settings

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    write_credentials(Credentials("AKIAQDRIVER", "driver-secret"), tmp_path)
    connection = Connection.from_settings(load_settings(env={}, home=str(tmp_path)))
    assert connection.credentials == Credentials("AKIAQDRIVER", "driver-secret")
