"""CommittedManager: reads and writes ranges and metaranges (ARCHITECTURE.md §5).

Writes (apply_changes, write_metarange) run in the range-writer service; reads (get_entry,
iterate, diff, get_metarange) run wherever committed data is read, straight from the object
store through the caches.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import logging
import os
import re
import threading
from hashlib import sha256 as _sha256
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa

from quarry import errors
from quarry.blob import BlobStore, ObjectNotFound, normalize_storage_namespace
from quarry.blob.ownership import NamespaceClaim, claim_namespace
from quarry.config import Settings
from quarry.committed.cache import DiskCache, LRUCache
from quarry.committed.errors import (DuplicatePath, InvalidMetaRangeId, InvalidPath,
                                     MetaRangeNotFound, RangeCorrupt, RangeNotFound,
                                     UnsortedInput)
from quarry.committed.format import (EMPTY_METARANGE_ID, RowBuffer, decode_metarange,
                                     decode_range, decode_range_keys, encode_metarange,
                                     encode_range, is_boundary, metarange_id_of,
                                     metarange_key, range_id_of, range_key)
from quarry.committed.iterators import EntryIterator, diff_metaranges
from quarry.committed.merge import merge_metaranges as _merge_metaranges
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.graveler.model import (ApplyResult, Change, ChangeType, DiffSummary, Entry,
                                   MergeResult, MergeStrategy, RangeInfo)

log = logging.getLogger(__name__)

DEFAULT_MAX_RESPONSE_BYTES = Settings.max_response_bytes

# Content-defined chunking parameters. They are part of the storage format: the same entry
# set yields the same ranges only under the same parameters.
DEFAULT_TARGET_RANGE_ENTRIES = 1024
DEFAULT_MAX_RANGE_BYTES = 4 * 1024 * 1024

DEFAULT_RANGE_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_METARANGE_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_WRITE_WORKERS = 4
DEFAULT_READ_WORKERS = 4
# apply_changes prefetches the ranges the next changes fall into: up to this many ranges
# ahead, looking at most this many changes ahead.
PREFETCH_RANGES = 8
PREFETCH_MAX_CHANGES = 10_000

_ID_RE = re.compile(r"^[0-9a-f]{64}$")
# Cache key suffix of ranges loaded with their path and identity columns only.
_KEYS = "keys"


@dataclass
class CommittedStats:
    """Work done by a CommittedManager (cumulative; see reset_stats)."""

    ranges_read: int = 0          # range files fetched from the object store
    ranges_read_disk: int = 0     # range files served by the local disk cache
    ranges_read_keys: int = 0     # of both above: decoding path and identity columns only
    range_cache_hits: int = 0     # ranges served from memory
    ranges_written: int = 0       # range files put to the object store
    ranges_existing: int = 0      # range puts skipped: the file was already there
    metaranges_read: int = 0
    metaranges_read_disk: int = 0
    metarange_cache_hits: int = 0
    metaranges_written: int = 0
    metaranges_existing: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _check_metarange_id(metarange_id: str) -> str:
    if not metarange_id:
        return EMPTY_METARANGE_ID
    if not _ID_RE.match(metarange_id):
        raise InvalidMetaRangeId(f"invalid metarange id {metarange_id!r}")
    return metarange_id


class CommittedManager:
    """Ranges and metaranges of many storage namespaces, with shared caches.

    `blob_opener(storage_namespace) -> BlobStore` opens a namespace's store (called once per
    namespace; e.g. `lambda ns: open_blob_store(ns, settings)`, wrapped in a
    CountingBlobStore to count operations). `cache_dir` holds the disk cache used for stores
    that are not local directories (None disables it).
    """

    def __init__(self, blob_opener: Callable[[str], BlobStore], cache_dir: str | None = None,
                 *, target_range_entries: int = DEFAULT_TARGET_RANGE_ENTRIES,
                 max_range_bytes: int = DEFAULT_MAX_RANGE_BYTES,
                 range_cache_bytes: int = DEFAULT_RANGE_CACHE_BYTES,
                 metarange_cache_bytes: int = DEFAULT_METARANGE_CACHE_BYTES,
                 write_workers: int = DEFAULT_WRITE_WORKERS,
                 read_workers: int = DEFAULT_READ_WORKERS):
        if target_range_entries < 1:
            raise errors.InvalidArgument("target_range_entries must be >= 1")
        if max_range_bytes < 1:
            raise errors.InvalidArgument("max_range_bytes must be >= 1")
        self._opener = blob_opener
        self.target_range_entries = int(target_range_entries)
        self.max_range_bytes = int(max_range_bytes)
        self._stores: dict[str, BlobStore] = {}
        self._stores_lock = threading.Lock()
        self._ranges = LRUCache(range_cache_bytes)
        self._metaranges = LRUCache(metarange_cache_bytes)
        self._disk = DiskCache(os.path.join(cache_dir, "committed")) if cache_dir else None
        self._stats = CommittedStats()
        self._stats_lock = threading.Lock()
        self._write_workers = max(0, int(write_workers))
        self._read_workers = max(0, int(read_workers))
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._read_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        # Range loads in flight (prefetches), so a reader waits instead of reading twice.
        self._inflight: dict[tuple[str, str], concurrent.futures.Future] = {}
        self._inflight_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings, **kwargs) -> "CommittedManager":
        from quarry.blob import open_blob_store

        return cls(lambda ns: open_blob_store(ns, settings), settings.effective_cache_dir,
                   **kwargs)

    # ---- plumbing ---------------------------------------------------------------------------

    def store(self, namespace: str) -> BlobStore:
        """The (cached) blob store of a storage namespace."""
        store = self._stores.get(namespace)
        if store is None:
            with self._stores_lock:
                store = self._stores.get(namespace)
                if store is None:
                    store = self._stores[namespace] = self._opener(namespace)
        return store

    @property
    def stats(self) -> CommittedStats:
        with self._stats_lock:
            return CommittedStats(**asdict(self._stats))

    def reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = CommittedStats()

    def _count(self, name: str, n: int = 1) -> None:
        with self._stats_lock:
            setattr(self._stats, name, getattr(self._stats, name) + n)

    def clear_memory_cache(self) -> None:
        self._ranges.clear()
        self._metaranges.clear()

    def close(self) -> None:
        with self._executor_lock:
            for pool in (self._executor, self._read_executor):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._executor = self._read_executor = None
        with self._stores_lock:
            for store in self._stores.values():
                try:
                    store.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing %r", store)
            self._stores.clear()

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        if not self._write_workers:
            return None
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        self._write_workers, thread_name_prefix="range-write")
        return self._executor

    def _read_pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        if not self._read_workers:
            return None
        if self._read_executor is None:
            with self._executor_lock:
                if self._read_executor is None:
                    self._read_executor = concurrent.futures.ThreadPoolExecutor(
                        self._read_workers, thread_name_prefix="range-read")
        return self._read_executor

    # ---- loading ----------------------------------------------------------------------------

    def _fetch(self, namespace: str, kind: str, key: str, object_id: str,
               decode: Callable, not_found: type[errors.QuarryError]):
        """Decode an object: local file in place, else disk cache, else object store."""
        store = self.store(namespace)
        local = store.local_path(key) if store.is_local else None
        if local is not None:
            try:
                return decode(local), "store"
            except FileNotFoundError:
                raise not_found(f"{kind[:-1]} {object_id} not found in {namespace}") from None
        if self._disk is not None:
            cached = self._disk.lookup(namespace, kind, object_id)
            if cached is not None:
                try:
                    return decode(cached), "disk"
                except (RangeCorrupt, FileNotFoundError):
                    self._disk.discard(namespace, kind, object_id)
        try:
            data = store.get(key)
        except ObjectNotFound:
            raise not_found(f"{kind[:-1]} {object_id} not found in {namespace}") from None
        value = decode(data)
        if self._disk is not None:
            self._disk.store(namespace, kind, object_id, data)
        return value, "store"

    def _metarange(self, namespace: str, metarange_id: str) -> MetaRange:
        metarange_id = _check_metarange_id(metarange_id)
        if metarange_id == EMPTY_METARANGE_ID:
            return MetaRange(EMPTY_METARANGE_ID, [])
        cache_key = (namespace, metarange_id)
        found = self._metaranges.get(cache_key)
        if found is not None:
            self._count("metarange_cache_hits")
            return found
        ranges, source = self._fetch(namespace, "metaranges", metarange_key(metarange_id),
                                     metarange_id, decode_metarange, MetaRangeNotFound)
        self._count("metaranges_read_disk" if source == "disk" else "metaranges_read")
        metarange = MetaRange(metarange_id, ranges)
        self._metaranges.put(cache_key, metarange, metarange.cache_bytes)
        return metarange

    def _range(self, namespace: str, info: RangeInfo) -> RangeData:
        cache_key = (namespace, info.id)
        found = self._ranges.get(cache_key)
        if found is not None:
            self._count("range_cache_hits")
            return found
        with self._inflight_lock:
            future = self._inflight.get(cache_key)
        if future is not None:
            return future.result()
        found = self._ranges.get(cache_key)  # a prefetch may have finished meanwhile
        if found is not None:
            self._count("range_cache_hits")
            return found
        return self._load_range(namespace, info)

    def _prefetch(self, namespace: str, info: RangeInfo, keys_only: bool = False) -> None:
        """Start loading a range in the background (no-op if cached or already loading).
        `keys_only`: only what _keys_range needs."""
        pool = self._read_pool()
        cache_key = (namespace, info.id)
        if pool is None or self._ranges.peek(cache_key) is not None:
            return
        if keys_only:
            keys_key = (namespace, info.id, _KEYS)
            with self._inflight_lock:
                if cache_key in self._inflight or keys_key in self._inflight:
                    return
            if self._ranges.peek(keys_key) is not None:
                return
            cache_key = keys_key
        with self._inflight_lock:
            if cache_key in self._inflight:
                return
            loader = self._load_range_keys if keys_only else self._prefetched
            future = self._inflight[cache_key] = pool.submit(loader, namespace, info)

        def forget(_f, key=cache_key):
            with self._inflight_lock:
                if self._inflight.get(key) is future:
                    del self._inflight[key]

        future.add_done_callback(forget)

    def _prefetched(self, namespace: str, info: RangeInfo) -> RangeData:
        return self._load_range(namespace, info)

    def _keys_range(self, namespace: str, info: RangeInfo) -> RangeData:
        """A range with only its path and identity columns (paths, identity, identity_blob
        work; entries do not), for comparisons that need no entry. A cached full load
        serves too."""
        full_key = (namespace, info.id)
        keys_key = (namespace, info.id, _KEYS)
        for cache_key in (full_key, keys_key):
            found = self._ranges.get(cache_key)
            if found is not None:
                self._count("range_cache_hits")
                return found
        with self._inflight_lock:
            future = self._inflight.get(full_key) or self._inflight.get(keys_key)
        if future is not None:
            return future.result()
        found = self._ranges.get(keys_key)  # a prefetch may have finished meanwhile
        if found is not None:
            self._count("range_cache_hits")
            return found
        return self._load_range_keys(namespace, info)

    def _load_range_keys(self, namespace: str, info: RangeInfo) -> RangeData:
        table, source = self._fetch(namespace, "ranges", range_key(info.id), info.id,
                                    decode_range_keys, RangeNotFound)
        self._count("ranges_read_disk" if source == "disk" else "ranges_read")
        self._count("ranges_read_keys")
        if table.num_rows != info.count or table.num_rows == 0:
            raise RangeCorrupt(f"range {info.id} has {table.num_rows} rows, its metarange "
                               f"says {info.count}")
        data = RangeData(info, table)
        self._ranges.put((namespace, info.id, _KEYS), data, data.cache_bytes)
        return data

    def _load_range(self, namespace: str, info: RangeInfo) -> RangeData:
        cache_key = (namespace, info.id)
        table, source = self._fetch(namespace, "ranges", range_key(info.id), info.id,
                                    decode_range, RangeNotFound)
        self._count("ranges_read_disk" if source == "disk" else "ranges_read")
        if table.num_rows != info.count or table.num_rows == 0:
            raise RangeCorrupt(f"range {info.id} has {table.num_rows} rows, its metarange "
                               f"says {info.count}")
        data = RangeData(info, table)
        self._ranges.put(cache_key, data, data.cache_bytes)
        return data

    # ---- namespace ownership ----------------------------------------------------------------

    def claim_namespace(self, namespace: str, marker: bytes,
                        replace: bytes | None = None) -> NamespaceClaim:
        """Write a repository's ownership marker into its namespace (see
        quarry.blob.ownership.claim_namespace: if the namespace is empty, or if the current
        marker is exactly `replace`). Reports what it found; decides nothing else. A root
        (`/`, `s3://bucket`) or any other invalid namespace is refused before any access."""
        normalize_storage_namespace(namespace)
        return claim_namespace(self.store(namespace), marker, replace)

    # ---- reads ------------------------------------------------------------------------------

    def get_metarange(self, namespace: str, metarange_id: str) -> list[RangeInfo]:
        """The ranges of a metarange, in key order. "" is the empty metarange."""
        return list(self._metarange(namespace, metarange_id).ranges)

    def metarange_page(self, namespace: str, metarange_id: str, page_size: int = 0,
                       page_token: str = "", max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
                       ) -> tuple[list[RangeInfo], str]:
        """One page of get_metarange: at most `page_size` ranges (0 = no count limit) and
        no more than `max_bytes` of encoded response; the token resumes at the next range
        (a metarange is immutable, so a position is stable)."""
        from quarry.graveler.errors import InvalidPageToken
        from quarry.graveler.iterators import decode_page_token, encode_page_token
        from quarry.paging import PageBudget

        if page_size < 0:
            raise errors.InvalidArgument("page_size may not be negative")
        state = decode_page_token(page_token, "metarange", "index")
        start = 0
        if state:
            start = state["index"]
            if state["metarange"] != metarange_id or not isinstance(start, int) or start < 0:
                raise InvalidPageToken("page_token belongs to another metarange")
        ranges = self._metarange(namespace, metarange_id).ranges
        budget = PageBudget.for_response(page_size or max(1, len(ranges)), max_bytes)
        end = start
        while end < len(ranges) and budget.admit(ranges[end]):
            end += 1
        token = encode_page_token(metarange=metarange_id, index=end) if end < len(ranges) else ""
        return list(ranges[start:end]), token

    def count(self, namespace: str, metarange_id: str) -> int:
        """Number of entries in a metarange (from the metarange alone)."""
        return self._metarange(namespace, metarange_id).count

    def get_entry(self, namespace: str, metarange_id: str, path: str) -> Entry | None:
        """The entry at `path`, reading at most one range."""
        metarange = self._metarange(namespace, metarange_id)
        i = metarange.range_index(path)
        if i >= len(metarange.ranges) or path < metarange.ranges[i].min_key:
            return None
        data = self._range(namespace, metarange.ranges[i])
        j = data.find(path)
        return data.sparse_entry(j) if j >= 0 else None

    def iterate(self, namespace: str, metarange_id: str, start: str = "",
                prefix: str = "", readahead: int = 0) -> EntryIterator:
        """Entries with path >= start (and starting with prefix), in path order. Ranges are
        read lazily; ranges before start or outside the prefix are never read.
        `readahead` > 0 loads that many following ranges in the background (for full scans
        over a remote store; it may read ranges a consumer that stops early never needs)."""
        metarange = self._metarange(namespace, metarange_id)
        return EntryIterator(lambda info: self._range(namespace, info), metarange,
                             start=start, prefix=prefix,
                             prefetch=lambda info: self._prefetch(namespace, info),
                             readahead=readahead)

    def diff(self, namespace: str, left_id: str, right_id: str, prefix: str = "",
             start: str = "", readahead: int = 0) -> Iterator[Change]:
        """Changes from left to right, by path: ADDED / REMOVED (entry None) / CHANGED (the
        right entry), by identity. Ranges with equal ids on both sides are skipped unread.
        `readahead` > 0 loads upcoming ranges that differ in the background (see iterate)."""
        left = self._metarange(namespace, left_id)
        right = self._metarange(namespace, right_id)
        if left.id == right.id:
            return iter(())
        return diff_metaranges(lambda info: self._range(namespace, info), left, right,
                               prefix=prefix, start=start,
                               prefetch=lambda info: self._prefetch(namespace, info),
                               readahead=readahead)

    # ---- writes -----------------------------------------------------------------------------

    def write_metarange(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult:
        """Write a metarange holding exactly `entries` (strictly ascending by path)."""
        store = self.store(namespace)
        sink = _RangeSink(self, namespace, store, cache_written=False)
        builder = _RangeBuilder(sink, self.target_range_entries, self.max_range_bytes)
        added = 0
        with sink:
            last: str | None = None
            for entry in entries:
                if not isinstance(entry, Entry):
                    raise errors.InvalidArgument(f"expected an Entry, got {type(entry).__name__}")
                path = entry.path
                if last is not None and not path > last:
                    _raise_unsorted("entries", last, path)
                if last is None:
                    _check_path(path)
                last = path
                builder.add_entry(entry)
                added += 1
            ranges = builder.finish()
        metarange_id = self._write_metarange(namespace, store, ranges)
        return ApplyResult(metarange_id, DiffSummary(added=added),
                           ranges_written=builder.written, ranges_reused=builder.reused)

    def apply_changes(self, namespace: str, base_metarange_id: str,
                      changes: Iterable[tuple[str, Entry | None] | Change]) -> ApplyResult:
        """Apply changes (strictly ascending by path; entry None = delete) to a base
        metarange ("" = empty). Only ranges a change falls into are read (plus following ones
        until the rechunked stream realigns on a base boundary); every other base range is
        reused by id. The summary counts real changes only: deleting a missing path, or
        putting an entry whose identity equals the base entry's (every field but mtime, the
        physical address included), changes nothing (the base entry is kept). With no real change the base id is returned and nothing is written."""
        store = self.store(namespace)
        base = self._metarange(namespace, base_metarange_id)
        out, summary, written, reused = self._apply_to_ranges(namespace, base, changes)
        if summary.total == 0 and base.id != EMPTY_METARANGE_ID:
            return ApplyResult(base.id, summary, ranges_written=0,
                               ranges_reused=len(base.ranges))
        metarange_id = self._write_metarange(namespace, store, out)
        return ApplyResult(metarange_id, summary, ranges_written=written, ranges_reused=reused)

    def _apply_to_ranges(self, namespace: str, base: MetaRange, changes: Iterable,
                         any_ranges: bool = False,
                         loaded: dict[str, RangeData] | None = None
                         ) -> tuple[list[RangeInfo], DiffSummary, int, int]:
        """apply_changes without writing the metarange: (ranges, summary, ranges written,
        ranges reused). `any_ranges`: `base` is a sorted, disjoint list of ranges that need
        not come from one metarange (merge splices ranges of two), so a range that does not
        end at a chunk boundary may sit before others; such a range is never reused with
        entries after it. `loaded`: ranges the caller holds already (by id)."""
        loaded = loaded or {}
        store = self.store(namespace)
        summary = DiffSummary()
        sink = _RangeSink(self, namespace, store, cache_written=True)
        builder = _RangeBuilder(sink, self.target_range_entries, self.max_range_bytes)
        stream = _ChangeStream(changes)
        ranges = base.ranges
        prefetch = _Prefetcher(self, namespace, base, stream, loaded)
        with sink:
            last = len(ranges) - 1
            for i, info in enumerate(ranges):
                following = stream.peek_path()
                if builder.empty and (following is None or following > info.max_key) and (
                        (i < last and not any_ranges) or (i == last and following is None)
                        or self._ends_at_boundary(info)):
                    # Aligned and untouched. (The final range may end only because the data
                    # did: it is reusable with entries after it only if it ends at a boundary.)
                    builder.reuse(info)
                    continue
                prefetch.ahead_of(i)
                data = loaded.get(info.id) or self._range(namespace, info)
                self._merge_range(builder, data, stream, info.max_key, summary)
            # Changes after the last base range.
            while stream.peek_path() is not None:
                _path, entry = stream.next()
                if entry is not None:
                    summary.added += 1
                    builder.add_entry(entry)
            out = builder.finish()
        return out, summary, builder.written, builder.reused

    def merge_metaranges(self, namespace: str, base_id: str, source_id: str,
                         destination_id: str, strategy: MergeStrategy = MergeStrategy.DEFAULT,
                         max_conflicts: int = 100, dry_run: bool = False) -> MergeResult:
        """Three-way merge of source into destination from their merge base ("" = the
        empty metarange). See quarry.committed.merge for semantics and cost. Conflicts
        (strategy DEFAULT) and dry runs write nothing and return metarange_id ""; the
        summary always counts what the merge changes (or would change) in the destination."""
        return _merge_metaranges(self, namespace, base_id, source_id, destination_id,
                                strategy=strategy, max_conflicts=max_conflicts,
                                dry_run=dry_run)

    def _ends_at_boundary(self, info: RangeInfo) -> bool:
        return (info.size_bytes >= self.max_range_bytes
                or is_boundary(info.max_key, self.target_range_entries))

    @staticmethod
    def _merge_range(builder: "_RangeBuilder", data: RangeData, stream: "_ChangeStream",
                     max_key: str, summary: DiffSummary) -> None:
        paths = data.paths
        n = data.n
        pos = 0  # rows [pos, ...) of the base range are not yet handed to the builder
        while True:
            path = stream.peek_path()
            if path is None or path > max_key:
                break
            _path, entry = stream.next()
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

    def _write_metarange(self, namespace: str, store: BlobStore,
                         ranges: list[RangeInfo]) -> str:
        # The ranges it names become durable before the metarange can.
        store.sync()
        metarange_id = metarange_id_of(ranges)
        data = encode_metarange(ranges, metarange_id)
        if store.put(metarange_key(metarange_id), data, if_absent=True):
            self._count("metaranges_written")
        else:
            self._count("metaranges_existing")
        if self._disk is not None and not store.is_local:
            self._disk.store(namespace, "metaranges", metarange_id, data)
        metarange = MetaRange(metarange_id, list(ranges))
        self._metaranges.put((namespace, metarange_id), metarange, metarange.cache_bytes)
        return metarange_id

    def ensure_empty_metarange(self, namespace: str) -> str:
        """Make sure the empty metarange's file exists (e.g. for a new repository)."""
        return self._write_metarange(namespace, self.store(namespace), [])


