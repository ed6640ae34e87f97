"""The one in-memory LRU cache of the library (ranges, metaranges, commits, ...)."""

from __future__ import annotations

import threading
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
            self._evict()

    def grow(self, key: Hashable, value: Any, delta: int) -> None:
        """Add `delta` to the size of `key`'s entry if it still holds `value` (a value that
        grew after it was cached), evicting the oldest entries past the bound (this one too,
        if it is the oldest)."""
        with self._lock:
            item = self._data.get(key)
            if item is None or item[0] is not value:
                return
            self._data[key] = (value, item[1] + delta)
            self._bytes += delta
            self._evict()

    def _evict(self) -> None:
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


__all__ = ["LRUCache"]
