"""Streaming reads of an entry's bytes by physical address (quarry.blob.open_object,
copy_object; `quarry cat` / `quarry get` use them): every address form (local path,
file://, s3:// on a real S3 API, the session moto_server), the error mapping while opening
and while reading (NOT_FOUND, STORAGE_UNREACHABLE, UNAVAILABLE; never a bare OSError or
botocore error), S3 bodies always closed, and the check of the copied bytes against the
entry's size and SHA-256."""

from __future__ import annotations

import errno
import hashlib
import io
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError, ResponseStreamingError
from urllib3.exceptions import ProtocolError

import quarry.blob.local as local_module
from quarry import errors
from quarry.blob import (
    ChecksumMismatch,
    CountingBlobStore,
    LocalBlobStore,
    ObjectChanged,
    ObjectNotFound,
    StorageUnreachable,
    check_stored_size,
    copy_object,
    open_object,
    read_object,
    verified_chunks,
)
from quarry.blob.s3 import S3BlobStore, shared_client
from quarry.config import load_settings

MiB = 1 << 20
DATA = bytes(range(256)) * 10_000 + b"end"  # 2.4 MiB


def _read_in_pieces(address: str, settings: Any = None) -> list[bytes]:
    pieces = []
    with open_object(address, settings) as reader:
        while piece := reader.read(MiB):
            pieces.append(piece)
    return pieces


def test_open_object_reads_every_address_form(tmp_path, s3_bucket, moto_endpoint):
    LocalBlobStore(tmp_path / "ns").put("data/a", DATA)
    S3BlobStore(s3_bucket, "lake", endpoint_url=moto_endpoint).put("data/a", DATA)
    settings = load_settings(env={}, s3_endpoint_url=moto_endpoint)
    for address in (
        f"{tmp_path}/ns/data/a",
        f"file://{tmp_path}/ns/data/a",
        f"s3://{s3_bucket}/lake/data/a",
    ):
        pieces = _read_in_pieces(address, settings)
        assert b"".join(pieces) == DATA, address
        assert len(pieces) == 3 and all(len(p) <= MiB for p in pieces), address
        assert read_object(address, settings) == DATA  # the whole-object read, on top


def test_a_missing_object_is_not_found_and_a_local_read_creates_no_directory(
    tmp_path, s3_bucket, moto_endpoint
):
    settings = load_settings(env={}, s3_endpoint_url=moto_endpoint)
    for address in (
        f"{tmp_path}/nowhere/deeper/key",
        f"file://{tmp_path}/nowhere/key",
        f"{tmp_path}/key-of-a-missing-file",
        f"s3://{s3_bucket}/lake/missing",
    ):
        with pytest.raises(ObjectNotFound) as caught, open_object(address, settings):
            pass
        assert caught.value.code.name == "NOT_FOUND", address
    assert not (tmp_path / "nowhere").exists()
    # A bucket that does not exist is the environment's problem, not a missing object.
    with (
        pytest.raises(StorageUnreachable) as caught,
        open_object("s3://no-such-bucket/k", settings),
    ):
        pass
    assert caught.value.metadata["cause"] == "no such bucket"


