"""LocalBlobStore, open_blob_store and CountingBlobStore on real directories."""

from __future__ import annotations

import os
import threading

import pytest

from quarry import errors
from quarry.blob import (
    CountingBlobStore,
    InvalidObjectKey,
    InvalidStorageNamespace,
    LocalBlobStore,
    ObjectNotFound,
    open_blob_store,
    parse_storage_namespace,
)
from quarry.config import load_settings


def test_put_get_exists_delete(tmp_path):
    store = LocalBlobStore(tmp_path)
    assert not store.exists("a/b.bin")
    with pytest.raises(ObjectNotFound) as caught:
        store.get("a/b.bin")
    assert caught.value.reason == "STORAGE_OBJECT_NOT_FOUND"
    assert isinstance(caught.value, errors.NotFound)
    assert store.put("a/b.bin", b"one") is True
    assert store.get("a/b.bin") == b"one"
    assert store.exists("a/b.bin")
    assert store.put("a/b.bin", b"two") is True  # overwrite
    assert store.get("a/b.bin") == b"two"
    assert store.put("a/b.bin", b"three", if_absent=True) is False
    assert store.get("a/b.bin") == b"two"
    store.delete("a/b.bin")
    store.delete("a/b.bin")  # idempotent
    assert not store.exists("a/b.bin")
    assert store.put("a/b.bin", b"four", if_absent=True) is True
    assert store.get("a/b.bin") == b"four"
    assert store.local_path("a/b.bin") == os.path.join(str(tmp_path), "a", "b.bin")
    with open(store.local_path("a/b.bin"), "rb") as fh:
        assert fh.read() == b"four"


def test_durable_store_and_empty_object(tmp_path):
    store = LocalBlobStore(tmp_path, durable=True)
    assert store.put("x/empty", b"", if_absent=True)
    assert store.get("x/empty") == b""


def test_list_by_prefix_skips_temporaries(tmp_path):
    store = LocalBlobStore(tmp_path)
    for key in (
        "_quarry/ranges/a.parquet",
        "_quarry/ranges/b.parquet",
        "_quarry/metaranges/m.parquet",
        "_quarry/rangesX",
        "top",
    ):
        store.put(key, key.encode())
    (tmp_path / "_quarry" / "ranges" / ".quarry-tmp-leftover").write_bytes(b"x")
    assert [k for k, *_ in store.list("_quarry/ranges/")] == [
        "_quarry/ranges/a.parquet",
        "_quarry/ranges/b.parquet",
    ]
    assert [k for k, *_ in store.list("_quarry/ranges")] == [
        "_quarry/ranges/a.parquet",
        "_quarry/ranges/b.parquet",
        "_quarry/rangesX",
    ]
    assert {o.key: o.size for o in store.list("")}["top"] == 3
    assert len(list(store.list(""))) == 5
    assert list(store.list("nothing/")) == []


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", "./a", "a/", "a\\b"])
def test_rejects_keys_escaping_the_namespace(tmp_path, key):
    store = LocalBlobStore(tmp_path)
    with pytest.raises(InvalidObjectKey):
        store.put(key, b"x")


def test_if_absent_has_exactly_one_winner(tmp_path):
    store = LocalBlobStore(tmp_path)
    results: list[bool] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        won = store.put("race/key", f"writer {i}".encode(), if_absent=True)
        with lock:
            results.append(won)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1
    assert store.get("race/key").startswith(b"writer ")
    assert [k for k, *_ in store.list("race/")] == ["race/key"]  # no temp files left


def test_open_blob_store_by_namespace(tmp_path):
    settings = load_settings(env={})
    local = open_blob_store(str(tmp_path / "a"), settings)
    assert isinstance(local, LocalBlobStore) and local.root == str(tmp_path / "a")
    via_url = open_blob_store(f"file://{tmp_path}/b", settings)
    assert isinstance(via_url, LocalBlobStore) and via_url.root == str(tmp_path / "b")
    assert parse_storage_namespace("s3://bucket/some/prefix/") == ("s3", "bucket", "some/prefix")
    assert parse_storage_namespace("s3://bucket") == ("s3", "bucket", "")
    for bad in ("", "relative/dir", "gs://bucket/x", "file://host/x", "s3:///x"):
        with pytest.raises(InvalidStorageNamespace):
            open_blob_store(bad, settings)


