"""Applying a sorted change stream onto a base metarange (docs/architecture.md §5).

Only ranges a change falls into are read (plus following ones until the rechunked stream
realigns on a base boundary); every other base range is reused by id. Merge (merge.py) uses
apply_to_ranges over a spliced list of ranges.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from quarry import errors
from quarry.committed.format import EMPTY_METARANGE_ID
from quarry.committed.loader import RangeLoader
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.committed.writer import RangeBuilder, RangeWriter, check_path, raise_unsorted
from quarry.graveler.model import ApplyResult, Change, ChangeType, DiffSummary, Entry, RangeInfo
from quarry.runtime import deadlines

# apply prefetches the ranges the next changes fall into: up to this many ranges ahead,
# looking at most this many changes ahead.
PREFETCH_RANGES = 8
# Changes added after the base's last range between two deadline checks (each base range
# is a check of its own).
CHECK_EVERY_CHANGES = 1024
PREFETCH_MAX_CHANGES = 10_000
# merge_range searches a range's paths in place (PathColumn) for its first changes, and in a
# list of them from this many on (building it costs about as much as 16 searches in place).
LIST_PATHS_AFTER = 16

ChangeItem = tuple[str, Entry | None] | Change


@dataclass
class AppliedRanges:
    """What apply_to_ranges produced: the new ranges (no metarange written yet)."""

    ranges: list[RangeInfo]
    summary: DiffSummary
    written: int
    reused: int
    max_keys: list[str] | None = None  # of `ranges`, when the producer kept them


@dataclass
class ApplyOptions:
    """`open_ends`: positions of base ranges that may not end at a chunk boundary although
    others follow them. Every range of a metarange this chunker wrote ends at one except its
    last; a base spliced from runs of several metaranges (merge) may hold such a last range
    before others, and names it here. Such a range is reused with entries after it only if
    it does end at a boundary (checked); every other range but the base's last is taken to.
    `loaded`: ranges the caller holds already (by id)."""

    open_ends: Sequence[int] = ()
    loaded: dict[str, RangeData] = field(default_factory=dict)


def apply_changes(
    writer: RangeWriter, namespace: str, base_metarange_id: str, changes: Iterable[ChangeItem]
) -> ApplyResult:
    """See CommittedManager.apply_changes."""
    base = writer.loader.metarange(namespace, base_metarange_id)
    applied = apply_to_ranges(writer, namespace, base, changes)
    if applied.summary.total == 0 and base.id != EMPTY_METARANGE_ID:
        return ApplyResult(
            base.id, applied.summary, ranges_written=0, ranges_reused=len(base.ranges)
        )
    metarange_id = writer.write_metarange_file(
        namespace, applied.ranges, base, max_keys=applied.max_keys
    )
    # The summary counts exactly what differs from the base: a merge of the result (a
    # branch's commit into another) counts its untouched ranges from it instead of reading.
    summary = applied.summary
    writer.loader.remember_diff_counts(
        namespace, base.id, metarange_id, (summary.added, summary.removed, summary.changed)
    )
    return ApplyResult(
        metarange_id, applied.summary, ranges_written=applied.written, ranges_reused=applied.reused
    )


def apply_to_ranges(
    writer: RangeWriter,
    namespace: str,
    base: MetaRange,
    changes: Iterable[ChangeItem],
    options: ApplyOptions | None = None,
) -> AppliedRanges:
    """apply_changes without writing the metarange."""
    options = options or ApplyOptions()
    loaded = options.loaded
    loader = writer.loader
    summary = DiffSummary()
    stream = ChangeStream(changes)
    ranges = base.ranges
    ends_at_boundary = writer.chunking.ends_at_boundary
    max_keys = base.max_keys
    open_ends = sorted(options.open_ends)
    if stream.peek_path() is None and all(
        k >= len(ranges) - 1 or ends_at_boundary(ranges[k]) for k in open_ends
    ):
        # No change, and no open end to re-chunk (the last range is reused whatever it ends
        # on): the base's ranges are the result as they are, in the base's own lists, not
        # copies (the lists of a MetaRange are never changed once made). A merge whose gaps
        # were all spliced from the source gets here with 10k ranges at 10M entries: copying
        # and freeing them was most of what a localized merge cost more at 10M than at 1M.
        return AppliedRanges(ranges, summary, 0, len(ranges), max_keys)
    sink = writer.sink(namespace, cache_written=True)
    builder = writer.builder(sink)
    prefetch = Prefetcher(loader, namespace, base, stream, loaded)
    open_set = set(open_ends)
    with sink:
        last = len(ranges) - 1
        i = 0
        while i <= last:
            # A loop point: stop once the caller's deadline passed or it cancelled.
            deadlines.check()
            following = stream.peek_path()
            if builder.empty:
                # The run of ranges before the next change, reused in one step (a commit
                # would otherwise spend a Python loop step on every range of the
                # repository).
                stop = _untouched_run(ranges, max_keys, i, following, open_ends, ends_at_boundary)
                if stop > i:
                    builder.reuse_run(ranges[i:stop], max_keys[i:stop])
                    i = stop
                    continue
            info = ranges[i]
            if (
                builder.empty
                and (following is None or following > info.max_key)
                and (
                    (i < last and i not in open_set)
                    or (i == last and following is None)
                    or ends_at_boundary(info)
                )
            ):
                # Aligned and untouched. (The final range may end only because the data
                # did: it is reusable with entries after it only if it ends at a boundary.)
                builder.reuse(info)
                i += 1
                continue
            prefetch.ahead_of(i)
            data = loaded.get(info.id) or loader.range(namespace, info)
            merge_range(builder, data, stream, info.max_key, summary)
            i += 1
        # Changes after the last base range.
        added = 0
        while stream.peek_path() is not None:
            added += 1
            if added % CHECK_EVERY_CHANGES == 0:
                deadlines.check()
            _path, entry = stream.next()
            if entry is not None:
                summary.added += 1
                builder.add_entry(entry)
        out = builder.finish()
    return AppliedRanges(out, summary, builder.written, builder.reused, builder.max_keys)


def _untouched_run(  # the loop state of apply_to_ranges
    ranges: list[RangeInfo],
    max_keys: list[str],
    start: int,
    following: str | None,
    open_ends: list[int],
    ends_at_boundary: Callable[[RangeInfo], bool],
) -> int:
    """The end of the run of ranges from `start` that apply reuses as they are, the builder
    being empty: no change falls into them (their max_key is below the next change), and
    each may have entries after it (it is not the last range with changes still to come;
    one of `open_ends` (sorted) must end at a chunk boundary). Only the open ends are
    looked at, not every range of the run: a merge's base names 10k ranges at 10M entries."""
    last = len(ranges) - 1
    if following is None:
        stop = last + 1
    else:
        stop = min(bisect.bisect_left(max_keys, following, start), last)
    for k in open_ends[bisect.bisect_left(open_ends, start) :]:
        if k >= stop:
            break
        if not ends_at_boundary(ranges[k]):
            return k
    return stop


