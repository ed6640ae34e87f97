"""Reading committed storage: the blob stores of namespaces, the range and metarange caches
(memory, and disk for remote stores), background prefetch, and the read operations over
them (get_entry, iterate, metarange pages). See docs/architecture.md §5.

Writers (writer.py) put what they write into these caches through the public `remember_*`
and `keep_written_file` methods; nothing outside this module touches the caches directly.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from quarry import errors
from quarry.blob import BlobStore, ObjectNotFound
from quarry.blob.base import BlobBytes
from quarry.committed.cache import DiskCache
from quarry.committed.cache_metrics import CACHE_BYTES
from quarry.committed.errors import (
    InvalidMetaRangeId,
    MetaRangeNotFound,
    RangeCorrupt,
    RangeNotFound,
)
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    decode_range,
    decode_range_keys,
    metarange_key,
    range_key,
)
from quarry.committed.iterators import EntryIterator
from quarry.committed.metaranges import checked_page, decode_metarange_file
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.committed.stats import CommittedStats, StatsCounter
from quarry.graveler.model import Entry, RangeInfo
from quarry.lru import LRUCache
from quarry.telemetry.metrics import expose

log = logging.getLogger(__name__)

DEFAULT_RANGE_CACHE_BYTES = 256 * 1024 * 1024
DEFAULT_METARANGE_CACHE_BYTES = 64 * 1024 * 1024
DEFAULT_READ_WORKERS = 4
# Diff counts between two metaranges kept (see RangeLoader.remember_diff_counts).
DIFF_COUNTS_KEPT = 4096

_ID_RE = re.compile(r"^[0-9a-f]{64}$")
# Cache key suffix of ranges loaded with their path and identity columns only.
_KEYS = "keys"

T = TypeVar("T")


@dataclass(frozen=True)
class LoaderOptions:
    """Cache sizes and read parallelism of a RangeLoader. `cache_dir` holds the disk cache
    used for stores that are not local directories (None disables it)."""

    cache_dir: str | None = None
    range_cache_bytes: int = DEFAULT_RANGE_CACHE_BYTES
    metarange_cache_bytes: int = DEFAULT_METARANGE_CACHE_BYTES
    read_workers: int = DEFAULT_READ_WORKERS


def check_metarange_id(metarange_id: str) -> str:
    """The metarange id, "" mapped to the empty metarange; InvalidMetaRangeId otherwise."""
    if not metarange_id:
        return EMPTY_METARANGE_ID
    if not _ID_RE.match(metarange_id):
        raise InvalidMetaRangeId(f"invalid metarange id {metarange_id!r}")
    return metarange_id


class RangeLoader:
    """Ranges and metaranges of many storage namespaces, read through shared caches.

    `blob_opener(storage_namespace) -> BlobStore` opens a namespace's store (called once per
    namespace). Immutable files are cached in memory; for non-local stores also on disk.
    """

    def __init__(
        self, blob_opener: Callable[[str], BlobStore], options: LoaderOptions, stats: StatsCounter
    ) -> None:
        self._opener = blob_opener
        self._stores: dict[str, BlobStore] = {}
        self._stores_lock = threading.Lock()
        self._ranges = LRUCache(options.range_cache_bytes)
        self._metaranges = LRUCache(options.metarange_cache_bytes)
        self._disk = (
            DiskCache(os.path.join(options.cache_dir, "committed")) if options.cache_dir else None
        )
        self.stats = stats
        self.read_workers = max(0, int(options.read_workers))
        self._read_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        # Range loads in flight (prefetches), so a reader waits instead of reading twice.
        self._inflight: dict[tuple[str, ...], concurrent.futures.Future[RangeData]] = {}
        self._inflight_lock = threading.Lock()
        # (added, removed, changed) from one metarange to another, by id, as merges found
        # them: a pure function of two content-addressed ids, so never stale.
        self._diff_counts = LRUCache(DIFF_COUNTS_KEPT, DIFF_COUNTS_KEPT)
        expose(CACHE_BYTES)
        CACHE_BYTES.loaders.add(self)

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

    def clear_memory_cache(self) -> None:
        self._ranges.clear()
        self._metaranges.clear()

    def close(self) -> None:
        with self._executor_lock:
            if self._read_executor is not None:
                self._read_executor.shutdown(wait=True)
            self._read_executor = None
        with self._stores_lock:
            for store in self._stores.values():
                try:
                    store.close()
                except Exception:
                    log.exception("closing %r", store)
            self._stores.clear()

    def _read_pool(self) -> concurrent.futures.ThreadPoolExecutor | None:
        if not self.read_workers:
            return None
        if self._read_executor is None:
            with self._executor_lock:
                if self._read_executor is None:
                    self._read_executor = concurrent.futures.ThreadPoolExecutor(
                        self.read_workers, thread_name_prefix="range-read"
                    )
        return self._read_executor

    # ---- what writers hand over -------------------------------------------------------------

    def remember_range(self, namespace: str, data: RangeData) -> None:
        """Cache a range just written (its table is at hand: a later read is free)."""
        self._cache_range((namespace, data.info.id), data)

    def _cache_range(self, key: tuple[str, ...], data: RangeData) -> None:
        """Cache a range, charged for its Arrow buffers (once, however many cached ranges
        hold them) and for its Python columns as it builds them."""
        ranges = self._ranges
        data.on_growth(lambda grown, delta: ranges.grow(key, grown, delta))
        ranges.put(key, data, data.python_bytes(), data.buffers())

    def remember_metarange(self, namespace: str, metarange: MetaRange) -> None:
        self._metaranges.put((namespace, metarange.id), metarange, metarange.cache_bytes)

    @property
    def range_cache_bytes(self) -> int:
        """The bytes the range cache charges, at most LoaderOptions.range_cache_bytes."""
        return self._ranges.size_bytes

    @property
    def metarange_cache_bytes(self) -> int:
        """The bytes the metarange cache holds (metaranges and index pages), at most
        LoaderOptions.metarange_cache_bytes."""
        return self._metaranges.size_bytes

    def remember_diff_counts(
        self, namespace: str, left_id: str, right_id: str, counts: tuple[int, int, int]
    ) -> None:
        """Remember what a diff from metarange `left_id` to `right_id` counts (added,
        removed, changed): a commit knows it of its parent and result, a merge of its
        destination and result; a merge with those as base and source (a branch's commit
        merged, a merge's retry: base' = that destination, source' = that result) needs
        it. Only exact counts may be remembered: every later summary built on them would
        be wrong by the same."""
        self._diff_counts.put((namespace, left_id, right_id), counts, 1)

    def diff_counts(
        self, namespace: str, left_id: str, right_id: str
    ) -> tuple[int, int, int] | None:
        """Counts remembered by remember_diff_counts, or None. (Not cleared with the memory
        cache: they are not file contents, and a few thousand tuples.)"""
        counts: tuple[int, int, int] | None = self._diff_counts.get((namespace, left_id, right_id))
        return counts

    def keep_written_file(
        self, namespace: str, store: BlobStore, kind: str, object_id: str, data: BlobBytes
    ) -> None:
        """Put a file just written to a non-local store into the disk cache too."""
        if self._disk is not None and not store.is_local:
            self._disk.store(namespace, kind, object_id, data)

    # ---- loading ----------------------------------------------------------------------------

    def _fetch(
        self,
        namespace: str,
        kind: str,
        object_id: str,
        decode: Callable[[Any], T],
        not_found: type[errors.QuarryError],
    ) -> tuple[T, str]:
        """Decode an object: local file in place, else disk cache, else object store."""
        key = range_key(object_id) if kind == "ranges" else metarange_key(object_id)
        store = self.store(namespace)
        local = store.local_path(key) if store.is_local else None
        if local is not None:
            try:
                return _naming(kind, object_id, namespace, decode, local), "store"
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
        value = _naming(kind, object_id, namespace, decode, data)
        if self._disk is not None:
            self._disk.store(namespace, kind, object_id, data)
        return value, "store"

    def metarange(self, namespace: str, metarange_id: str) -> MetaRange:
        """A metarange ("" = the empty one), from the cache or read once. An index root is
        read with its pages, each of which is cached on its own: a metarange that shares
        most pages with one read before (the next commit's) reads only its root and the
        pages that changed."""
        metarange_id = check_metarange_id(metarange_id)
        if metarange_id == EMPTY_METARANGE_ID:
            return MetaRange(EMPTY_METARANGE_ID, [])
        cache_key = (namespace, metarange_id)
        found = self._metaranges.get(cache_key)
        if found is not None:
            self.stats.count("metarange_cache_hits")
            return found
        (is_root, rows), source = self._fetch(
            namespace, "metaranges", metarange_id, decode_metarange_file, MetaRangeNotFound
        )
        self.stats.count("metaranges_read_disk" if source == "disk" else "metaranges_read")
        if not is_root:
            metarange = MetaRange(metarange_id, rows)
        else:
            self._read_pages(namespace, rows)
            ranges: list[RangeInfo] = []
            max_keys: list[str] = []
            ends: list[int] = []
            for page in rows:
                held = self.metarange(namespace, page.id)
                if held.pages:
                    raise RangeCorrupt(f"index page {page.id} is itself an index root")
                ranges.extend(checked_page(page, held.ranges))
                max_keys.extend(held.max_keys)
                ends.append(len(ranges))
            metarange = MetaRange(metarange_id, ranges, max_keys, None, tuple(rows), tuple(ends))
        self._metaranges.put(cache_key, metarange, metarange.cache_bytes)
        return metarange

    def _read_pages(self, namespace: str, pages: list[RangeInfo]) -> None:
        """Read the pages of an index root not yet cached at once, from a remote store (one
        at a time, a cold root over 80 pages would wait 80 round trips)."""
        pool = self._read_pool() if self.reads_ahead(namespace) else None
        if pool is None:
            return
        missing = [p.id for p in pages if self._metaranges.peek((namespace, p.id)) is None]
        if len(missing) > 1:
            for _ in pool.map(lambda page_id: self.metarange(namespace, page_id), missing):
                pass

    def range(self, namespace: str, info: RangeInfo) -> RangeData:
        """A range with every column, from the cache, a prefetch in flight, or read once."""
        return self._cached_or_load(((namespace, info.id),), self._load_range, namespace, info)

    def _cached_or_load(
        self,
        cache_keys: tuple[tuple[str, ...], ...],
        load: Callable[[str, RangeInfo], RangeData],
        namespace: str,
        info: RangeInfo,
    ) -> RangeData:
        """What the cache holds under the first of `cache_keys` it has, else what a prefetch
        in flight under one of them returns, else load(namespace, info). The cache is looked
        at again after the in-flight lookup: a prefetch may have finished between the two,
        and the file must not be read a second time."""
        found = self._cached(cache_keys)
        if found is not None:
            return found
        with self._inflight_lock:
            future = next((f for f in map(self._inflight.get, cache_keys) if f is not None), None)
        if future is not None:
            return future.result()
        found = self._cached(cache_keys)
        return found if found is not None else load(namespace, info)

    def _cached(self, cache_keys: tuple[tuple[str, ...], ...]) -> RangeData | None:
        for cache_key in cache_keys:
            found = self._ranges.get(cache_key)
            if found is not None:
                self.stats.count("range_cache_hits")
                return found
        return None

    def prefetch(self, namespace: str, info: RangeInfo, keys_only: bool = False) -> None:
        """Start loading a range in the background (no-op if cached or already loading).
        `keys_only`: only what keys_range needs."""
        if not self.reads_ahead(namespace):
            return
        pool = self._read_pool()
        cache_key: tuple[str, ...] = (namespace, info.id)
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
            loader = self._load_range_keys if keys_only else self._load_range
            future = self._inflight[cache_key] = pool.submit(loader, namespace, info)

        def forget(_f: object, key: tuple[str, ...] = cache_key) -> None:
            with self._inflight_lock:
                if self._inflight.get(key) is future:
                    del self._inflight[key]

        future.add_done_callback(forget)

    def reads_ahead(self, namespace: str) -> bool:
        """Whether prefetches of this namespace's ranges load anything. Reading ahead hides
        a remote store's latency; a local directory has none worth hiding (its files are
        read from the page cache in ~50 us), and handing the decodes to the pool only made
        the threads contend for the GIL: a scattered commit into 1M entries took 0.77-0.79
        s with read-ahead and 0.66-0.69 s without (commit_vs_git, two runs of seven rounds
        each, alternating)."""
        return self.read_workers > 0 and not self.store(namespace).is_local

    def keys_range(self, namespace: str, info: RangeInfo) -> RangeData:
        """A range with only its path and identity columns (paths, identity, identity_blob
        work; entries do not), for comparisons that need no entry. A cached full load
        serves too."""
        cache_keys = ((namespace, info.id), (namespace, info.id, _KEYS))
        return self._cached_or_load(cache_keys, self._load_range_keys, namespace, info)

    def _load_range_keys(self, namespace: str, info: RangeInfo) -> RangeData:
        table, source = self._fetch(namespace, "ranges", info.id, decode_range_keys, RangeNotFound)
        self.stats.count("ranges_read_disk" if source == "disk" else "ranges_read")
        self.stats.count("ranges_read_keys")
        data = _checked(info, table)
        self._cache_range((namespace, info.id, _KEYS), data)
        return data

    def _load_range(self, namespace: str, info: RangeInfo) -> RangeData:
        table, source = self._fetch(namespace, "ranges", info.id, decode_range, RangeNotFound)
        self.stats.count("ranges_read_disk" if source == "disk" else "ranges_read")
        data = _checked(info, table)
        self._cache_range((namespace, info.id), data)
        return data


def _checked(info: RangeInfo, table: Any) -> RangeData:
    if table.num_rows != info.count or table.num_rows == 0:
        raise RangeCorrupt(
            f"range {info.id} has {table.num_rows} rows, its metarange says {info.count}"
        )
    return RangeData(info, table)


# ---- reads ----------------------------------------------------------------------------------


def get_entry(loader: RangeLoader, namespace: str, metarange_id: str, path: str) -> Entry | None:
    """The entry at `path`, reading at most one range."""
    metarange = loader.metarange(namespace, metarange_id)
    i = metarange.range_index(path)
    if i >= len(metarange.ranges) or path < metarange.ranges[i].min_key:
        return None
    data = loader.range(namespace, metarange.ranges[i])
    j = data.find(path)
    return data.sparse_entry(j) if j >= 0 else None


def iterate(
    loader: RangeLoader,
    namespace: str,
    metarange_id: str,
    start: str = "",
    prefix: str = "",
    readahead: int = 0,
) -> EntryIterator:
    """Entries with path >= start (and starting with prefix), in path order, read lazily
    (see CommittedManager.iterate)."""
    metarange = loader.metarange(namespace, metarange_id)
    return EntryIterator(
        lambda info: loader.range(namespace, info),
        metarange,
        start=start,
        prefix=prefix,
        prefetch=lambda info: loader.prefetch(namespace, info),
        readahead=readahead,
    )


def metarange_page(
    loader: RangeLoader,
    namespace: str,
    metarange_id: str,
    page_size: int,
    page_token: str,
    max_bytes: int,
) -> tuple[list[RangeInfo], str]:
    """One page of a metarange's ranges (see CommittedManager.metarange_page)."""
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
    ranges = loader.metarange(namespace, metarange_id).ranges
    budget = PageBudget.for_response(page_size or max(1, len(ranges)), max_bytes)
    end = start
    while end < len(ranges) and budget.admit(ranges[end]):
        end += 1
    token = encode_page_token(metarange=metarange_id, index=end) if end < len(ranges) else ""
    return list(ranges[start:end]), token


__all__ = [
    "CommittedStats",
    "LoaderOptions",
    "RangeLoader",
    "check_metarange_id",
    "get_entry",
    "iterate",
    "metarange_page",
]


def _naming(
    kind: str, object_id: str, namespace: str, decode: Callable[[Any], T], source: Any
) -> T:
    """decode(source), with a RangeCorrupt naming the file it is about (an operator must
    know which range or metarange to restore)."""
    try:
        return decode(source)
    except RangeCorrupt as exc:
        what = kind[:-1]  # "range" or "metarange"
        raise RangeCorrupt(
            f"{what} {object_id} in {namespace}: {exc.message}",
            metadata={f"{what}_id": object_id, "namespace": namespace},
        ) from None
