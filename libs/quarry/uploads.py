"""Writing an object's bytes into a repository's storage namespace and staging the entry that
points at them: the one mechanism behind the s3-gateway's writes (PutObject, UploadPart,
CopyObject from another repository, CompleteMultipartUpload) and the console's upload.

Bytes go to a fresh key (quarry.blob.layout.new_upload_key: `data/<uuid hex>`, the shape
`quarry put` writes and GC treats alike), streamed in pieces through BlobStore.put_stream
(never held whole), their MD5 computed on the way (size and SHA-256 come from put_stream).
The entry is staged with the caller's own client, so the servers decide with the caller's
token (policies, branch protection) as for any PutObject.

Safety rules: never stage an entry whose bytes failed a check (`check` runs once every byte
is written, before any entry exists); a failed write, check or staging (a bad digest, a size
over a limit, a denied or protected staging, a dropped connection) removes the bytes this
write wrote — its own fresh key, never any other object.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from quarry.blob import BlobStore, object_address, open_blob_store
from quarry.blob.layout import new_upload_key
from quarry.v1 import types_pb2

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Stored:
    """Bytes written under `key`: their size, MD5 and SHA-256 (hex) as written."""

    key: str
    size: int
    md5: str
    sha256: str


class _Digesting:
    """Reads `read` and keeps the MD5 of everything returned (SHA-256 comes from put_stream)."""

    def __init__(self, read: Callable[[int], bytes]) -> None:
        self._read = read
        self.md5 = hashlib.md5()

    def read(self, size: int = -1) -> bytes:
        data = self._read(size if size > 0 else READ_CHUNK)
        self.md5.update(data)
        return data


def discard(store: BlobStore, key: str) -> None:
    """Remove bytes a write put under its own fresh key (never anything else)."""
    try:
        store.delete(key)
    except Exception:
        log.warning("could not remove the unreferenced upload %s", key, exc_info=True)


def store_stream(
    store: BlobStore,
    read: Callable[[int], bytes],
    check: Callable[[Stored], None] | None = None,
) -> Stored:
    """Write what `read` returns (until b"") under a fresh key; what was written once `check`
    (if any) accepted it. On any failure, the check's included, the bytes are removed and
    the error raised."""
    key = new_upload_key()
    digesting = _Digesting(read)
    try:
        written = store.put_stream(key, digesting)
        stored = Stored(key, written.size, digesting.md5.hexdigest(), written.sha256)
        if check is not None:
            check(stored)
    except BaseException:
        discard(store, key)
        raise
    return stored


def stage(
    client: Any, repository: str, branch: str, entry: types_pb2.Entry, store: BlobStore, key: str
) -> None:
    """PutObject `entry` (whose bytes are `key` of `store`) on `branch` with the caller's
    client; when it fails (refused, protected, gone), the bytes are removed."""
    try:
        client.put_object(repository, branch, entry)
    except BaseException:
        discard(store, key)
        raise


def now() -> Any:
    """A Timestamp of this moment (an entry's mtime)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp()
    stamp.FromNanoseconds(time.time_ns())
    return stamp


def put(  # noqa: PLR0913 — one object's write: where, what, and how it is described
    client: Any,
    repository: types_pb2.Repository,
    branch: str,
    path: str,
    read: Callable[[int], bytes],
    settings: Any,
    *,
    content_type: str = "",
    metadata: Mapping[str, str] | None = None,
    check: Callable[[Stored], None] | None = None,
) -> types_pb2.Entry:
    """Write an object's bytes into `repository`'s storage namespace and stage its entry on
    `branch` (checksum: the MD5 hex, S3's ETag); the entry staged."""
    store = open_blob_store(repository.storage_namespace, settings)
    try:
        stored = store_stream(store, read, check)
        entry = types_pb2.Entry(
            path=path,
            physical_address=object_address(repository.storage_namespace, stored.key),
            size_bytes=stored.size,
            checksum=stored.md5,
            content_type=content_type or "application/octet-stream",
            metadata=dict(metadata or {}),
        )
        entry.mtime.CopyFrom(now())
        stage(client, repository.name, branch, entry, store, stored.key)
    finally:
        store.close()
    return entry
