"""In-memory KV store for tests: a dict per partition plus a sorted key list for scans.

One lock guards everything; every operation is short (a scan takes the lock per page only),
so contention is not a concern at test scale.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from quarry.kv import store
from quarry.kv.store import GetResult, KeyValue


class _Partition:
    __slots__ = ("values", "keys")

    def __init__(self) -> None:
        self.values: dict[bytes, bytes] = {}
        self.keys: list[bytes] = []  # sorted; Python compares bytes as unsigned bytes

    def put(self, key: bytes, value: bytes) -> None:
        if key not in self.values:
            bisect.insort(self.keys, key)
        self.values[key] = value

    def remove(self, key: bytes) -> None:
        if self.values.pop(key, None) is not None:
            del self.keys[bisect.bisect_left(self.keys, key)]


class MemoryStore(store.PagedStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[bytes, _Partition] = {}

    # Callers may hand in bytearray/memoryview; dict keys must be hashable and immutable.
    def get(self, partition: bytes, key: bytes) -> GetResult:
        store.check_key(partition, key)
        partition, key = bytes(partition), bytes(key)
        with self._lock:
            part = self._partitions.get(partition)
            value = part.values.get(key) if part else None
        if value is None:
            raise store.KeyNotFound("key not found")
        return GetResult(value=value, predicate=value)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        store.check_item(partition, key, value)
        with self._lock:
            self._put(bytes(partition), bytes(key), bytes(value))

    def set_if(
        self, partition: bytes, key: bytes, value: bytes, predicate: store.Predicate
    ) -> None:
        store.check_item(partition, key, value)
        store.check_predicate(predicate)
        partition, key, value = bytes(partition), bytes(key), bytes(value)
        with self._lock:
            part = self._partitions.get(partition)
            current = part.values.get(key) if part else None
            if predicate is store.ABSENT:
                ok = current is None
            elif predicate is store.EXISTS:
                ok = current is not None
            else:
                assert isinstance(predicate, store.Equals)  # check_predicate allows nothing else
                ok = current is not None and current == predicate.value
            if not ok:
                raise store.PredicateFailed(f"predicate {predicate!r} failed")
            self._put(partition, key, value)

    def delete(self, partition: bytes, key: bytes) -> None:
        store.check_key(partition, key)
        with self._lock:
            self._remove(bytes(partition), bytes(key))

    def delete_if(self, partition: bytes, key: bytes, predicate: store.Equals) -> None:
        store.check_key(partition, key)
        store.check_delete_predicate(predicate)
        partition, key = bytes(partition), bytes(key)
        with self._lock:
            part = self._partitions.get(partition)
            current = part.values.get(key) if part else None
            if current is None or current != predicate.value:
                raise store.PredicateFailed(f"predicate {predicate!r} failed")
            self._remove(partition, key)

    def batch_get(self, items: Sequence[tuple[bytes, bytes]]) -> list[GetResult | None]:
        store.check_batch_keys(items)
        results: list[GetResult | None] = []
        with self._lock:
            for partition, key in items:
                part = self._partitions.get(bytes(partition))
                value = part.values.get(bytes(key)) if part else None
                results.append(None if value is None else GetResult(value, value))
        return results

    def batch_set(self, items: Sequence[tuple[bytes, bytes, bytes]]) -> None:
        store.check_batch_items(items)
        with self._lock:
            for partition, key, value in items:
                self._put(bytes(partition), bytes(key), bytes(value))

    def batch_delete(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        store.check_batch_keys(items)
        with self._lock:
            for partition, key in items:
                self._remove(bytes(partition), bytes(key))

    # ---- internals (caller holds the lock) ----

    def _put(self, partition: bytes, key: bytes, value: bytes) -> None:
        part = self._partitions.get(partition)
        if part is None:
            part = self._partitions[partition] = _Partition()
        part.put(key, value)

    def _remove(self, partition: bytes, key: bytes) -> None:
        part = self._partitions.get(partition)
        if part is None:
            return
        part.remove(key)
        if not part.values:
            # Drop empty partitions so short-lived staging tokens do not accumulate.
            del self._partitions[partition]

    def _page(
        self, partition: bytes, lower: bytes, after: bytes | None, end: bytes | None, limit: int
    ) -> tuple[list[KeyValue], bytes | None]:
        with self._lock:
            part = self._partitions.get(partition)
            if part is None:
                return [], None
            keys = part.keys
            i = bisect.bisect_left(keys, lower)
            if after is not None:
                i = max(i, bisect.bisect_right(keys, after))
            stop = len(keys) if end is None else bisect.bisect_left(keys, end)
            page = [KeyValue(k, part.values[k]) for k in keys[i : min(stop, i + limit)]]
            more = i + limit < stop
        return page, (page[-1].key if more else None)
