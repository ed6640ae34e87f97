"""CountingBlobStore: counts the operations reaching a store, for cost-model tests."""

from __future__ import annotations

import builtins
import threading
from collections import Counter
from collections.abc import Iterator

from quarry.blob.base import BlobBytes, BlobStore, ObjectInfo, ObjectReader, Readable, Written

KINDS = ("get", "put", "exists", "delete", "list", "local_path")


class CountingBlobStore(BlobStore):
    """Wraps a store and counts calls by kind: get, put, exists, delete, list, local_path.

    `local_path` is how readers open a local file in place, so `reads` (get + local_path
    that returned a path) is the number of object reads whatever the backend.
    """

    def __init__(self, inner: BlobStore):
        self.inner = inner
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self.bytes_read = 0
        self.bytes_written = 0
        # Keys read / written, in order (bounded to keep long benchmarks lean).
        self.keys_read: list[str] = []
        self.keys_written: list[str] = []

    def __repr__(self) -> str:
        return f"CountingBlobStore({self.inner!r})"

    def _count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    @property
    def counts(self) -> dict[str, int]:
        with self._lock:
            return {kind: self._counts.get(kind, 0) for kind in KINDS}

    @property
    def reads(self) -> int:
        with self._lock:
            return self._counts["get"] + self._counts["local_path_hit"]

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self.bytes_read = self.bytes_written = 0
            self.keys_read.clear()
            self.keys_written.clear()

    def _note(self, keys: list[str], key: str) -> None:
        with self._lock:
            if len(keys) < 100_000:
                keys.append(key)

    def get(self, key: str) -> bytes:
        self._count("get")
        data = self.inner.get(key)
        with self._lock:
            self.bytes_read += len(data)
        self._note(self.keys_read, key)
        return data

    def open_read(self, key: str, offset: int = 0, length: int | None = None) -> ObjectReader:
        """One object read (whole or a range), counted as a get; its bytes are added as
        they are read."""
        self._count("get")
        reader = self.inner.open_read(key, offset, length)
        self._note(self.keys_read, key)
        return ObjectReader(_CountedReader(reader, self), lambda exc: exc, failures=())

    def _add_read(self, size: int) -> None:
        with self._lock:
            self.bytes_read += size

    def put(self, key: str, data: BlobBytes, if_absent: bool = False) -> bool:
        self._count("put")
        written = self.inner.put(key, data, if_absent=if_absent)
        if written:
            with self._lock:
                self.bytes_written += len(data)
            self._note(self.keys_written, key)
        return written

    def put_stream(self, key: str, source: Readable) -> Written:
        """One put, of the bytes it wrote."""
        self._count("put")
        written = self.inner.put_stream(key, source)
        with self._lock:
            self.bytes_written += written.size
        self._note(self.keys_written, key)
        return written

    def put_deferred(self, key: str, data: BlobBytes) -> bool:
        self._count("put")
        written = self.inner.put_deferred(key, data)
        if written:
            with self._lock:
                self.bytes_written += len(data)
            self._note(self.keys_written, key)
        return written

    def put_if_equals(self, key: str, data: bytes, expected: bytes) -> bool:
        self._count("put")
        written = self.inner.put_if_equals(key, data, expected)
        if written:
            self._note(self.keys_written, key)
        return written

    def sync(self) -> None:
        self.inner.sync()  # a barrier, not an object operation: not counted

    def put_after_sync(self, key: str, data: BlobBytes) -> bool:
        self._count("put")
        written = self.inner.put_after_sync(key, data)
        if written:
            with self._lock:
                self.bytes_written += len(data)
            self._note(self.keys_written, key)
        return written

    def exists(self, key: str) -> bool:
        self._count("exists")
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        self._count("delete")
        self.inner.delete(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list")
        return self.inner.list(prefix)

    def remove_empty_folder(self, prefix: str) -> None:
        self.inner.remove_empty_folder(prefix)

    def first_keys(self, limit: int) -> builtins.list[str]:
        self._count("list")
        return self.inner.first_keys(limit)

    @property
    def is_local(self) -> bool:
        return self.inner.is_local  # not an operation on the store: not counted

    def local_path(self, key: str) -> str | None:
        self._count("local_path")
        path = self.inner.local_path(key)
        if path is not None:
            self._count("local_path_hit")
            self._note(self.keys_read, key)
        return path

    def close(self) -> None:
        self.inner.close()


class _CountedReader:
    def __init__(self, inner: ObjectReader, store: CountingBlobStore) -> None:
        self._inner = inner
        self._store = store

    def read(self, size: int = -1, /) -> bytes:
        data = self._inner.read(size)
        self._store._add_read(len(data))
        return data

    def close(self) -> None:
        self._inner.close()
