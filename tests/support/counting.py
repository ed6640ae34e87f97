"""A Store wrapper that counts operations by (operation, partition class): the KV side of
the cost-model tests."""

from __future__ import annotations

import threading
from collections import Counter

from quarry.kv import store as kv
from quarry.kv.partitions import partition_class


class CountingStore(kv.Store):
    def __init__(self, inner: kv.Store):
        self.inner = inner
        self.counts: Counter = Counter()
        self._lock = threading.Lock()

    def _count(self, op: str, partition: bytes, n: int = 1) -> None:
        try:
            cls = partition_class(partition)
        except Exception:
            cls = "unknown"
        with self._lock:
            self.counts[(op, cls)] += n

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()

    def total(self, cls: str | None = None, op: str | None = None) -> int:
        return sum(
            n
            for (o, c), n in self.counts.items()
            if (cls is None or c == cls) and (op is None or o == op)
        )

    def snapshot(self) -> dict:
        return dict(self.counts)

    def get(self, partition, key):
        self._count("get", partition)
        return self.inner.get(partition, key)

    def set(self, partition, key, value):
        self._count("set", partition)
        return self.inner.set(partition, key, value)

    def set_if(self, partition, key, value, predicate):
        self._count("set_if", partition)
        return self.inner.set_if(partition, key, value, predicate)

    def delete(self, partition, key):
        self._count("delete", partition)
        return self.inner.delete(partition, key)

    def delete_if(self, partition, key, predicate):
        self._count("delete_if", partition)
        return self.inner.delete_if(partition, key, predicate)

    def scan(self, partition, start=b"", end=None, batch_size=kv.DEFAULT_SCAN_BATCH_SIZE):
        self._count("scan", partition)
        return self.inner.scan(partition, start, end, batch_size)

    def batch_get(self, items):
        for partition, _ in items:
            self._count("batch_get", partition)
        return self.inner.batch_get(items)

    def batch_set(self, items):
        for partition, _, _ in items:
            self._count("batch_set", partition)
        return self.inner.batch_set(items)

    def batch_delete(self, items):
        for partition, _ in items:
            self._count("batch_delete", partition)
        return self.inner.batch_delete(items)

    def close(self):
        self.inner.close()