# ---- helpers -------------------------------------------------------------------------------

def _check_path(path: object) -> str:
    if not isinstance(path, str) or not path:
        raise InvalidPath(f"invalid path {path!r}: must be a non-empty string")
    return path


def _raise_unsorted(what: str, last: str, path: str):
    if path == last:
        raise DuplicatePath(f"{what}: duplicate path {path!r}")
    raise UnsortedInput(f"{what} must be sorted by path: {path!r} after {last!r}")


class _ChangeStream:
    """A validated stream of (path, entry | None) with lookahead."""

    __slots__ = ("_it", "_buffer", "_last", "_ended", "consumed")

    def __init__(self, changes: Iterable):
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
        if isinstance(item, Change):
            path = item.path
            entry = None if item.type == ChangeType.REMOVED else item.entry
            if item.type != ChangeType.REMOVED and entry is None:
                raise errors.InvalidArgument(f"change at {path!r} has no entry")
        else:
            try:
                path, entry = item
            except (TypeError, ValueError):
                raise errors.InvalidArgument(
                    "changes must be (path, Entry | None) tuples or Change objects") from None
        _check_path(path)
        if entry is not None:
            if not isinstance(entry, Entry):
                raise errors.InvalidArgument(f"change at {path!r}: expected an Entry")
            if entry.path != path:
                raise errors.InvalidArgument(
                    f"change at {path!r} carries an entry for {entry.path!r}")
        last = self._last
        if last is not None and not path > last:
            _raise_unsorted("changes", last, path)
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


