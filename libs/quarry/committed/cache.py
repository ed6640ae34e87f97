"""Caches for immutable ranges and metaranges: the in-memory LRU (quarry.lru, bounded by
bytes) and a local disk cache (for object stores that are not local directories). Content is addressed
by id and never changes, so nothing is ever invalidated."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid

from quarry.blob.base import BlobBytes


class DiskCache:
    """Files under `<root>/<namespace hash>/<kind>/<id>.parquet`, written atomically."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def path(self, namespace: str, kind: str, object_id: str) -> str:
        ns = hashlib.sha256(namespace.encode()).hexdigest()[:24]
        return os.path.join(self.root, ns, kind, f"{object_id}.parquet")

    def lookup(self, namespace: str, kind: str, object_id: str) -> str | None:
        path = self.path(namespace, kind, object_id)
        return path if os.path.isfile(path) else None

    def store(self, namespace: str, kind: str, object_id: str, data: BlobBytes) -> None:
        path = self.path(namespace, kind, object_id)
        if os.path.isfile(path):
            return
        temp = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(temp, "wb") as fh:
                fh.write(data)
            os.replace(temp, path)
        except OSError:
            # A cache that cannot be written is only slower.
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def discard(self, namespace: str, kind: str, object_id: str) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path(namespace, kind, object_id))
