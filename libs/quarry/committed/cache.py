"""Caches for immutable ranges and metaranges: an in-memory LRU bounded by bytes, and a
local disk cache (for object stores that are not local directories). Content is addressed
by id and never changes, so nothing is ever invalidated."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any


class LRUCache:
    """Thread-safe LRU bounded by the summed `size` of its values (and optionally a count)."""

    def __init__(self, max_bytes: int, max_items: int | None = None):
        self.max_bytes = max(0, int(max_bytes))
        self.max_items = max_items
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            self._data.move_to_end(key)
            return item[0]

    def peek(self, key: Hashable) -> Any | None:
        """Like get, without refreshing the entry's recency."""
        with self._lock:
            item = self._data.get(key)
            return None if item is None else item[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[key] = (value, size)
            self._bytes += size
            while self._data and (
                self._bytes > self.max_bytes
                or (self.max_items is not None and len(self._data) > self.max_items)
            ):
                _key, (_value, old_size) = self._data.popitem(last=False)
                self._bytes -= old_size

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size_bytes(self) -> int:
        return self._bytes


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

    def store(self, namespace: str, kind: str, object_id: str, data: bytes) -> None:
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
