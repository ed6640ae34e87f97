"""Object stores for committed data: a local directory (default) or S3.

    open_blob_store("/abs/dir" | "file:///abs/dir" | "s3://bucket/prefix", settings)
"""

from __future__ import annotations

import os
import urllib.parse

from quarry.blob.base import (BlobStore, InvalidObjectKey, InvalidStorageNamespace,
                              ObjectInfo, ObjectNotFound, check_key)
from quarry.blob.counting import CountingBlobStore
from quarry.blob.local import LocalBlobStore

__all__ = ["BlobStore", "CountingBlobStore", "InvalidObjectKey", "InvalidStorageNamespace",
           "LocalBlobStore", "ObjectInfo", "ObjectNotFound", "S3BlobStore", "check_key",
           "object_address", "open_blob_store",
           "parse_storage_namespace"]


def __getattr__(name: str):
    # boto3 is imported only when S3 is used.
    if name == "S3BlobStore":
        from quarry.blob.s3 import S3BlobStore

        return S3BlobStore
    raise AttributeError(name)


def parse_storage_namespace(storage_namespace: str) -> tuple[str, str, str]:
    """("local", abs_dir, "") or ("s3", bucket, prefix); InvalidStorageNamespace otherwise."""
    ns = (storage_namespace or "").strip()
    if not ns:
        raise InvalidStorageNamespace("storage namespace is empty")
    if ns.startswith("/"):
        return "local", os.path.normpath(ns), ""
    parsed = urllib.parse.urlparse(ns)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidStorageNamespace(
                f"storage namespace {ns!r}: use file:///absolute/path")
        return "local", os.path.normpath(urllib.parse.unquote(parsed.path)), ""
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise InvalidStorageNamespace(f"storage namespace {ns!r}: missing bucket")
        return "s3", parsed.netloc, parsed.path.strip("/")
    raise InvalidStorageNamespace(
        f"storage namespace {ns!r}: expected /abs/dir, file:///abs/dir or s3://bucket/prefix")


def object_address(storage_namespace: str, key: str) -> str:
    """The physical address of `key` inside the namespace, in the namespace's own notation
    (/abs/dir/key, file:///abs/dir/key or s3://bucket/prefix/key)."""
    parse_storage_namespace(storage_namespace)  # rejects what no store could open
    return storage_namespace.rstrip("/") + "/" + key


def open_blob_store(storage_namespace: str, settings=None) -> BlobStore:
    """The store for a repository's storage namespace. `settings` (quarry.config.Settings)
    supplies the S3 endpoint and region."""
    kind, where, prefix = parse_storage_namespace(storage_namespace)
    if kind == "local":
        return LocalBlobStore(where)
    from quarry.blob.s3 import S3BlobStore

    endpoint = getattr(settings, "s3_endpoint_url", "") or None
    region = getattr(settings, "s3_region", "") or "us-east-1"
    return S3BlobStore(where, prefix, endpoint_url=endpoint, region=region)
