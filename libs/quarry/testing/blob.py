"""The BlobStore contract (libs/quarry/blob/base.py) as an importable suite, like lakeFS's
pkg/block/blocktest: a store that passes it can back committed storage and namespace
ownership, and a fake cannot drift from the real ones. A new store runs it by subclassing
BlobContract with a `kind` fixture (a StoreKind); tests/integration/committed/
test_blob_contract.py runs it for the local directory, S3 (moto_server) and the counting
wrapper."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from quarry import errors
from quarry.blob import CountingBlobStore, ObjectNotFound
from quarry.blob.base import BlobStore, InvalidByteRange, InvalidObjectKey, ObjectExists
from quarry.blob.ownership import MARKER_KEY, claim_namespace
from quarry.blob.s3 import S3BlobStore


@dataclass
class StoreKind:
    """How to open a store of one kind for a namespace name (two names are two namespaces:
    two directories, or two prefixes of one bucket).

    `atomic_if_absent`: concurrent put(if_absent) calls have exactly one winner (moto_server
    lacks If-None-Match, where S3BlobStore falls back to HEAD then PUT). `stream_piece`: the
    exact size put_stream reads its source in, when the store has one. `leftovers(store,
    name)`: what the store keeps beyond its objects (temporary files, unfinished multipart
    uploads); after a failed or refused write it must be empty."""

    name: str
    open: Callable[[str], BlobStore]
    atomic_if_absent: bool = True
    stream_piece: int | None = None
    leftovers: Callable[[BlobStore, str], list[Any]] = lambda store, name: []
    # How many bytes the store has fetched from what backs it so far (a count that only
    # grows), when the test can observe it: a ranged read must fetch only its range.
    fetched: Callable[[BlobStore], int] | None = None


def local_leftovers(root: Path) -> Callable[[BlobStore, str], list[Any]]:
    """`leftovers` of a directory store whose namespaces are folders of `root`: files that
    are no object (the directories made for objects may stay)."""

    def leftovers(store: BlobStore, name: str) -> list[Any]:
        objects = {info.key for info in store.list("")}
        return [
            path
            for path in (root / name).rglob("*")
            if path.is_file() and path.relative_to(root / name).as_posix() not in objects
        ]

    return leftovers


def s3_leftovers(store: BlobStore, name: str) -> list[Any]:
    """`leftovers` of an S3BlobStore: its unfinished multipart uploads."""
    assert isinstance(store, S3BlobStore)
    pending = store._client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix)
    return list(pending.get("Uploads", []))


def thread_bytes_read(store: BlobStore | None = None) -> int:
    """`fetched` of a directory store: the bytes the calling thread has read through
    read(2) and its kin, as the kernel counts them (rchar of /proc/thread-self/io; Linux)."""
    with open("/proc/thread-self/io") as stats:
        for line in stats:
            name, _, value = line.partition(":")
            if name == "rchar":
                return int(value)
    raise AssertionError("/proc/thread-self/io has no rchar")


class S3BytesFetched:
    """`fetched` of an S3BlobStore: the Content-Length of every GetObject answer its client
    received (what S3 sent), counted from the first call on."""

    def __init__(self) -> None:
        self.total = 0
        self._clients: list[Any] = []

    def __call__(self, store: BlobStore) -> int:
        assert isinstance(store, S3BlobStore)
        client = store._client
        if not any(known is client for known in self._clients):
            client.meta.events.register("after-call.s3.GetObject", self._count)
            self._clients.append(client)
        return self.total

    def _count(self, parsed: dict[str, Any], **kwargs: Any) -> None:
        self.total += int(parsed.get("ContentLength") or 0)

    def close(self) -> None:
        for client in self._clients:
            client.meta.events.unregister("after-call.s3.GetObject", self._count)
        self._clients.clear()


class _Source:
    """A file-like source that records the sizes it is asked for, and fails (like a disk
    error) once `fail_after` bytes have been read."""

    def __init__(self, data: bytes, fail_after: int | None = None) -> None:
        self._data = io.BytesIO(data)
        self.asked: list[int] = []
        self._fail_after = fail_after

    def read(self, size: int = -1, /) -> bytes:
        self.asked.append(size)
        if self._fail_after is not None and self._data.tell() >= self._fail_after:
            raise _SourceBroke("the source broke")
        return self._data.read(size)


class _SourceBroke(OSError):
    """An OSError: the source's failure, not the store's (never STORAGE_UNREACHABLE)."""


class BlobContract:
    """The BlobStore contract. Subclass it as `Test...` in a test module and give it a `kind`
    fixture (a StoreKind: how to open the store under test for a namespace name)."""

    @pytest.fixture
    def store(self, kind: StoreKind) -> Iterator[BlobStore]:
        with kind.open("ns") as opened:
            yield opened

    def test_put_then_get_returns_the_same_bytes(self, store):
        payloads = {"a": b"one", "dir/b": bytes(range(256)) * 64, "dir/sub/empty": b""}
        for key, data in payloads.items():
            assert store.put(key, data) is True
        for key, data in payloads.items():
            assert store.get(key) == data
            assert store.exists(key)

    def test_get_of_a_missing_key_is_object_not_found(self, store):
        with pytest.raises(ObjectNotFound) as caught:
            store.get("missing/key")
        assert isinstance(caught.value, errors.NotFound)
        assert caught.value.reason == "STORAGE_OBJECT_NOT_FOUND"
        assert not store.exists("missing/key")

    def test_open_read_streams_the_bytes_in_the_pieces_asked_for(self, store):
        data = bytes(range(256)) * 9000 + b"tail"  # 2.2 MiB: several reads of 1 MiB
        store.put("big/object", data)
        pieces = []
        with store.open_read("big/object") as reader:
            while piece := reader.read(1 << 20):
                assert len(piece) <= 1 << 20
                pieces.append(piece)
            assert reader.read(1 << 20) == b""  # stays at the end
        assert b"".join(pieces) == data and len(pieces) >= 3
        with store.open_read("big/object") as reader:
            assert reader.read(4) == data[:4]
            assert reader.read() == data[4:]  # the rest
        store.put("empty", b"")
        with store.open_read("empty") as reader:
            assert reader.read(10) == b""

    def test_open_read_of_a_range_returns_exactly_its_bytes(self, store):
        data = bytes(range(256)) * 9000 + b"tail"
        size = len(data)
        store.put("big/object", data)
        cases = [
            (0, 10),
            (1000, 5000),
            (3, size),  # to the end exactly
            (size - 4, None),  # open-ended
            (size - 4, 100),  # past the end: what is there
            (size, None),  # at the end: nothing
            (size + 5, 3),  # after the end: nothing, no error
            (7, 0),
            (0, None),
        ]
        for offset, length in cases:
            with store.open_read("big/object", offset, length) as reader:
                pieces = []
                while piece := reader.read(1 << 20):
                    assert len(piece) <= 1 << 20
                    pieces.append(piece)
                assert reader.read(10) == b""  # stays at the range's end
            end = None if length is None else offset + length
            assert b"".join(pieces) == data[offset:end], (offset, length)
        with store.open_read("big/object", 5, 10) as reader:
            assert reader.read() == data[5:15]  # read() is the rest of the range, not more
        store.put("empty", b"")
        for offset, length in ((0, 10), (0, None), (3, None)):
            with store.open_read("empty", offset, length) as reader:
                assert reader.read() == b""
        with pytest.raises(ObjectNotFound):
            store.open_read("missing/key", 10, 5)

    def test_a_ranged_read_fetches_only_its_range(self, store, kind):
        """The last 100 bytes of an 8 MiB object: the store seeks or asks for the range, it
        never reads (or downloads) the object from its start."""
        if kind.fetched is None:
            pytest.skip(f"what a {kind.name} store fetches is not observable here")
        data = bytes(range(256)) * (32 * 1024) + b"tail"
        store.put("big/object", data)
        before = kind.fetched(store)
        with store.open_read("big/object", len(data) - 100) as reader:
            assert reader.read() == data[-100:]
        with store.open_read("big/object", len(data) - 300, 200) as reader:
            assert reader.read(1 << 20) == data[-300:-100]
        assert kind.fetched(store) - before < 256 * 1024

    def test_a_negative_range_is_refused_before_any_access(self, store):
        for offset, length in ((-1, None), (0, -1), (-5, 5)):
            with pytest.raises(InvalidByteRange) as caught:
                store.open_read("missing/key", offset, length)
            assert isinstance(caught.value, errors.InvalidArgument)
            assert caught.value.reason == "INVALID_BYTE_RANGE"

    def test_open_read_of_a_missing_key_is_object_not_found(self, store):
        with pytest.raises(ObjectNotFound) as caught:
            store.open_read("missing/key")
        assert caught.value.reason == "STORAGE_OBJECT_NOT_FOUND"

    def test_put_stream_writes_in_pieces_and_reports_what_it_wrote(self, store, kind):
        # 20 MiB: above S3BlobStore's multipart threshold (parts of 8 MiB); 20 pieces of 1 MiB
        # through the local store's temporary file.
        data = hashlib.sha256(b"seed").digest() * (20 * 32768) + b"tail"
        source = _Source(data)
        written = store.put_stream("data/streamed", source)
        assert written == (len(data), hashlib.sha256(data).hexdigest())
        assert written.size == len(data) and written.sha256 == hashlib.sha256(data).hexdigest()
        # Never read whole: every read asks for a bounded piece (1 MiB locally, a part on S3).
        assert source.asked and all(0 <= size <= 8 << 20 for size in source.asked)
        if kind.stream_piece is not None:
            assert max(source.asked) == kind.stream_piece
        assert store.get("data/streamed") == data
        assert [info.key for info in store.list("data/")] == ["data/streamed"]
        assert store.put_stream("data/empty", _Source(b"")) == (0, hashlib.sha256(b"").hexdigest())
        assert store.get("data/empty") == b""
        if isinstance(store, CountingBlobStore):
            assert store.counts["put"] == 2 and store.bytes_written == len(data)
            assert store.keys_written == ["data/streamed", "data/empty"]

    @pytest.mark.parametrize("fail_after", [3 << 20, 17 << 20], ids=["one-part", "multipart"])
    def test_put_stream_that_fails_leaves_nothing_under_the_key(self, store, kind, fail_after):
        """A source failing mid-way: its own error (an OSError reading a local file is not the
        namespace's), and nothing visible or left behind — no object,
        no temporary file, no unfinished multipart upload on S3 (aborted)."""
        data = b"x" * (20 << 20)
        with pytest.raises(_SourceBroke):
            store.put_stream("data/broken", _Source(data, fail_after=fail_after))
        assert not store.exists("data/broken")
        assert list(store.list("")) == []
        assert kind.leftovers(store, "ns") == []

    @pytest.mark.parametrize("size", [6, 20 << 20], ids=["one-part", "multipart"])
    def test_put_stream_never_replaces_an_object(self, store, kind, size):
        """Also on S3 (If-None-Match on the PUT and on CompleteMultipartUpload), and a refused
        multipart upload is aborted: no parts left billed."""
        store.put("data/taken", b"first")
        with pytest.raises(ObjectExists) as caught:
            store.put_stream("data/taken", _Source(b"s" * size))
        assert caught.value.reason == "STORAGE_OBJECT_EXISTS"
        assert store.get("data/taken") == b"first"
        assert [info.key for info in store.list("")] == ["data/taken"]
        assert kind.leftovers(store, "ns") == []

    def test_put_replaces_but_if_absent_never_overwrites(self, store):
        assert store.put("k", b"first") is True
        assert store.put("k", b"second") is True  # a plain put replaces
        assert store.get("k") == b"second"
        assert store.put("k", b"third", if_absent=True) is False  # must never overwrite
        assert store.get("k") == b"second"
        assert store.put("fresh", b"new", if_absent=True) is True
        assert store.get("fresh") == b"new"

    def test_if_absent_has_exactly_one_winner(self, kind):
        if not kind.atomic_if_absent:
            # Declared by the kind, not guessed: moto's conditional put is a HEAD then PUT.
            return
        store = kind.open("race")
        wins: list[bytes] = []
        barrier = threading.Barrier(8)

        def contend(i: int) -> None:
            barrier.wait()
            if store.put("once", b"writer-%d" % i, if_absent=True):
                wins.append(b"writer-%d" % i)

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1
        assert store.get("once") == wins[0]

    def test_put_deferred_is_if_absent_and_visible_after_sync(self, store):
        assert store.put_deferred("ranges/r1", b"range one") is True
        assert store.put_deferred("ranges/r2", b"range two") is True
        assert store.put_deferred("ranges/r1", b"other bytes") is False  # never overwrites
        store.sync()
        assert store.get("ranges/r1") == b"range one"
        assert store.get("ranges/r2") == b"range two"
        store.sync()  # nothing pending: still fine

    def test_put_after_sync_is_if_absent_and_syncs_the_pending_objects(self, store):
        assert store.put_deferred("ranges/r1", b"range one") is True
        assert store.put_after_sync("metaranges/m1", b"names r1") is True
        assert store.get("metaranges/m1") == b"names r1"
        assert store.get("ranges/r1") == b"range one"
        assert store.put_deferred("ranges/r2", b"range two") is True
        # An existing object is never overwritten; the pending one is still synced.
        assert store.put_after_sync("metaranges/m1", b"other bytes") is False
        assert store.get("metaranges/m1") == b"names r1"
        assert store.get("ranges/r2") == b"range two"
        store.sync()  # nothing pending: still fine

    def test_delete_is_idempotent_and_touches_only_its_key(self, store):
        store.put("d/one", b"1")
        store.put("d/two", b"2")
        store.delete("d/one")
        store.delete("d/one")  # deleting a missing object is not an error
        store.delete("never/there")
        assert not store.exists("d/one")
        assert store.get("d/two") == b"2"
        assert [info.key for info in store.list("d/")] == ["d/two"]

    def test_list_by_prefix_in_key_order(self, store):
        # (No key is also a "directory" of others: a filesystem cannot hold both "a" and "a/0".)
        keys = ["b/2", "a/1", "ab", "a/0", "b/1/deep", "a-", "c"]
        for key in keys:
            store.put(key, key.encode())
        assert [info.key for info in store.list("")] == sorted(keys)
        assert [info.key for info in store.list()] == sorted(keys)
        assert [info.key for info in store.list("a/")] == ["a/0", "a/1"]
        assert [info.key for info in store.list("a")] == ["a-", "a/0", "a/1", "ab"]
        assert [info.key for info in store.list("b/1")] == ["b/1/deep"]
        assert list(store.list("zzz")) == []

    def test_object_info_reports_sizes_and_modification_times(self, store):
        before = time.time()
        store.put("sized/small", b"x" * 3)
        store.put("sized/large", b"y" * 70_000)
        store.put("sized/empty", b"")
        after = time.time()
        infos = {info.key: info for info in store.list("sized/")}
        assert {key: info.size for key, info in infos.items()} == {
            "sized/empty": 0,
            "sized/large": 70_000,
            "sized/small": 3,
        }
        for info in infos.values():
            # S3 reports whole seconds: allow that rounding, nothing more.
            assert before - 1.0 <= info.modified <= after + 1.0

    def test_first_keys_is_a_bounded_listing(self, store):
        assert store.first_keys(5) == []
        keys = [f"k/{i:02d}" for i in range(12)]
        for key in keys:
            store.put(key, b".")
        some = store.first_keys(4)
        assert len(some) == 4 and set(some) <= set(keys) and len(set(some)) == 4
        assert sorted(store.first_keys(100)) == keys
        assert store.first_keys(0) == []

    def test_namespaces_do_not_see_each_other(self, kind):
        one, two = kind.open("one"), kind.open("two")
        one.put("shared/key", b"from one")
        assert not two.exists("shared/key")
        assert list(two.list("")) == []
        assert two.first_keys(10) == []
        two.put("shared/key", b"from two")
        assert one.get("shared/key") == b"from one"
        two.delete("shared/key")
        assert one.get("shared/key") == b"from one"

    def test_conditional_replace_only_replaces_the_expected_bytes(self, store):
        # put_if_equals must never create an object, nor replace one holding other bytes.
        assert store.put_if_equals("m", b"new", expected=b"old") is False
        assert not store.exists("m")
        store.put("m", b"current")
        assert store.put_if_equals("m", b"new", expected=b"old") is False
        assert store.get("m") == b"current"
        assert store.put_if_equals("m", b"new", expected=b"current") is True
        assert store.get("m") == b"new"

    def test_ownership_claims_go_through_the_store(self, store):
        """The marker protocol rides on put(if_absent) and put_if_equals: an empty namespace is
        claimed once, a claimed one is never taken over without naming its marker, and a
        namespace holding other objects is reported, never written."""
        first = claim_namespace(store, b"marker-one")
        assert first.claimed and first.existing_marker is None
        second = claim_namespace(store, b"marker-two")
        assert not second.claimed and second.existing_marker == b"marker-one"
        assert store.get(MARKER_KEY) == b"marker-one"
        wrong = claim_namespace(store, b"marker-two", replace=b"not-the-marker")
        assert not wrong.claimed and store.get(MARKER_KEY) == b"marker-one"
        replaced = claim_namespace(store, b"marker-two", replace=b"marker-one")
        assert replaced.claimed and store.get(MARKER_KEY) == b"marker-two"

    def test_ownership_claim_leaves_a_used_namespace_alone(self, kind):
        store = kind.open("used")
        store.put("someone/else.parquet", b"data")
        claim = claim_namespace(store, b"marker")
        assert not claim.claimed and claim.keys == ("someone/else.parquet",)
        assert not store.exists(MARKER_KEY)
        assert [info.key for info in store.list("")] == ["someone/else.parquet"]

    @pytest.mark.parametrize(
        "key", ["", "/abs", "../up", "a/../b", "a//b", "a/./b", ".", "a\\b", "nul\x00", "trailing/"]
    )
    def test_invalid_keys_are_refused_before_any_access(self, store, key):
        for operation in (
            lambda: store.get(key),
            lambda: store.put(key, b"x"),
            lambda: store.put(key, b"x", if_absent=True),
            lambda: store.put_deferred(key, b"x"),
            lambda: store.put_if_equals(key, b"x", b"y"),
            lambda: store.exists(key),
            lambda: store.delete(key),
        ):
            with pytest.raises(InvalidObjectKey) as caught:
                operation()
            assert isinstance(caught.value, errors.InvalidArgument)
            assert caught.value.reason == "INVALID_OBJECT_KEY"
        assert list(store.list("")) == []  # nothing was written under any spelling