def test_s3_store_from_settings_uses_endpoint_and_region():
    settings = load_settings(env={}, s3_endpoint_url="http://127.0.0.1:1", s3_region="eu-west-1")
    store = open_blob_store("s3://bucket/pre/fix", settings)
    assert (store.bucket, store.prefix, store.endpoint_url, store.region) == (
        "bucket",
        "pre/fix/",
        "http://127.0.0.1:1",
        "eu-west-1",
    )


def test_counting_store_counts_by_kind(tmp_path):
    store = CountingBlobStore(LocalBlobStore(tmp_path))
    store.put("k", b"12345")
    store.put("k", b"x", if_absent=True)
    store.get("k")
    store.exists("k")
    list(store.list(""))
    store.delete("k")
    assert store.local_path("k") is not None
    assert store.counts == {
        "get": 1,
        "put": 2,
        "exists": 1,
        "delete": 1,
        "list": 1,
        "local_path": 1,
    }
    assert store.reads == 2  # a get and a local_path handed to a reader
    assert store.bytes_written == 5 and store.bytes_read == 5
    store.reset()
    assert sum(store.counts.values()) == 0 and store.reads == 0


def test_counting_store_counts_put_after_sync_as_a_put(tmp_path):
    store = CountingBlobStore(LocalBlobStore(tmp_path))
    store.put_deferred("r", b"12")
    assert store.put_after_sync("m", b"345") is True
    assert store.put_after_sync("m", b"x") is False  # never overwrites
    assert store.counts["put"] == 3
    assert store.bytes_written == 5 and store.keys_written == ["r", "m"]


def test_is_local_is_not_an_operation(tmp_path):
    store = CountingBlobStore(LocalBlobStore(tmp_path))
    assert store.is_local and LocalBlobStore(tmp_path).is_local
    assert sum(store.counts.values()) == 0


def test_sync_never_returns_before_the_callers_files_are_durable(tmp_path, monkeypatch):
    """Two writers share a store: B's sync must wait while A's sync is still fsyncing a file
    B wrote (A took it from the shared pending set)."""
    import threading

    import quarry.blob.local as local

    store = local.LocalBlobStore(tmp_path)
    synced: set[str] = set()
    release = threading.Event()
    a_started = threading.Event()
    real_fsync = local._fsync_file

    def slow_fsync(path):
        a_started.set()
        assert release.wait(10)
        real_fsync(path)
        synced.add(path)

    monkeypatch.setattr(local, "_fsync_file", slow_fsync)
    store.put_deferred("_quarry/ranges/a.parquet", b"a")
    store.put_deferred("_quarry/ranges/b.parquet", b"b")  # "B's" file
    a = threading.Thread(target=store.sync)
    a.start()
    assert a_started.wait(10)
    b_done = threading.Event()
    b = threading.Thread(target=lambda: (store.sync(), b_done.set()))
    b.start()
    assert not b_done.wait(0.2), "B's sync returned while its file was still being synced"
    release.set()
    a.join(10)
    b.join(10)
    assert b_done.is_set()
    assert store.local_path("_quarry/ranges/b.parquet") in synced


def test_put_after_sync_never_shows_the_object_before_the_pending_files_are_durable(
    tmp_path, monkeypatch
):
    """The metarange (put_after_sync) must never become visible, not even for a moment,
    while a range it names (put_deferred) or its own bytes are not yet fsynced: every fsync
    of the batch is held until the test has looked for the object."""
    import threading

    import quarry.blob.local as local

    store = local.LocalBlobStore(tmp_path)
    metarange = "_quarry/metaranges/m.parquet"
    synced: list[str] = []
    seen_early: list[str] = []
    started = threading.Barrier(3, timeout=10)  # the range, the metarange's bytes, the test
    release = threading.Event()
    real_fsync = local._fsync_file

    def held_fsync(path):
        started.wait()
        assert release.wait(10)
        if store.exists(metarange):
            seen_early.append(path)
        real_fsync(path)
        synced.append(path)

    monkeypatch.setattr(local, "_fsync_file", held_fsync)
    store.put_deferred("_quarry/ranges/r.parquet", b"range")
    writer = threading.Thread(target=store.put_after_sync, args=(metarange, b"names r"))
    writer.start()
    started.wait()  # both fsyncs are under way (at once), neither has finished
    assert not store.exists(metarange), "the metarange is visible before its range is durable"
    release.set()
    writer.join(10)
    assert not seen_early
    assert store.get(metarange) == b"names r"
    assert store.local_path("_quarry/ranges/r.parquet") in synced
    assert len(synced) == 2  # the range and the metarange's bytes (before they took its name)