class _Prefetcher:
    """Loads, in the background, the base ranges the upcoming changes fall into."""

    def __init__(self, manager: CommittedManager, namespace: str, base: MetaRange,
                 stream: _ChangeStream, loaded: dict[str, RangeData] | None = None):
        self._manager = manager
        self._loaded = loaded or {}
        self._namespace = namespace
        self._base = base
        self._stream = stream
        self._enabled = manager._read_workers > 0 and len(base.ranges) > 1
        self._scheduled: collections.deque[int] = collections.deque()
        self._last = -1  # highest range index scheduled
        self._scan = 0   # absolute index of the next change to look at

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
                    self._manager._prefetch(self._namespace, ranges[j])


class _RangeSink:
    """Turns finished range tables into RangeInfo (id computed here) and writes the files,
    in a thread pool when the manager has one. Use as a context manager: leaving it waits
    for every write and raises the first failure."""

    def __init__(self, manager: CommittedManager, namespace: str, store: BlobStore,
                 cache_written: bool):
        self._manager = manager
        self._namespace = namespace
        self._store = store
        self._cache_written = cache_written
        self._pool = manager._pool()
        self._futures: list[concurrent.futures.Future] = []
        # Bounds the tables held in memory while their writes are queued.
        self._slots = threading.BoundedSemaphore(max(2, 2 * manager._write_workers))

    def __enter__(self) -> "_RangeSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        first: BaseException | None = None
        for future in self._futures:
            try:
                future.result()
            except BaseException as error:  # noqa: BLE001
                first = first or error
        self._futures.clear()
        if first is not None and exc is None:
            raise first

    def write(self, table: pa.Table, size_bytes: int) -> RangeInfo:
        range_id = range_id_of(table)
        paths = table.column("path")
        info = RangeInfo(range_id, paths[0].as_py(), paths[len(paths) - 1].as_py(),
                         table.num_rows, size_bytes)
        if self._pool is None:
            self._put(info, table)
        else:
            self._slots.acquire()
            try:
                future = self._pool.submit(self._put, info, table)
            except BaseException:
                self._slots.release()
                raise
            future.add_done_callback(lambda _f: self._slots.release())
            self._futures.append(future)
        return info

    def _put(self, info: RangeInfo, table: pa.Table) -> None:
        manager = self._manager
        key = range_key(info.id)
        data = encode_range(table, info.id)
        if self._store.put_deferred(key, data):
            manager._count("ranges_written")
        else:
            manager._count("ranges_existing")
        if manager._disk is not None and not self._store.is_local:
            manager._disk.store(self._namespace, "ranges", info.id, data)
        if self._cache_written:
            rd = RangeData(info, table)
            manager._ranges.put((self._namespace, info.id), rd, rd.cache_bytes)