def merge_range(
    builder: RangeBuilder, data: RangeData, stream: ChangeStream, max_key: str, summary: DiffSummary
) -> None:
    """Hand the builder one base range (ending at max_key) with the changes that fall into
    it applied."""
    paths = data.sorted_paths
    n = data.n
    pos = 0  # rows [pos, ...) of the base range are not yet handed to the builder
    looked_up = 0
    while True:
        path = stream.peek_path()
        if path is None or path > max_key:
            break
        _path, entry = stream.next()
        looked_up += 1
        if looked_up == LIST_PATHS_AFTER:
            # Many changes in this range (a localized commit): each binary search would decode
            # ~log2(n) paths from Arrow again; the list is built once and searched in C.
            paths = data.paths
        j = bisect.bisect_left(paths, path, pos)
        exists = j < n and paths[j] == path
        if entry is None:
            if not exists:
                continue  # deleting a missing path: nothing
            builder.add_slice(data, pos, j)
            pos = j + 1
            summary.removed += 1
        elif exists:
            if data.identity(j) == entry.identity:
                continue  # same identity (only mtime may differ): keep the base entry
            builder.add_slice(data, pos, j)
            builder.add_entry(entry)
            pos = j + 1
            summary.changed += 1
        else:
            builder.add_slice(data, pos, j)
            builder.add_entry(entry)
            pos = j
            summary.added += 1
    builder.add_slice(data, pos, n)


