"""S3BlobStore and CommittedManager against a real S3 API (moto_server), with disk cache."""

from __future__ import annotations

import io
import os

import pytest
from botocore.exceptions import ClientError

from quarry.blob import CountingBlobStore, ObjectNotFound, open_blob_store
from quarry.blob.base import ObjectExists
from quarry.blob.s3 import S3BlobStore
from quarry.committed import CommittedManager, metarange_key
from quarry.committed.metaranges import read_metarange_tree
from quarry.config import load_settings
from quarry.graveler.model import Entry


def entries(n: int, tag: str = "") -> list[Entry]:
    return [
        Entry(
            f"data/{i:05d}.parquet",
            f"s3://lake/{tag}{i}",
            i,
            f"etag{tag}{i}",
            1_700_000_000_000_000 + i,
            "application/parquet",
            {"writer": "spark"} if i % 3 == 0 else None,
        )
        for i in range(n)
    ]


def test_s3_blob_store_round_trip(s3_bucket, moto_endpoint):
    store = S3BlobStore(s3_bucket, "repos/one", endpoint_url=moto_endpoint)
    assert store.local_path("k") is None
    with pytest.raises(ObjectNotFound) as caught:
        store.get("a/b")
    assert caught.value.reason == "STORAGE_OBJECT_NOT_FOUND"
    assert not store.exists("a/b")
    assert store.put("a/b", b"one") is True
    assert store.get("a/b") == b"one" and store.exists("a/b")
    assert store.put("a/b", b"two", if_absent=True) is False  # If-None-Match: *
    assert store.get("a/b") == b"one"
    assert store.put("a/c", b"three", if_absent=True) is True
    assert [o[:2] for o in store.list("a/")] == [("a/b", 3), ("a/c", 5)]
    assert [o[:2] for o in store.list("")] == [("a/b", 3), ("a/c", 5)]
    store.delete("a/b")
    store.delete("a/b")
    assert not store.exists("a/b")
    # Another prefix in the same bucket is another namespace.
    assert list(S3BlobStore(s3_bucket, "repos/two", endpoint_url=moto_endpoint).list("")) == []


