"""Object stores for committed data: a local directory (default) or S3.

open_blob_store("/abs/dir" | "file:///abs/dir" | "s3://bucket/prefix", settings)

An entry's bytes, by physical address: read_object (whole), open_object (a stream) and
copy_object (streamed through a writer, then checked against the entry's size and SHA-256).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from quarry.blob.base import (
    STREAM_CHUNK_BYTES,
    BlobStore,
    ChecksumMismatch,
    InvalidByteRange,
    InvalidObjectKey,
    InvalidStorageNamespace,
    ObjectChanged,
    ObjectInfo,
    ObjectNotFound,
    ObjectReader,
    StorageUnreachable,
    check_key,
)
from quarry.blob.confine import Confinement, opened_path
from quarry.blob.counting import CountingBlobStore
from quarry.blob.layout import (
    InvalidPhysicalAddress,
    address_location,
    check_physical_address,
    object_address,
)
from quarry.blob.local import LocalBlobStore
from quarry.blob.namespace import (
    namespace_location,
    namespaces_overlap,
    normalize_storage_namespace,
    parse_storage_namespace,
)


class S3Location(Protocol):
    """Where S3 is, for a namespace on S3: quarry.config.Settings, or the Spark jobs'
    Connection (what its executors were given)."""

    @property
    def s3_endpoint_url(self) -> str: ...

    @property
    def s3_region(self) -> str: ...


__all__ = [
    "BlobStore",
    "Confinement",
    "ChecksumMismatch",
    "CountingBlobStore",
    "confinement",
    "InvalidByteRange",
    "InvalidObjectKey",
    "InvalidPhysicalAddress",
    "InvalidStorageNamespace",
    "LocalBlobStore",
    "ObjectChanged",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectReader",
    "S3BlobStore",
    "StorageUnreachable",
    "address_location",
    "check_key",
    "check_physical_address",
    "check_stored_size",
    "namespace_location",
    "namespaces_overlap",
    "normalize_storage_namespace",
    "copy_object",
    "object_address",
    "open_blob_store",
    "open_object",
    "parse_storage_namespace",
    "primed",
    "read_object",
    "records_sha256",
    "size_recorded",
    "verified_chunks",
]


def __getattr__(name: str) -> type[BlobStore]:
    # boto3 is imported only when S3 is used.
    if name == "S3BlobStore":
        from quarry.blob.s3 import S3BlobStore

        return S3BlobStore
    raise AttributeError(name)


def open_blob_store(storage_namespace: str, settings: S3Location | None = None) -> BlobStore:
    """The store for a repository's storage namespace. `settings` (quarry.config.Settings)
    supplies the S3 endpoint and region."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    if kind == "local":
        return LocalBlobStore(where)
    from quarry.blob.s3 import S3BlobStore

    endpoint = getattr(settings, "s3_endpoint_url", "") or None
    region = getattr(settings, "s3_region", "") or "us-east-1"
    return S3BlobStore(where, prefix, endpoint_url=endpoint, region=region)


def confinement(storage_namespace: str, settings: Any) -> Confinement:
    """Where reads for a repository with this namespace may open local files
    (quarry.blob.confine), from QUARRY_IMPORT_LOCAL_PREFIXES and Quarry's own files of
    `settings`."""
    kind, where, _ = parse_storage_namespace(storage_namespace)
    return Confinement.of(where if kind == "local" else "", settings)


@contextlib.contextmanager
def open_object(
    physical_address: str,
    settings: S3Location | None = None,
    offset: int = 0,
    length: int | None = None,
    confine: Confinement | None = None,
) -> Iterator[ObjectReader]:
    """The bytes at an entry's physical address as a stream (read(n) in pieces, never whole
    unless asked): /abs/path, file:///abs/path or s3://bucket/key, inside a repository's
    namespace or not (an imported object). ObjectNotFound when nothing is there,
    StorageUnreachable or Unavailable when the environment stops it, while opening or
    while reading. A local read never creates a directory. `offset`/`length`: only that
    range, read without the bytes before it (BlobStore.open_read). `confine`: a service
    reading for a caller: a local file is read only if the file opened (its real path, after
    any link) lies where the repository may read (quarry.blob.confine), else
    ADDRESS_NOT_ALLOWED before any byte is read."""
    # Where the address points, decided in one place (quarry.blob.layout): `..`, `.` and
    # empty segments are refused (INVALID_PHYSICAL_ADDRESS), never resolved here.
    location = address_location(physical_address)
    if location is None:
        parse_storage_namespace(physical_address)  # INVALID_NAMESPACE, naming the forms
        raise InvalidStorageNamespace(f"{physical_address!r} is not an object's address")
    if location.kind == "local":
        where, _, key = location.where.rpartition("/")
        where = where or "/"
        if not os.path.isdir(where):  # opening a local store creates its root: not for a read
            raise ObjectNotFound(f"object {physical_address!r} not found")
        store = open_blob_store(where, settings)
    else:
        bucket, _, key = location.where.partition("/")
        store = open_blob_store(f"s3://{bucket}", settings)
    try:
        with store.open_read(check_key(key), offset, length) as reader:
            if confine is not None and location.kind == "local":
                fileno = reader.fileno()
                real = (
                    opened_path(fileno) if fileno is not None else os.path.realpath(location.where)
                )
                confine.check(real, physical_address)
            yield reader
    finally:
        store.close()


