"""Lazy iteration over a metarange's entries (the diff of two metaranges is in diff.py)."""

from __future__ import annotations

import bisect
from collections.abc import Callable

from quarry.committed.rangedata import MetaRange, RangeData
from quarry.graveler.model import Entry, RangeInfo

# Loads one range of the metarange being walked (RangeLoader.range, bound to a namespace).
LoadRange = Callable[[RangeInfo], RangeData]


class EntryIterator:
    """Entries of a metarange in path order, from `start`, limited to `prefix`.

    Ranges are read only when the iterator reaches them; ranges entirely before the start
    (or a seek target) or past the prefix are never read. `seek_ge(path)` repositions at the
    first entry >= path (never before the iterator's start or prefix).
    """

    def __init__(
        self,
        load: LoadRange,
        metarange: MetaRange,
        start: str = "",
        prefix: str = "",
        prefetch: Callable[[RangeInfo], None] | None = None,
        readahead: int = 0,
    ):
        self._load = load
        self._prefetch = prefetch if readahead > 0 else None
        self._readahead = readahead
        self._metarange = metarange
        self._start = max(start or "", prefix or "")
        self._prefix = prefix or ""
        self._idx = 0
        self._data: RangeData | None = None
        self._pos = 0
        self._lower = ""
        self._done = False
        self.seek_ge(self._start)

    def __iter__(self) -> EntryIterator:
        return self

    def seek_ge(self, path: str) -> None:
        lower = max(path, self._start)
        idx = self._metarange.range_index(lower)
        if self._data is not None and idx == self._idx:
            # Same range: reposition without reloading.
            self._pos = bisect.bisect_left(self._data.paths, lower)
        else:
            self._data = None
            self._pos = 0
        self._idx = idx
        self._lower = lower
        self._done = False

    def __next__(self) -> Entry:
        data = self._data
        if data is not None:
            pos = self._pos
            if pos < data.n:  # fast path: the next row of the current range
                prefix = self._prefix
                if not prefix or data.paths[pos].startswith(prefix):
                    self._pos = pos + 1
                    return data.entry(pos)
        return self._next_slow()

    def _next_slow(self) -> Entry:
        ranges = self._metarange.ranges
        prefix = self._prefix
        while not self._done:
            data = self._data
            if data is None:
                if self._idx >= len(ranges):
                    break
                info = ranges[self._idx]
                if prefix and info.min_key > self._lower and not info.min_key.startswith(prefix):
                    break  # the next range starts past the prefix
                if self._prefetch is not None:
                    self._read_ahead()
                data = self._data = self._load(info)
                self._pos = bisect.bisect_left(data.paths, self._lower)
            if self._pos >= data.n:
                self._data = None
                self._idx += 1
                continue
            if prefix and not data.paths[self._pos].startswith(prefix):
                break
            entry = data.entry(self._pos)
            self._pos += 1
            return entry
        self._done = True
        self._data = None
        raise StopIteration

    def _read_ahead(self) -> None:
        prefetch = self._prefetch
        if prefetch is None:
            return
        ranges = self._metarange.ranges
        prefix = self._prefix
        for idx in range(self._idx + 1, min(len(ranges), self._idx + 1 + self._readahead)):
            info = ranges[idx]
            if prefix and not info.min_key.startswith(prefix):
                break
            prefetch(info)

    def close(self) -> None:
        self._done = True
        self._data = None
