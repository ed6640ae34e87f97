"""Object stores for committed data: a local directory (default) or S3.

open_blob_store("/abs/dir" | "file:///abs/dir" | "s3://bucket/prefix", settings)
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from quarry.blob.base import (
    BlobStore,
    InvalidObjectKey,
    InvalidStorageNamespace,
    ObjectInfo,
    ObjectNotFound,
    StorageUnreachable,
    check_key,
)
from quarry.blob.counting import CountingBlobStore
from quarry.blob.local import LocalBlobStore
from quarry.blob.namespace import (
    namespace_location,
    namespaces_overlap,
    normalize_storage_namespace,
    parse_storage_namespace,
)

if TYPE_CHECKING:
    from quarry.config import Settings

__all__ = [
    "BlobStore",
    "CountingBlobStore",
    "InvalidObjectKey",
    "InvalidStorageNamespace",
    "LocalBlobStore",
    "ObjectInfo",
    "ObjectNotFound",
    "S3BlobStore",
    "StorageUnreachable",
    "check_key",
    "namespace_location",
    "namespaces_overlap",
    "normalize_storage_namespace",
    "object_address",
    "open_blob_store",
    "parse_storage_namespace",
    "read_object",
]


def __getattr__(name: str) -> type[BlobStore]:
    # boto3 is imported only when S3 is used.
    if name == "S3BlobStore":
        from quarry.blob.s3 import S3BlobStore

        return S3BlobStore
    raise AttributeError(name)


def object_address(storage_namespace: str, key: str) -> str:
    """The physical address of `key` inside the namespace, in the namespace's own notation
    (/abs/dir/key, file:///abs/dir/key or s3://bucket/prefix/key)."""
    parse_storage_namespace(storage_namespace)  # rejects what no store could open
    return storage_namespace.rstrip("/") + "/" + key


def open_blob_store(storage_namespace: str, settings: Settings | None = None) -> BlobStore:
    """The store for a repository's storage namespace. `settings` (quarry.config.Settings)
    supplies the S3 endpoint and region."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    if kind == "local":
        return LocalBlobStore(where)
    from quarry.blob.s3 import S3BlobStore

    endpoint = getattr(settings, "s3_endpoint_url", "") or None
    region = getattr(settings, "s3_region", "") or "us-east-1"
    return S3BlobStore(where, prefix, endpoint_url=endpoint, region=region)


def read_object(physical_address: str, settings: Settings | None = None) -> bytes:
    """The bytes at an entry's physical address: /abs/path, file:///abs/path or
    s3://bucket/key, inside a repository's namespace or not (an imported object).
    ObjectNotFound when nothing is there, StorageUnreachable when the environment stops it."""
    kind, where, key = parse_storage_namespace(physical_address)
    if kind == "local":
        where, _, key = where.rpartition("/")
        where = where or "/"
        if not os.path.isdir(where):  # opening a local store creates its root: not for a read
            raise ObjectNotFound(f"object {physical_address!r} not found")
    store = open_blob_store(where if kind == "local" else f"s3://{where}", settings)
    try:
        return store.get(check_key(key))
    finally:
        store.close()
