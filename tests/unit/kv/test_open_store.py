"""open_store(url) picks the backend named by the URL."""

from __future__ import annotations

import pytest

from quarry import errors
from quarry.kv import open_store
from quarry.kv.dynamodb import DynamoDBStore
from quarry.kv.memory import MemoryStore
from quarry.kv.sqlite import SQLiteStore


def test_memory():
    assert isinstance(open_store("memory://"), MemoryStore)


def test_sqlite_absolute_and_relative_paths(tmp_path, monkeypatch):
    absolute = open_store(f"sqlite://{tmp_path}/sub/abs.db")
    assert isinstance(absolute, SQLiteStore) and absolute.path == f"{tmp_path}/sub/abs.db"
    absolute.set(b"quarry", b"k", b"v")  # parent directory was created
    absolute.close()

    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite://data/rel.db")
    assert relative.path == "data/rel.db"
    relative.close()
    assert (tmp_path / "data" / "rel.db").exists()


def test_dynamodb_parameters():
    s = open_store(
        "dynamodb://my-table?endpoint_url=http://127.0.0.1:1&region=eu-west-1&create_table=false"
    )
    assert isinstance(s, DynamoDBStore) and s.table_name == "my-table"
    assert s.client.meta.region_name == "eu-west-1"
    assert s.client.meta.endpoint_url == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    "url",
    [
        "nosuch://x",
        "sqlite://",
        "dynamodb://",
        "dynamodb://t?endpont_url=x",
        "dynamodb://t?create_table=maybe",
        "quarry://",
    ],
)
def test_bad_urls(url):
    with pytest.raises(errors.InvalidArgument):
        open_store(url)