def read_object(physical_address: str, settings: S3Location | None = None) -> bytes:
    """The whole object at a physical address (open_object, read at once)."""
    with open_object(physical_address, settings) as reader:
        return reader.read()


# What Quarry's own uploads (`quarry put --from`) and Spark writes record as an entry's
# checksum. Other forms (an S3 ETag of an imported object, a user's own string) are not a
# hash of the bytes that can be recomputed here: only the size is checked for them.
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")


def copy_object(
    physical_address: str,
    write: Callable[[bytes], object],
    settings: S3Location | None = None,
    *,
    size_bytes: int,
    checksum: str,
) -> int:
    """Stream the object at `physical_address` through `write`, checked against its entry
    (verified_chunks); the number of bytes copied.

    Safety: as verified_chunks — the last chunk is never passed to `write` unless the bytes
    are the entry's (ObjectChanged / ChecksumMismatch, DATA_LOSS); what was written before
    the failure stays written, the caller decides what to do with it (`quarry get` removes
    its temporary file)."""
    copied = 0
    with open_object(physical_address, settings) as reader:
        for chunk in verified_chunks(reader, physical_address, size_bytes, checksum):
            write(chunk)
            copied += len(chunk)
    return copied


def size_recorded(size_bytes: int, checksum: str) -> bool:
    """Whether an entry records its object's size: an entry with size 0 and no checksum
    records neither (`quarry put --address` without `--size`): its size is unknown."""
    return size_bytes != 0 or bool(checksum)


def check_stored_size(
    reader: ObjectReader, physical_address: str, size_bytes: int, checksum: str
) -> None:
    """Before a byte is sent: ObjectChanged (DATA_LOSS) when the entry records a size
    (size_recorded) and the opened local file has another. A file's size is known without
    reading it; an S3 object's is checked as it is read (verified_chunks)."""
    fileno = reader.fileno()
    if fileno is None or not size_recorded(size_bytes, checksum):
        return
    stored = os.fstat(fileno).st_size
    if stored != size_bytes:
        raise _changed(physical_address, size_bytes, stored)


def _changed(
    physical_address: str, size_bytes: int, actual: int, exact: bool = True
) -> ObjectChanged:
    """`exact`: `actual` is the object's size, else how much of it was read when it passed
    `size_bytes` (verified_chunks stops reading there)."""
    return ObjectChanged(
        f"the object at {physical_address} has {'' if exact else 'at least '}{actual} bytes, "
        f"its entry records {size_bytes}: it changed after the entry was recorded",
        metadata={
            "physical_address": physical_address,
            "expected_size": str(size_bytes),
            "actual_size" if exact else "actual_size_at_least": str(actual),
        },
    )


def records_sha256(checksum: str) -> bool:
    """Whether an entry's checksum is a SHA-256 (what verified_chunks checks the bytes by)."""
    return _SHA256_HEX.fullmatch(checksum) is not None


def primed(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """`chunks` with its first chunk read now: a failure there (a small object's check in
    verified_chunks) is the caller's error before any answer starts, not a body cut off."""
    first = next(chunks, None)
    if first is None:
        return iter(())
    return itertools.chain((first,), chunks)


def verified_chunks(
    reader: ObjectReader,
    physical_address: str,
    size_bytes: int,
    checksum: str,
    chunk_bytes: int = STREAM_CHUNK_BYTES,
    skip: int = 0,
) -> Iterator[bytes]:
    """The rest of `reader` in chunks of at most `chunk_bytes`, checked against the entry
    that points at it: its size when the entry records one (size_recorded), its SHA-256
    when `checksum` is one (64 hex digits; other checksum forms, such as an S3 ETag, are
    checked by size only).

    Safety: a reader of these chunks never receives a whole object that is not the entry's:
    each chunk is handed on only once the next was read, and the last only after the count
    and hash matched, else ObjectChanged (DATA_LOSS) when the size differs — as soon as the
    bytes pass the recorded size — or ChecksumMismatch (DATA_LOSS).

    `skip`: the first bytes are read, counted and hashed but not handed on (a range that
    ends at the object's end is checked as the whole object)."""
    recorded = size_recorded(size_bytes, checksum)
    digest = hashlib.sha256() if _SHA256_HEX.fullmatch(checksum) else None
    count = 0
    held = b""
    while piece := reader.read(chunk_bytes):
        count += len(piece)
        if recorded and count > size_bytes:
            break
        if digest is not None:
            digest.update(piece)
        if count <= skip:
            continue
        if count - len(piece) < skip:
            piece = piece[skip - (count - len(piece)) :]
        if held:
            yield held
        held = piece
    if recorded and count != size_bytes:
        raise _changed(physical_address, size_bytes, count, exact=count < size_bytes)
    if digest is not None and digest.hexdigest() != checksum.lower():
        raise ChecksumMismatch(
            f"the object at {physical_address} has SHA-256 {digest.hexdigest()}, its entry "
            f"records {checksum.lower()}: it changed after the entry was recorded",
            metadata={
                "physical_address": physical_address,
                "expected_sha256": checksum.lower(),
                "actual_sha256": digest.hexdigest(),
            },
        )
    if held:
        yield held
