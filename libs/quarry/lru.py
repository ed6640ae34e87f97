"""The in-memory caches of the library: the one LRU cache (ranges, metaranges, commits, ...)
and the one short-lived TTL cache (repository records, protection rules, writers' branch
records, the authorizer's users and access keys)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any

_NO_SHARED: Mapping[int, int] = {}


class LRUCache:
    """Thread-safe LRU bounded by the summed size of its values (and optionally a count).

    A value's charge is its own `size` plus the `shared` memory it holds: blocks (Arrow
    buffers, by address) that several values may hold at once, charged once while any cached
    value holds them. A range a commit rewrote is slices of its old version's buffers and a
    few new rows: charging it the whole buffers again counted the same memory twice, and a
    merge after two branch commits found its ranges evicted by memory that did not exist.
    Evicting a value frees only what no other cached value holds.
    """

    def __init__(self, max_bytes: int, max_items: int | None = None):
        self.max_bytes = max(0, int(max_bytes))
        self.max_items = max_items
        # key -> (value, own size, shared blocks: address -> bytes)
        self._data: OrderedDict[Hashable, tuple[Any, int, Mapping[int, int]]] = OrderedDict()
        # shared block address -> [cached values holding it, bytes charged for it (the
        # largest size it was given with: a buffer and its prefix share an address)]
        self._holders: dict[int, list[int]] = {}
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

    def put(
        self, key: Hashable, value: Any, size: int, shared: Mapping[int, int] = _NO_SHARED
    ) -> None:
        """Cache `value`, charged `size` plus each block of `shared` (address -> bytes) that
        no cached value holds yet. A value that could never fit (size and all its blocks
        above the bound) is not cached."""
        if size + sum(shared.values()) > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._release(old)
            self._data[key] = (value, size, shared)
            self._bytes += size
            holders = self._holders
            for address, nbytes in shared.items():
                held = holders.get(address)
                if held is None:
                    holders[address] = [1, nbytes]
                    self._bytes += nbytes
                else:
                    held[0] += 1
                    if nbytes > held[1]:
                        self._bytes += nbytes - held[1]
                        held[1] = nbytes
            self._evict()

    def grow(self, key: Hashable, value: Any, delta: int) -> None:
        """Add `delta` to the own size of `key`'s entry if it still holds `value` (a value
        that grew after it was cached), evicting the oldest entries past the bound (this one
        too, if it is the oldest)."""
        with self._lock:
            item = self._data.get(key)
            if item is None or item[0] is not value:
                return
            self._data[key] = (value, item[1] + delta, item[2])
            self._bytes += delta
            self._evict()

    def _release(self, item: tuple[Any, int, Mapping[int, int]]) -> None:
        _value, size, shared = item
        self._bytes -= size
        holders = self._holders
        for address in shared:
            held = holders[address]
            held[0] -= 1
            if not held[0]:
                del holders[address]
                self._bytes -= held[1]

    def _evict(self) -> None:
        while self._data and (
            self._bytes > self.max_bytes
            or (self.max_items is not None and len(self._data) > self.max_items)
        ):
            _key, item = self._data.popitem(last=False)
            self._release(item)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._holders.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def size_bytes(self) -> int:
        return self._bytes


__all__ = ["LRUCache"]


class TTLCache:
    """The one short-lived cache of the library: entries expire `ttl_seconds` after they
    were put, and at most `max_items` are kept (the least recently used go first), so a
    process serving many repositories or branches never grows without bound. `clock` is
    injectable: tests move time instead of sleeping past a constant. Thread-safe.

    Safety: an entry is never served once `ttl` (the caller's, or the cache's) has passed
    since it was put; what the caches of the core may serve stale is bounded by that."""

    def __init__(
        self,
        ttl_seconds: float,
        max_items: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_items = max(1, int(max_items))
        self._clock = clock
        self._data: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, ttl: float | None = None) -> Any | None:
        """The value put under `key` less than `ttl` (default: the cache's) seconds ago,
        else None (an expired entry is dropped)."""
        limit = self.ttl_seconds if ttl is None else ttl
        now = self._clock()
        with self._lock:
            item = self._data.get(key)
            if item is None:
                return None
            if now - item[0] >= limit:
                del self._data[key]
                return None
            self._data.move_to_end(key)
            return item[1]

    def put(self, key: Hashable, value: Any, read_at: float | None = None) -> None:
        """`read_at`: the clock's reading when the value was read (default: now). An entry
        ages from its read, so a slow read does not lengthen how long it may be served."""
        now = self._clock() if read_at is None else read_at
        with self._lock:
            self._data[key] = (now, value)
            self._data.move_to_end(key)
            while len(self._data) > self.max_items:
                self._data.popitem(last=False)
            # Expired entries at the least recently used end go now, not when (if ever)
            # their key is asked for again: a cache of keys that are never repeated held
            # max_items dead values.
            while self._data:
                oldest = next(iter(self._data.values()))
                if self._clock() - oldest[0] < self.ttl_seconds:
                    break
                self._data.popitem(last=False)

    def pop(self, key: Hashable) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def now(self) -> float:
        """The cache's clock (a caller stamps a read with it: put's `read_at`)."""
        return self._clock()

    def __len__(self) -> int:
        return len(self._data)
