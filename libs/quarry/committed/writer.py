"""Writing committed storage: content-defined chunking (RangeBuilder), the sink that writes
range files (RangeSink, in a thread pool), and metarange files (RangeWriter). See
docs/architecture.md §5.

Every put is content-addressed and conditional (if_absent), so writing a file that exists is
a no-op: a writer never overwrites a range or a metarange. Ranges are synced before the
metarange naming them is put (write_metarange_file), and so are the index pages of a
two-level metarange before its root, so a metarange never names a range or page that could be
lost.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import sha256 as _sha256
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

import pyarrow as pa

from quarry import errors
from quarry.committed import columns
from quarry.committed.errors import DuplicatePath, InvalidPath, UnsortedInput
from quarry.committed.format import (
    RowBuffer,
    encode_range,
    is_boundary,
    range_id_of,
    range_key,
)
from quarry.committed.loader import RangeLoader
from quarry.committed.metaranges import MetaRangePlan, metarange_files, plan_metarange
from quarry.committed.rangedata import CumulativeBytes, MetaRange, RangeData
from quarry.graveler.model import ApplyResult, DiffSummary, Entry, RangeInfo

if TYPE_CHECKING:
    from quarry.blob.base import BlobStore

# Content-defined chunking parameters. They are part of the storage format: the same entry
# set yields the same ranges only under the same parameters.
DEFAULT_TARGET_RANGE_ENTRIES = 1024
DEFAULT_MAX_RANGE_BYTES = 4 * 1024 * 1024
DEFAULT_WRITE_WORKERS = 4
# Range writes of one commit or merge running at once into a local directory: its writes
# have no latency worth overlapping, only CPU (2 cores here), and more threads contend for
# the GIL (a scattered commit into 1M entries was no faster with 3 than with 1 or 2,
# measured alternately). Remote stores use every write worker: their latency is what the
# threads hide.
LOCAL_WRITE_LANES = 2
# A range table with more chunks than this is combined into one before it is cached.
MAX_CACHED_CHUNKS = 16


@dataclass(frozen=True)
class Chunking:
    """Where ranges end: after a path with is_boundary(path, target_entries), or once a
    range's entries reach max_bytes."""

    target_entries: int = DEFAULT_TARGET_RANGE_ENTRIES
    max_bytes: int = DEFAULT_MAX_RANGE_BYTES

    def __post_init__(self) -> None:
        if self.target_entries < 1:
            raise errors.InvalidArgument("target_range_entries must be >= 1")
        if self.max_bytes < 1:
            raise errors.InvalidArgument("max_range_bytes must be >= 1")

    def ends_at_boundary(self, info: RangeInfo) -> bool:
        """Whether a range ends where this chunking would end it (so entries may follow)."""
        return info.size_bytes >= self.max_bytes or is_boundary(info.max_key, self.target_entries)