class _NoConditionalWrites:
    """A client wrapper behaving like an S3-compatible server without If-None-Match."""

    def __init__(self, inner):
        self.inner = inner
        self.rejected = 0

    def _refuse(self, operation):
        self.rejected += 1
        raise ClientError(
            {
                "Error": {"Code": "NotImplemented", "Message": "nope"},
                "ResponseMetadata": {"HTTPStatusCode": 501},
            },
            operation,
        )

    def put_object(self, **kwargs):
        if "IfNoneMatch" in kwargs:
            self._refuse("PutObject")
        return self.inner.put_object(**kwargs)

    def complete_multipart_upload(self, **kwargs):
        if "IfNoneMatch" in kwargs:
            self._refuse("CompleteMultipartUpload")
        return self.inner.complete_multipart_upload(**kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_conditional_put_falls_back_to_head_then_put(s3_bucket, moto_endpoint):
    real = S3BlobStore(s3_bucket, "fallback", endpoint_url=moto_endpoint)
    client = _NoConditionalWrites(real._client)
    store = S3BlobStore(s3_bucket, "fallback", client=client)
    assert store.put("k", b"1", if_absent=True) is True
    assert store.put("k", b"2", if_absent=True) is False
    assert store.put("j", b"3", if_absent=True) is True
    assert client.rejected == 1  # remembered: asked once
    assert store.get("k") == b"1" and store.get("j") == b"3"


@pytest.mark.parametrize("size", [6, 20 << 20], ids=["one-part", "multipart"])
def test_put_stream_without_conditional_writes_checks_first(s3_bucket, moto_endpoint, size):
    real = S3BlobStore(s3_bucket, "fallback-stream", endpoint_url=moto_endpoint)
    client = _NoConditionalWrites(real._client)
    store = S3BlobStore(s3_bucket, "fallback-stream", client=client)
    body = b"b" * size
    assert store.put_stream("data/new", io.BytesIO(body)).size == size
    assert store.get("data/new") == body
    with pytest.raises(ObjectExists):
        store.put_stream("data/new", io.BytesIO(b"x" * size))
    assert store.get("data/new") == body
    assert client.rejected == 1  # remembered: asked once
    pending = client.list_multipart_uploads(Bucket=s3_bucket, Prefix="fallback-stream/")
    assert pending.get("Uploads", []) == []


def test_manager_over_s3_with_disk_cache(s3_bucket, moto_endpoint, tmp_path):
    settings = load_settings(env={}, s3_endpoint_url=moto_endpoint)
    namespace = f"s3://{s3_bucket}/repo"
    stores: dict[str, CountingBlobStore] = {}

    def opener(ns: str) -> CountingBlobStore:
        stores[ns] = CountingBlobStore(open_blob_store(ns, settings))
        return stores[ns]

    cache = str(tmp_path / "cache")
    writer = CommittedManager(opener, cache, target_range_entries=64)
    data = entries(2000)
    written = writer.write_metarange(namespace, data)
    changed = writer.apply_changes(
        namespace,
        written.metarange_id,
        [(data[10].path, None), ("data/zz", Entry("data/zz", "x", 1, "y"))],
    )
    assert changed.summary.removed == 1 and changed.summary.added == 1
    keys = [k for k, *_ in stores[namespace].inner.list("_quarry/")]
    assert metarange_key(written.metarange_id) in keys
    assert sum(k.startswith("_quarry/ranges/") for k in keys) >= written.ranges_written
    writer.close()

    # A cold manager without a disk cache reads everything from S3.
    remote_only = CommittedManager(opener, None, target_range_entries=64)
    assert list(remote_only.iterate(namespace, written.metarange_id)) == data
    assert stores[namespace].counts["get"] > 1
    remote_only.close()

    # A new process on the same cache dir: served from disk, no S3 reads at all.
    again = CommittedManager(opener, cache, target_range_entries=64)
    assert list(again.iterate(namespace, written.metarange_id)) == data
    assert again.get_entry(namespace, changed.metarange_id, "data/zz").checksum == "y"
    assert stores[namespace].counts["get"] == 0
    assert again.stats.ranges_read == 0 and again.stats.ranges_read_disk > 0
    again.close()

    # First read fills the cache; the second (another manager) hits it.
    fresh_cache = str(tmp_path / "cache2")
    with open_blob_store(namespace, settings) as uncounted:
        pages, _ = read_metarange_tree(uncounted, written.metarange_id)
    first = CommittedManager(opener, fresh_cache, target_range_entries=64)
    assert first.get_entry(namespace, written.metarange_id, data[500].path) == data[500]
    # The metarange (its file, and its index pages when it is a root) and one range.
    assert stores[namespace].counts["get"] == 2 + len(pages)
    second = CommittedManager(opener, fresh_cache, target_range_entries=64)
    assert second.get_entry(namespace, written.metarange_id, data[500].path) == data[500]
    assert stores[namespace].counts["get"] == 0
    first.close()
    second.close()


def test_corrupt_disk_cache_file_is_refetched(s3_bucket, moto_endpoint, tmp_path):
    settings = load_settings(env={}, s3_endpoint_url=moto_endpoint)
    namespace = f"s3://{s3_bucket}/corrupt"
    cache = str(tmp_path / "cache")
    manager = CommittedManager(lambda ns: open_blob_store(ns, settings), cache)
    mr = manager.write_metarange(namespace, entries(10)).metarange_id
    manager.close()
    for root, _dirs, files in os.walk(cache):
        for name in files:
            with open(os.path.join(root, name), "wb") as fh:
                fh.write(b"garbage")
    reader = CommittedManager(lambda ns: open_blob_store(ns, settings), cache)
    assert list(reader.iterate(namespace, mr)) == entries(10)
    reader.close()
