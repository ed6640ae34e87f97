"""Object stores for committed data: a local directory (default) or S3.

open_blob_store("/abs/dir" | "file:///abs/dir" | "s3://bucket/prefix", settings)

An entry's bytes, by physical address: read_object (whole), open_object (a stream) and
copy_object (streamed through a writer, then checked against the entry's size and SHA-256).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from quarry.blob.base import (
    BlobStore,
    ChecksumMismatch,
    HashingReader,
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
    "namespace_location",
    "namespaces_overlap",
    "normalize_storage_namespace",
    "copy_object",
    "object_address",
    "open_blob_store",
    "open_object",
    "parse_storage_namespace",
    "read_object",
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
    """Stream the object at `physical_address` through `write` in chunks of at most
    STREAM_CHUNK_BYTES (counted and hashed by HashingReader, as put_stream does), then check that it is the object its entry describes; the number of
    bytes copied.

    Safety: a copy must never pass as the entry's object when its bytes differ from what the
    entry records: ObjectChanged (DATA_LOSS) when the size is not `size_bytes`,
    ChecksumMismatch (DATA_LOSS) when `checksum` is a SHA-256 (64 hex digits) and the bytes'
    is another. Other checksum forms are checked by size only. An entry with size 0 and no
    checksum records neither (`quarry put --address` without `--size`): nothing to check.
    The check comes after the last byte: what was already passed to `write` stays written,
    the caller decides what to do with it (`quarry get` removes its temporary file, `quarry
    cat` has printed it)."""
    with open_object(physical_address, settings) as reader:
        hashing = HashingReader(reader)
        for chunk in hashing.chunks():
            write(chunk)
    copied, sha256 = hashing.written
    where = {"physical_address": physical_address}
    size_recorded = size_bytes != 0 or bool(checksum)
    if size_recorded and copied != size_bytes:
        raise ObjectChanged(
            f"the object at {physical_address} has {copied} bytes, its entry records "
            f"{size_bytes}: it changed after the entry was recorded",
            metadata={**where, "expected_size": str(size_bytes), "actual_size": str(copied)},
        )
    if _SHA256_HEX.fullmatch(checksum) and sha256 != checksum.lower():
        raise ChecksumMismatch(
            f"the object at {physical_address} has SHA-256 {sha256}, its entry "
            f"records {checksum.lower()}: it changed after the entry was recorded",
            metadata={
                **where,
                "expected_sha256": checksum.lower(),
                "actual_sha256": sha256,
            },
        )
    return copied
