"""The SQLite store's file under it: deleted, replaced or damaged while in use.

Safety rule (quarry.kv.sqlite): a write is never acknowledged into a file that is no
longer the store (open connections keep writing into a deleted file, and all of it was
gone at the next start, silently). Damage is DATA_LOSS naming what to do, never INTERNAL.
"""

from __future__ import annotations

import os

import pytest

from quarry import errors
from quarry.kv.sqlite import DatabaseCorrupt, DatabaseFileGone, SQLiteStore

P = b"repo/r"


def test_a_write_after_the_file_was_deleted_is_refused_not_lost(tmp_path):
    path = tmp_path / "kv.db"
    store = SQLiteStore(path)
    store.set(P, b"before", b"1")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{path}{suffix}"):
            os.unlink(f"{path}{suffix}")
    with pytest.raises(DatabaseFileGone) as gone:
        store.set(P, b"after", b"2")
    assert gone.value.code.name == "DATA_LOSS" and str(path) in gone.value.message
    with pytest.raises(DatabaseFileGone):
        store.batch_set([(P, b"after", b"2")])
    store.close()


def test_a_write_after_the_file_was_replaced_is_refused(tmp_path):
    path = tmp_path / "kv.db"
    store = SQLiteStore(path)
    store.set(P, b"k", b"1")
    other = SQLiteStore(tmp_path / "other.db")
    other.close()
    os.replace(tmp_path / "other.db", path)
    with pytest.raises(DatabaseFileGone):
        store.set(P, b"k", b"2")
    store.close()


def test_a_damaged_file_is_data_loss_not_internal(tmp_path):
    path = tmp_path / "kv.db"
    store = SQLiteStore(path)
    store.batch_set([(P, b"k%05d" % i, b"v" * 200) for i in range(2000)])
    store.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as damaged:  # every page after the first: garbage
        damaged.seek(4096)
        damaged.write(b"\xa5" * (size - 4096))
    reopened = None
    with pytest.raises(errors.QuarryError) as caught:
        reopened = SQLiteStore(path)
        reopened.get(P, b"k01000")
    if reopened is not None:
        reopened.close()
    assert isinstance(caught.value, DatabaseCorrupt), caught.value
    assert caught.value.code.name == "DATA_LOSS"


def test_quarry_up_refuses_a_home_whose_store_is_gone(tmp_path):
    """The restart after the KV file was deleted: `quarry up` made a new, empty installation
    (every repository gone, the old admin credentials refused as INVALID_CREDENTIALS)."""
    from quarry.cli.services import lost_store
    from quarry.config import load_settings

    settings = load_settings(env={}, home=str(tmp_path))
    assert lost_store(settings, tmp_path) == ""  # a new home: a first start
    (tmp_path / "credentials.json").write_text("{}")
    why = lost_store(settings, tmp_path)
    assert "kv.db" in why and "credentials.json" in why
    SQLiteStore(tmp_path / "kv.db").close()
    assert lost_store(settings, tmp_path) == ""  # the store is there: a restart
    elsewhere = load_settings(env={}, home=str(tmp_path), kv_url="memory://")
    (tmp_path / "kv.db").unlink()
    assert lost_store(elsewhere, tmp_path) == ""  # not the home's own store