def check_path(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidPath(f"invalid path {path!r}: must be a non-empty string")
    return path


def raise_unsorted(what: str, last: str, path: str) -> NoReturn:
    if path == last:
        raise DuplicatePath(f"{what}: duplicate path {path!r}")
    raise UnsortedInput(f"{what} must be sorted by path: {path!r} after {last!r}")


class RangeWriter:
    """Writes ranges and metaranges of many namespaces, through a RangeLoader (stores and
    caches) with its own pool of write threads."""

    def __init__(
        self, loader: RangeLoader, chunking: Chunking, write_workers: int = DEFAULT_WRITE_WORKERS
    ) -> None:
        self.loader = loader
        self.chunking = chunking
        self.write_workers = max(0, int(write_workers))
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()

    def pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        if not self.write_workers:
            return None
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        self.write_workers, thread_name_prefix="range-write"
                    )
        return self._executor

    def close(self) -> None:
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self._executor = None

    def write_lanes(self, store: BlobStore) -> int:
        """How many range writes of one commit or merge run at once into `store`."""
        lanes = LOCAL_WRITE_LANES if store.is_local else self.write_workers
        return max(1, min(lanes, self.write_workers))

    def sink(self, namespace: str, cache_written: bool) -> RangeSink:
        return RangeSink(self, namespace, cache_written)

    def builder(self, sink: RangeSink) -> RangeBuilder:
        return RangeBuilder(sink, self.chunking)

    def plan_metarange(
        self, ranges: list[RangeInfo], base: MetaRange | None = None
    ) -> MetaRangePlan:
        """The layout and id of the metarange of `ranges`; `base`: the metarange they were
        made from (a commit's base, a merge's destination), whose index pages away from the
        change are taken as they are (see metaranges.plan_metarange)."""
        return plan_metarange(ranges, base)

    def write_metarange_file(
        self,
        namespace: str,
        ranges: list[RangeInfo],
        base: MetaRange | None = None,
        plan: MetaRangePlan | None = None,
        max_keys: list[str] | None = None,
    ) -> str:
        """Put the metarange of `ranges` (its new index pages and its root, each if absent)
        and return its id. `base`: see plan_metarange; `plan`: that of `ranges` if known;
        `max_keys`: those of `ranges` if known. Both lists become the cached metarange's,
        not copies (10k ranges at 10M entries): the caller must not change them after."""
        loader = self.loader
        store = loader.store(namespace)
        if plan is None:
            plan = self.plan_metarange(ranges, base)
        # Into a local directory the CPU is the cost and the bytes are cheap: uncompressed;
        # over the network to an object store zstd (docs/performance.md).
        pages, (key, data) = metarange_files(ranges, plan, compress=not store.is_local)
        max_keys = max_keys or [r.max_key for r in ranges]
        for (page_key, page_data), index in zip(pages, plan.new_pages, strict=True):
            page = plan.pages[index]
            if store.put_deferred(page_key, page_data):
                loader.stats.count("metarange_pages_written")
                loader.stats.count("bytes_written", len(page_data))
            else:
                loader.stats.count("metaranges_existing")
            loader.keep_written_file(namespace, store, "metaranges", page.id, page_data)
            start = plan.page_ends[index - 1] if index else 0
            stop = plan.page_ends[index]
            loader.remember_metarange(
                namespace, MetaRange(page.id, ranges[start:stop], max_keys[start:stop])
            )
        # The ranges and pages it names become durable before the metarange can become
        # visible.
        if store.put_after_sync(key, data):
            loader.stats.count("metaranges_written")
            loader.stats.count("bytes_written", len(data))
        else:
            loader.stats.count("metaranges_existing")
        loader.keep_written_file(namespace, store, "metaranges", plan.id, data)
        loader.remember_metarange(
            namespace,
            MetaRange(plan.id, ranges, max_keys, None, plan.pages, plan.page_ends),
        )
        return plan.id

    def write_entries(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult:
        """Write a metarange holding exactly `entries` (strictly ascending by path): as
        columns (write_columns), the one way entries become new ranges."""
        return self.write_columns(namespace, columns.entry_batches(entries))

    def write_columns(self, namespace: str, batches: Iterable[pa.RecordBatch]) -> ApplyResult:
        """Write a metarange holding exactly the rows of `batches` (quarry.committed.columns:
        ENTRY_COLUMNS_SCHEMA, checked by the caller; strictly ascending by path across all
        of them). No Python object per entry: identities, boundaries, order and sizes come
        from the Arrow buffers, range tables are slices of the batches."""
        sink = self.sink(namespace, cache_written=False)
        builder = self.builder(sink)
        added = 0
        target = self.chunking.target_entries
        with sink:
            last: str | None = None
            for batch in batches:
                n = batch.num_rows
                if not n:
                    continue
                paths = batch.column("path")
                first = paths[0].as_py()
                if last is None:
                    check_path(first)
                elif not first > last:
                    raise_unsorted("entries", last, first)
                unsorted = columns.first_unsorted(paths)
                if unsorted >= 0:
                    raise_unsorted("entries", paths[unsorted - 1].as_py(), paths[unsorted].as_py())
                table = columns.range_table(batch)
                builder.add_rows(table, columns.boundaries(paths, target))
                added += n
                last = paths[n - 1].as_py()
            ranges = builder.finish()
        metarange_id = self.write_metarange_file(namespace, ranges, max_keys=builder.max_keys)
        return ApplyResult(
            metarange_id,
            DiffSummary(added=added),
            ranges_written=builder.written,
            ranges_reused=builder.reused,
        )


class RangeSink:
    """Turns finished range tables into RangeInfo (id computed here) and writes the files,
    in the writer's thread pool when it has one: each range goes to the pool once the next
    one is ready, and the last one is written on the calling thread when it leaves (it would
    only wait otherwise; a commit of one range then hands nothing to another thread). Use as
    a context manager: leaving it writes the last range, waits for every write and raises
    the first failure."""

    def __init__(self, writer: RangeWriter, namespace: str, cache_written: bool) -> None:
        self._loader = writer.loader
        self._namespace = namespace
        self._store = writer.loader.store(namespace)
        self._cache_written = cache_written
        self._pool = writer.pool()
        self._futures: list[concurrent.futures.Future[None]] = []
        self._last: tuple[RangeInfo, pa.Table] | None = None  # not yet handed to the pool
        # Bounds the tables held in memory while their writes are queued.
        lanes = writer.write_lanes(self._store)
        self._slots = threading.BoundedSemaphore(lanes if self._store.is_local else 2 * lanes)

    def __enter__(self) -> RangeSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        first: BaseException | None = None
        last, self._last = self._last, None
        if last is not None and exc is None:
            try:
                self._put(*last)
            except BaseException as error:
                first = error
        for future in self._futures:
            try:
                future.result()
            except BaseException as error:
                first = first or error
        self._futures.clear()
        if first is not None and exc is None:
            raise first

    def write(self, table: pa.Table, size_bytes: int) -> RangeInfo:
        range_id = range_id_of(table)
        paths = table.column("path")
        info = RangeInfo(
            range_id, paths[0].as_py(), paths[len(paths) - 1].as_py(), table.num_rows, size_bytes
        )
        if self._pool is None:
            self._put(info, table)
        else:
            if self._last is not None:
                self._submit(*self._last)
            self._last = (info, table)
        return info

    @property
    def store(self) -> BlobStore:
        return self._store

    def write_now(self, info: RangeInfo, table: pa.Table) -> None:
        """Write a range on the calling thread (thread-safe: for callers that run their own
        write threads)."""
        self._put(info, table)

    def _submit(self, info: RangeInfo, table: pa.Table) -> None:
        assert self._pool is not None
        self._slots.acquire()
        try:
            future = self._pool.submit(self._put, info, table)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        self._futures.append(future)

    def _put(self, info: RangeInfo, table: pa.Table) -> None:
        loader = self._loader
        data = encode_range(table, info.id)
        if self._store.put_deferred(range_key(info.id), data):
            loader.stats.count("ranges_written")
            loader.stats.count("bytes_written", len(data))
        else:
            loader.stats.count("ranges_existing")
        loader.keep_written_file(self._namespace, self._store, "ranges", info.id, data)
        if self._cache_written:
            # A range rewritten from its cached self gains chunks with every commit (slices
            # of slices: a hot range had hundreds), and every read of it pays per chunk.
            # Combining every range written would cost a scattered commit a twentieth more
            # (a range with one change has 3 chunks, rarely more than 16).
            if table.column(0).num_chunks > MAX_CACHED_CHUNKS:
                table = table.combine_chunks()
            loader.remember_range(self._namespace, RangeData(info, table))


@dataclass(frozen=True, slots=True)
class _NewRows:
    table: pa.Table  # new range rows (RANGE_SCHEMA, identities computed), from add_rows


# A pending piece of the range being built: rows [start, stop) of a base range, of a table
# of new rows, or of the row buffer when None.
_Piece = tuple[RangeData | _NewRows | None, int, int]


class RangeBuilder:
    """Content-defined chunking over a stream of new entries and slices of base ranges.

    A range ends after a path p with is_boundary(p), or as soon as its entries reach
    max_bytes. Slices of a base range are added without hashing their paths: a base range
    written by this chunker has no boundary path before its last row (it would have ended
    there), so only its last row is checked.
    """

    def __init__(self, sink: RangeSink, chunking: Chunking) -> None:
        self._sink = sink
        self._target = chunking.target_entries
        self._max_bytes = chunking.max_bytes
        self._out: list[RangeInfo] = []
        self.max_keys: list[str] = []  # of the ranges out so far (a metarange's bisect keys)
        self._pieces: list[_Piece] = []
        self._rows = RowBuffer()
        self._rows_mark = 0  # rows before this index already belong to a piece
        self._count = 0
        self._bytes = 0
        self.written = 0
        self.reused = 0

    @property
    def empty(self) -> bool:
        return self._count == 0

    def add_entry(self, entry: Entry) -> None:
        # is_boundary and entry_bytes, inlined (the hot loop of bulk writes).
        try:
            encoded = entry.path.encode()
        except UnicodeEncodeError:
            raise InvalidPath(f"path {entry.path!r} is not valid UTF-8") from None
        boundary = int.from_bytes(_sha256(encoded).digest()[:8], "big") % self._target == 0
        self._bytes += self._rows.append(entry, len(encoded))
        self._count += 1
        if boundary or self._bytes >= self._max_bytes:
            self._cut()

    def add_slice(self, data: RangeData, start: int, stop: int) -> None:
        if start >= stop:
            return
        self._close_rows_piece()
        cum = data.cum_bytes
        while start < stop:
            limit = cum[start] + (self._max_bytes - self._bytes)
            if cum[stop] >= limit:
                # The byte cap falls inside: cut after the first row that reaches it.
                k = bisect.bisect_left(cum, limit, start + 1, stop + 1)
                self._add_piece(data, start, k, cum[k] - cum[start])
                self._cut()
                start = k
                continue
            self._add_piece(data, start, stop, cum[stop] - cum[start])
            if stop == data.n and data.last_is_boundary(self._target):
                self._cut()
            break

    def add_rows(self, table: pa.Table, boundaries: list[int]) -> None:
        """New rows (RANGE_SCHEMA), `boundaries` the rows i with is_boundary(path_i):
        chunked exactly as add_entry would chunk them one by one (a range ends after a
        boundary row, or after the row that makes its entries reach max_bytes)."""
        n = table.num_rows
        if not n:
            return
        self._close_rows_piece()
        rows = _NewRows(table)
        cum = CumulativeBytes(table)
        start = 0
        for stop, cut in [*((b + 1, True) for b in boundaries), (n, False)]:
            while start < stop:
                limit = cum[start] + (self._max_bytes - self._bytes)
                if cum[stop] >= limit:
                    k = bisect.bisect_left(cum, limit, start + 1, stop + 1)
                    self._add_piece(rows, start, k, cum[k] - cum[start])
                    self._cut()
                    start = k
                    continue
                self._add_piece(rows, start, stop, cum[stop] - cum[start])
                start = stop
            if cut and not self.empty:
                self._cut()

    def _add_piece(self, data: RangeData | _NewRows, start: int, stop: int, size: int) -> None:
        self._pieces.append((data, start, stop))
        self._count += stop - start
        self._bytes += size

    def _close_rows_piece(self) -> None:
        # New rows since the last piece become a piece referring to rows [start, stop) of
        # the row buffer, which turns into one table per range at the cut.
        stop = len(self._rows)
        if stop > self._rows_mark:
            self._pieces.append((None, self._rows_mark, stop))
            self._rows_mark = stop

    def reuse(self, info: RangeInfo) -> None:
        assert self.empty
        self._out.append(info)
        self.max_keys.append(info.max_key)
        self.reused += 1

    def reuse_run(self, infos: list[RangeInfo], max_keys: list[str]) -> None:
        """`max_keys`: those of `infos` (a slice of the base's: no loop over 10k ranges)."""
        assert self.empty
        self._out.extend(infos)
        self.max_keys.extend(max_keys)
        self.reused += len(infos)

    def _cut(self) -> None:
        self._close_rows_piece()
        pieces = self._pieces
        size = self._bytes
        rows = self._rows
        self._pieces = []
        self._count = 0
        self._bytes = 0
        if len(rows):
            self._rows = RowBuffer()
            self._rows_mark = 0
        if len(pieces) == 1:
            data, start, stop = pieces[0]
            if isinstance(data, RangeData) and start == 0 and stop == data.n:
                # Exactly a base range again (e.g. only no-op changes fell into it).
                self._out.append(data.info)
                self.max_keys.append(data.info.max_key)
                self.reused += 1
                return
        rows_table = rows.to_table() if len(rows) else None
        table = _concat(pieces, rows_table)
        info = self._sink.write(table, size)
        self._out.append(info)
        self.max_keys.append(info.max_key)
        self.written += 1

    def finish(self) -> list[RangeInfo]:
        if not self.empty:
            self._cut()
        return self._out


def _concat(pieces: list[_Piece], rows_table: pa.Table | None) -> pa.Table:
    def source(data: RangeData | _NewRows | None) -> pa.Table:
        return rows_table if data is None else data.table

    if len(pieces) == 1 and pieces[0][0] is None:
        return rows_table
    # Left in chunks: hashing and encoding take them as they are, and combining would copy
    # every column of the range once more.
    return pa.concat_tables(
        [source(data).slice(start, stop - start) for data, start, stop in pieces]
    )


__all__ = [
    "Chunking",
    "RangeBuilder",
    "RangeSink",
    "RangeWriter",
    "check_path",
    "raise_unsorted",
    "DEFAULT_MAX_RANGE_BYTES",
    "DEFAULT_TARGET_RANGE_ENTRIES",
    "DEFAULT_WRITE_WORKERS",
]