def test_a_local_read_failing_midway_is_storage_unreachable(tmp_path, monkeypatch):
    LocalBlobStore(tmp_path).put("a", DATA)

    class FailingFile(io.BufferedReader):
        def read(self, size: int | None = -1, /) -> bytes:
            if self.tell() >= MiB:
                raise OSError(errno.EIO, "Input/output error")
            return super().read(size)

    def failing_open(path: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        return FailingFile(io.FileIO(path, mode))

    monkeypatch.setattr(local_module, "open", failing_open, raising=False)
    written = []
    with pytest.raises(StorageUnreachable) as caught:
        copy_object(f"{tmp_path}/a", written.append, size_bytes=len(DATA), checksum="")
    assert caught.value.code.name == "FAILED_PRECONDITION"
    assert "Input/output error" in caught.value.metadata["cause"]
    # The first chunk was read, and held back until the next read (which failed).
    assert sum(map(len, written)) == 0


class _TrackedBody:
    """A real get_object Body that records its closing, and can fail after some bytes."""

    def __init__(self, body: Any, fail_after: int | None, failure: Exception) -> None:
        self.body, self.fail_after, self.failure = body, fail_after, failure
        self.served = 0
        self.closed = False

    def read(self, amt: int | None = None) -> bytes:
        if self.fail_after is not None and self.served >= self.fail_after:
            raise self.failure
        data = self.body.read(amt)
        self.served += len(data)
        return data

    def close(self) -> None:
        self.closed = True
        self.body.close()


class _TrackingClient:
    """The real boto3 client; get_object's Body is a _TrackedBody."""

    def __init__(self, real: Any, fail_after: int | None = None, failure: Exception = None):
        self.real, self.fail_after, self.failure = real, fail_after, failure
        self.bodies: list[_TrackedBody] = []

    def get_object(self, **kwargs: Any) -> dict:
        response = self.real.get_object(**kwargs)
        response["Body"] = _TrackedBody(response["Body"], self.fail_after, self.failure)
        self.bodies.append(response["Body"])
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.mark.parametrize(
    "failure",
    [
        ResponseStreamingError(error=ProtocolError("Connection broken")),
        ReadTimeoutError(endpoint_url="http://s3"),
        ProtocolError("Connection broken: IncompleteRead"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
    ],
    ids=["streaming-error", "read-timeout", "urllib3-protocol", "connection-reset"],
)
def test_an_s3_body_failing_midway_is_unavailable_and_closed(s3_bucket, moto_endpoint, failure):
    client = _TrackingClient(shared_client(moto_endpoint, "us-east-1"), MiB, failure)
    store = S3BlobStore(s3_bucket, "lake", client=client)
    store.put("a", DATA)
    with pytest.raises(errors.Unavailable), store.open_read("a") as reader:
        while reader.read(MiB):
            pass
    assert [body.closed for body in client.bodies] == [True]


def test_an_s3_body_is_closed_when_read_whole_or_left_early(s3_bucket, moto_endpoint):
    client = _TrackingClient(shared_client(moto_endpoint, "us-east-1"))
    store = S3BlobStore(s3_bucket, "lake", client=client)
    store.put("a", DATA)
    assert store.get("a") == DATA
    with store.open_read("a") as reader:
        assert reader.read(10) == DATA[:10]  # then left
    with pytest.raises(ZeroDivisionError), store.open_read("a") as reader:
        reader.read(10)
        raise ZeroDivisionError  # the caller's own failure
    assert [body.closed for body in client.bodies] == [True, True, True]


def test_copy_object_checks_the_bytes_against_the_entry(tmp_path):
    """Safety: a copy whose bytes differ from the entry's size or SHA-256 never passes."""
    LocalBlobStore(tmp_path).put("a", DATA)
    address = f"{tmp_path}/a"
    sha = hashlib.sha256(DATA).hexdigest()
    copied = []
    assert copy_object(address, copied.append, size_bytes=len(DATA), checksum=sha) == len(DATA)
    assert b"".join(copied) == DATA and max(map(len, copied)) <= MiB
    copy_object(address, [].append, size_bytes=len(DATA), checksum=sha.upper())

    copied = []
    with pytest.raises(ChecksumMismatch) as caught:
        copy_object(address, copied.append, size_bytes=len(DATA), checksum="0" * 64)
    assert sum(map(len, copied)) < len(DATA)  # the last chunk withheld
    assert (caught.value.code.name, caught.value.reason) == ("DATA_LOSS", "CHECKSUM_MISMATCH")
    assert caught.value.metadata["actual_sha256"] == sha

    for recorded in (len(DATA) - 1, len(DATA) + 1, 0):
        copied = []
        with pytest.raises(ObjectChanged) as changed:
            copy_object(address, copied.append, size_bytes=recorded, checksum=sha)
        assert changed.value.reason == "OBJECT_CHANGED"
        assert changed.value.metadata["expected_size"] == str(recorded)
        if recorded > len(DATA):
            assert changed.value.metadata["actual_size"] == str(len(DATA))
        else:  # reading stops once the bytes pass the recorded size
            assert int(changed.value.metadata["actual_size_at_least"]) > recorded
        # Never the whole object: the last chunk is held until the bytes are checked.
        assert sum(map(len, copied)) < min(len(DATA), max(recorded, 1))

    # Not a SHA-256 (an S3 ETag, a user's string): checked by size only.
    for other in ('"d41d8cd98f00b204e9800998ecf8427e-3"', "etag1", "", "z" * 64):
        copy_object(address, [].append, size_bytes=len(DATA), checksum=other)


def test_an_entry_recording_neither_size_nor_checksum_is_not_checked(tmp_path):
    """`quarry put --address` without --size stages size 0 and no checksum: unknown, so the
    bytes are passed on as they are. Size 0 WITH a checksum is a recorded empty object and
    stays checked (the guard must not open up for every size-0 entry)."""
    LocalBlobStore(tmp_path).put("a", DATA)
    address = f"{tmp_path}/a"
    copied = []
    assert copy_object(address, copied.append, size_bytes=0, checksum="") == len(DATA)
    assert b"".join(copied) == DATA
    for recorded in ("etag1", hashlib.sha256(b"").hexdigest()):
        with pytest.raises(ObjectChanged):
            copy_object(address, [].append, size_bytes=0, checksum=recorded)


def test_the_counting_store_counts_a_streamed_read_as_one_get(tmp_path):
    store = CountingBlobStore(LocalBlobStore(tmp_path))
    store.put("a", DATA)
    store.reset()
    with store.open_read("a") as reader:
        while reader.read(MiB):
            pass
    assert store.counts["get"] == 1 and store.reads == 1
    assert store.bytes_read == len(DATA) and store.keys_read == ["a"]


def test_verified_chunks_hand_on_the_whole_object_only_when_it_is_the_entrys(tmp_path):
    """The stream a download or an S3 GET sends: every byte of a matching object, in
    order; of another object (size or SHA-256), never its last chunk — whoever reads it
    sees a failure, not a complete file of other bytes."""
    LocalBlobStore(tmp_path).put("a", DATA)
    address, sha = f"{tmp_path}/a", hashlib.sha256(DATA).hexdigest()

    def drain(size_bytes: int, checksum: str) -> tuple[bytes, BaseException | None]:
        got = []
        with open_object(address) as reader:
            try:
                for chunk in verified_chunks(reader, address, size_bytes, checksum, MiB):
                    got.append(chunk)
            except errors.QuarryError as exc:
                return b"".join(got), exc
        return b"".join(got), None

    assert drain(len(DATA), sha) == (DATA, None)
    assert drain(0, "") == (DATA, None)  # unknown size: all of it, not nothing
    for size_bytes, checksum, reason in [
        (len(DATA), "0" * 64, "CHECKSUM_MISMATCH"),
        (len(DATA) - 1, "", "OBJECT_CHANGED"),
        (len(DATA) + 1, "", "OBJECT_CHANGED"),
        (10, "etag", "OBJECT_CHANGED"),
    ]:
        sent, failure = drain(size_bytes, checksum)
        assert failure is not None and failure.reason == reason
        assert DATA.startswith(sent) and len(sent) < min(len(DATA), max(size_bytes, MiB))
    with open_object(address) as reader:
        check_stored_size(reader, address, len(DATA), sha)  # a match: no error
        with pytest.raises(ObjectChanged):
            check_stored_size(reader, address, len(DATA) + 1, sha)
        check_stored_size(reader, address, 0, "")  # unknown: nothing to compare