class ChangeStream:
    """A validated stream of (path, entry | None) with lookahead."""

    __slots__ = ("_it", "_buffer", "_last", "_ended", "consumed")

    def __init__(self, changes: Iterable[ChangeItem]) -> None:
        self._it = iter(changes)
        self._buffer: collections.deque[tuple[str, Entry | None]] = collections.deque()
        self._last: str | None = None
        self._ended = False
        self.consumed = 0  # items handed out by next()

    def _fill(self) -> bool:
        if self._ended:
            return False
        try:
            item = next(self._it)
        except StopIteration:
            self._ended = True
            return False
        path, entry = _as_put_or_delete(item)
        last = self._last
        if last is not None and not path > last:
            raise_unsorted("changes", last, path)
        self._last = path
        self._buffer.append((path, entry))
        return True

    def peek_path(self) -> str | None:
        if not self._buffer and not self._fill():
            return None
        return self._buffer[0][0]

    def next(self) -> tuple[str, Entry | None]:
        if not self._buffer and not self._fill():
            raise StopIteration
        self.consumed += 1
        return self._buffer.popleft()

    def path_at(self, index: int, limit: int) -> str | None:
        """The path of the change at absolute position `index` (>= consumed), reading ahead
        at most `limit` changes past the consumed ones; None past the end or the limit."""
        offset = index - self.consumed
        if offset >= limit:
            return None
        while len(self._buffer) <= offset:
            if not self._fill():
                return None
        return self._buffer[offset][0]


def _as_put_or_delete(item: object) -> tuple[str, Entry | None]:
    entry: object
    if isinstance(item, Change):
        path: object = item.path
        entry = None if item.type == ChangeType.REMOVED else item.entry
        if item.type != ChangeType.REMOVED and entry is None:
            raise errors.InvalidArgument(f"change at {path!r} has no entry")
    else:
        try:
            path, entry = item  # type: ignore[misc]
        except (TypeError, ValueError):
            raise errors.InvalidArgument(
                "changes must be (path, Entry | None) tuples or Change objects"
            ) from None
    checked = check_path(path)
    if entry is not None:
        if not isinstance(entry, Entry):
            raise errors.InvalidArgument(f"change at {checked!r}: expected an Entry")
        if entry.path != checked:
            raise errors.InvalidArgument(
                f"change at {checked!r} carries an entry for {entry.path!r}"
            )
    return checked, entry


class Prefetcher:
    """Loads, in the background, the base ranges the upcoming changes fall into."""

    def __init__(
        self,
        loader: RangeLoader,
        namespace: str,
        base: MetaRange,
        stream: ChangeStream,
        loaded: dict[str, RangeData],
    ) -> None:
        self._loader = loader
        self._loaded = loaded
        self._namespace = namespace
        self._base = base
        self._stream = stream
        self._enabled = loader.reads_ahead(namespace) and len(base.ranges) > 1
        self._scheduled: collections.deque[int] = collections.deque()
        self._last = -1  # highest range index scheduled
        self._scan = 0  # absolute index of the next change to look at

    def ahead_of(self, current: int) -> None:
        if not self._enabled:
            return
        scheduled = self._scheduled
        while scheduled and scheduled[0] <= current:
            scheduled.popleft()
        ranges = self._base.ranges
        max_keys = self._base.max_keys
        stream = self._stream
        self._scan = max(self._scan, stream.consumed)
        while len(scheduled) < PREFETCH_RANGES:
            path = stream.path_at(self._scan, PREFETCH_MAX_CHANGES)
            if path is None:
                return
            self._scan += 1
            j = bisect.bisect_left(max_keys, path, max(current, self._last, 0))
            if j >= len(ranges):
                self._enabled = False  # every further change is past the last range
                return
            if j > current and j > self._last:
                self._last = j
                scheduled.append(j)
                if ranges[j].id not in self._loaded:
                    self._loader.prefetch(self._namespace, ranges[j])
