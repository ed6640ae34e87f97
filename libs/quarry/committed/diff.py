"""The diff of two metaranges, by path and identity (docs/architecture.md §5).

Ranges with the same id on both sides hold the same entries and are skipped unread; the
others are read lazily, optionally with background readahead of the ranges that differ.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from quarry.committed.iterators import LoadRange
from quarry.committed.loader import RangeLoader
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.graveler.model import Change, ChangeType, Entry, RangeInfo

# A range's paths and its identity blob (32 bytes a row).
_Rows = tuple[list[str], bytes]


@dataclass(frozen=True)
class DiffOptions:
    """`prefix`/`start`: only paths starting with prefix, at or after start. `readahead` > 0
    loads that many upcoming differing ranges in the background. `entries` False leaves
    Change.entry None (only path and identity columns are needed)."""

    prefix: str = ""
    start: str = ""
    readahead: int = 0
    entries: bool = True


def diff(
    loader: RangeLoader,
    namespace: str,
    left_id: str,
    right_id: str,
    options: DiffOptions | None = None,
) -> Iterator[Change]:
    """Changes from left to right (see CommittedManager.diff)."""
    left = loader.metarange(namespace, left_id)
    right = loader.metarange(namespace, right_id)
    if left.id == right.id:
        return iter(())
    return diff_metaranges(
        lambda info: loader.range(namespace, info),
        left,
        right,
        options,
        prefetch=lambda info: loader.prefetch(namespace, info),
    )


class _Side:
    """One side of a diff: a position in a metarange, loading ranges only when needed."""

    __slots__ = (
        "_load",
        "ranges",
        "idx",
        "data",
        "pos",
        "lower",
        "_prefetch",
        "_unique",
        "_readahead",
    )

    def __init__(
        self,
        load: LoadRange,
        metarange: MetaRange,
        lower: str,
        prefetch: Callable[[RangeInfo], None] | None = None,
        unique: list[int] | None = None,
        readahead: int = 0,
    ):
        self._load = load
        self.ranges = metarange.ranges
        self.idx = metarange.range_index(lower)
        self.data: RangeData | None = None
        self.pos = 0
        self.lower = lower
        # Indexes of ranges whose id is absent on the other side: they will be read.
        self._prefetch = prefetch if readahead > 0 and unique else None
        self._unique = unique or []
        self._readahead = readahead

    def at_unread_range(self) -> RangeInfo | None:
        """The current range if none of it has been consumed (and it is not loaded)."""
        if self.data is None and self.idx < len(self.ranges):
            return self.ranges[self.idx]
        return None

    def skip_range(self) -> None:
        self.idx += 1

    def _ensure_loaded(self) -> RangeData:
        if self.data is None:
            if self._prefetch is not None:
                k = bisect.bisect_right(self._unique, self.idx)
                for idx in self._unique[k : k + self._readahead]:
                    self._prefetch(self.ranges[idx])
            data = self.data = self._load(self.ranges[self.idx])
            self.pos = bisect.bisect_left(data.paths, self.lower)
            return data
        return self.data

    def peek(self) -> str | None:
        while True:
            data = self.data
            if data is None:
                if self.idx >= len(self.ranges):
                    return None
                info = self.ranges[self.idx]
                if info.min_key >= self.lower:
                    return info.min_key  # known without reading the range
                data = self._ensure_loaded()
            if self.pos < data.n:
                return data.paths[self.pos]
            self.data = None
            self.idx += 1

    def identity(self) -> bytes:
        return self._ensure_loaded().identity(self.pos)

    def entry(self) -> Entry:
        return self._ensure_loaded().sparse_entry(self.pos)

    def advance(self) -> None:
        data = self._ensure_loaded()
        self.pos += 1
        if self.pos >= data.n:
            self.data = None
            self.idx += 1


def diff_metaranges(
    load: LoadRange,
    left: MetaRange,
    right: MetaRange,
    options: DiffOptions | None = None,
    prefetch: Callable[[RangeInfo], None] | None = None,
) -> Iterator[Change]:
    """Changes from left to right by path (see CommittedManager.diff). `options.entries`
    False leaves Change.entry None everywhere: then `load` may return ranges holding only
    their path and identity columns."""
    options = options or DiffOptions()
    prefix, readahead, entries = options.prefix, options.readahead, options.entries
    lower = max(options.start or "", prefix or "")
    unique_a = unique_b = None
    if prefetch is not None and readahead > 0:
        ids_a = {r.id for r in left.ranges}
        ids_b = {r.id for r in right.ranges}
        unique_a = [i for i, r in enumerate(left.ranges) if r.id not in ids_b]
        unique_b = [i for i, r in enumerate(right.ranges) if r.id not in ids_a]
    a = _Side(load, left, lower, prefetch, unique_a, readahead)
    b = _Side(load, right, lower, prefetch, unique_b, readahead)
    while True:
        ra, rb = a.at_unread_range(), b.at_unread_range()
        if ra is not None and rb is not None and ra.id == rb.id:
            # Same range, both at its start (or both at the same lower bound inside it).
            a.skip_range()
            b.skip_range()
            continue
        if a.data is not None and b.data is not None:
            # Both sides inside loaded ranges: a tight merge until either range ends.
            yield from _merge_loaded(a, b, prefix, entries)
            if a.pos < a.data.n and b.pos < b.data.n:
                return  # stopped at the end of the prefix
            if a.pos >= a.data.n:
                a.data = None
                a.idx += 1
            if b.pos >= b.data.n:
                b.data = None
                b.idx += 1
            continue
        ka, kb = a.peek(), b.peek()
        if kb is None or (ka is not None and ka < kb):
            if ka is None:
                return  # both sides ended
            if prefix and not ka.startswith(prefix):
                return
            yield Change(ChangeType.REMOVED, ka)
            a.advance()
        elif ka is None or kb < ka:
            if prefix and not kb.startswith(prefix):
                return
            yield Change(ChangeType.ADDED, kb, b.entry() if entries else None)
            b.advance()
        else:
            if prefix and not kb.startswith(prefix):
                return
            if a.identity() != b.identity():
                yield Change(ChangeType.CHANGED, kb, b.entry() if entries else None)
            a.advance()
            b.advance()


def _merge_loaded(a: _Side, b: _Side, prefix: str, entries: bool = True) -> Iterator[Change]:
    """Diff rows of the two loaded ranges from their positions until one range is exhausted
    (or a path leaves the prefix; then both positions stay on that path)."""
    da, db = a.data, b.data
    assert da is not None and db is not None  # both loaded: the caller checked
    pa, pb = da.paths, db.paths
    ida, idb = da.identity_blob, db.identity_blob
    i, j, na, nb = a.pos, b.pos, da.n, db.n
    try:
        while i < na and j < nb:
            ka, kb = pa[i], pb[j]
            if ka == kb:
                if prefix and not ka.startswith(prefix):
                    return
                if ida[i * 32 : i * 32 + 32] != idb[j * 32 : j * 32 + 32]:
                    yield Change(ChangeType.CHANGED, kb, db.sparse_entry(j) if entries else None)
                    i += 1
                    j += 1
                else:
                    # Equal rows come in long runs (a range usually differs in a few rows):
                    # skip the whole run with slice comparisons instead of row by row.
                    run = 1 + _equal_run(
                        (pa, ida), (pb, idb), i + 1, j + 1, min(na - i, nb - j) - 1
                    )
                    i += run
                    j += run
            elif ka < kb:
                if prefix and not ka.startswith(prefix):
                    return
                yield Change(ChangeType.REMOVED, ka)
                i += 1
            else:
                if prefix and not kb.startswith(prefix):
                    return
                yield Change(ChangeType.ADDED, kb, db.sparse_entry(j) if entries else None)
                j += 1
    finally:
        a.pos, b.pos = i, j


def _equal_run(a: _Rows, b: _Rows, i: int, j: int, limit: int) -> int:
    """The number k <= limit of leading rows equal (path and identity) from row i of one
    range and row j of the other: exponential then binary search over slice comparisons."""
    if limit <= 0:
        return 0
    pa, ida = a
    pb, idb = b

    def equal(lo: int, hi: int) -> bool:  # rows [lo, hi) of the run
        return (
            pa[i + lo : i + hi] == pb[j + lo : j + hi]
            and ida[(i + lo) * 32 : (i + hi) * 32] == idb[(j + lo) * 32 : (j + hi) * 32]
        )

    lo, step = 0, 8
    while True:
        hi = min(lo + step, limit)
        if not equal(lo, hi):
            break
        if hi == limit:
            return limit
        lo, step = hi, step * 2
    # Rows [0, lo) are equal; [lo, hi) hold a difference.
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if equal(lo, mid):
            lo = mid
        else:
            hi = mid
    return lo