class _RangeBuilder:
    """Content-defined chunking over a stream of new entries and slices of base ranges.

    A range ends after a path p with is_boundary(p), or as soon as its entries reach
    max_bytes. Slices of a base range are added without hashing their paths: a base range
    written by this chunker has no boundary path before its last row (it would have ended
    there), so only its last row is checked.
    """

    def __init__(self, sink: _RangeSink, target_entries: int, max_bytes: int):
        self._sink = sink
        self._target = target_entries
        self._max_bytes = max_bytes
        self._out: list[RangeInfo] = []
        # Pending pieces, in order: (RangeData, start, stop) = rows of a base range, or
        # (None, start, stop) = rows of the row buffer.
        self._pieces: list = []
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

    def _add_piece(self, data: RangeData, start: int, stop: int, size: int) -> None:
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
        self.reused += 1

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
        if len(pieces) == 1 and pieces[0][0] is not None:
            data, start, stop = pieces[0]
            if start == 0 and stop == data.n:
                # Exactly a base range again (e.g. only no-op changes fell into it).
                self._out.append(data.info)
                self.reused += 1
                return
        rows_table = rows.to_table() if len(rows) else None
        if len(pieces) == 1 and pieces[0][0] is None:
            table = rows_table
        else:
            table = pa.concat_tables([
                (rows_table if data is None else data.table).slice(start, stop - start)
                for data, start, stop in pieces]).combine_chunks()
        self._out.append(self._sink.write(table, size))
        self.written += 1

    def finish(self) -> list[RangeInfo]:
        if not self.empty:
            self._cut()
        return self._out
