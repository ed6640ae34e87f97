"""CommittedManager: the facade of committed storage (docs/architecture.md §5).

It composes the narrow parts, each a module over public functions:

    loader.py   RangeLoader: stores, caches, prefetch; get_entry, iterate, metarange_page
    writer.py   RangeWriter: content-defined chunking (RangeBuilder), range and metarange puts
    apply.py    apply_changes: a sorted change stream onto a base metarange
    diff.py     diff: two metaranges by path and identity
    merge.py    merge_metaranges: three-way, at range granularity

and implements what graveler (CommittedReader) and the range-writer servicer call. Writes
(apply_changes, write_metarange, merge_metaranges) run in the range-writer service; reads
(get_entry, iterate, diff, get_metarange) run wherever committed data is read, straight from
the object store through the caches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from quarry.blob import BlobStore, normalize_storage_namespace
from quarry.blob.ownership import NamespaceClaim, claim_namespace
from quarry.committed import apply, columns, diff, loader, merge, replace, spans
from quarry.committed.format import EMPTY_METARANGE_ID
from quarry.committed.iterators import EntryIterator
from quarry.committed.loader import (
    DEFAULT_METARANGE_CACHE_BYTES,
    DEFAULT_RANGE_CACHE_BYTES,
    DEFAULT_READ_WORKERS,
    LoaderOptions,
    RangeLoader,
)
from quarry.committed.stats import CommittedStats, StatsCounter
from quarry.committed.writer import (
    DEFAULT_MAX_RANGE_BYTES,
    DEFAULT_TARGET_RANGE_ENTRIES,
    DEFAULT_WRITE_WORKERS,
    Chunking,
    RangeWriter,
)
from quarry.config import Settings
from quarry.graveler.model import (
    ApplyResult,
    Change,
    Entry,
    MergeResult,
    MergeStrategy,
    RangeInfo,
)

DEFAULT_MAX_RESPONSE_BYTES = Settings.max_response_bytes

__all__ = [
    "CommittedManager",
    "CommittedOptions",
    "CommittedStats",
    "DEFAULT_MAX_RANGE_BYTES",
    "DEFAULT_TARGET_RANGE_ENTRIES",
]


@dataclass(frozen=True)
class CommittedOptions:
    """Chunking (part of the storage format), cache sizes and thread pools."""

    target_range_entries: int = DEFAULT_TARGET_RANGE_ENTRIES
    max_range_bytes: int = DEFAULT_MAX_RANGE_BYTES
    range_cache_bytes: int = DEFAULT_RANGE_CACHE_BYTES
    metarange_cache_bytes: int = DEFAULT_METARANGE_CACHE_BYTES
    write_workers: int = DEFAULT_WRITE_WORKERS
    read_workers: int = DEFAULT_READ_WORKERS


class CommittedManager:
    """Ranges and metaranges of many storage namespaces, with shared caches.

    `blob_opener(storage_namespace) -> BlobStore` opens a namespace's store (called once per
    namespace; e.g. `lambda ns: open_blob_store(ns, settings)`, wrapped in a
    CountingBlobStore to count operations). `cache_dir` holds the disk cache used for stores
    that are not local directories (None disables it). Tuning: `options`, or its fields as
    keyword arguments (`target_range_entries=32`).
    """

    def __init__(
        self,
        blob_opener: Callable[[str], BlobStore],
        cache_dir: str | None = None,
        options: CommittedOptions | None = None,
        **tuning: int,
    ) -> None:
        options = CommittedOptions(**tuning) if options is None else options
        chunking = Chunking(int(options.target_range_entries), int(options.max_range_bytes))
        self._stats = StatsCounter()
        self._loader = RangeLoader(
            blob_opener,
            LoaderOptions(
                cache_dir,
                options.range_cache_bytes,
                options.metarange_cache_bytes,
                options.read_workers,
            ),
            self._stats,
        )
        self._writer = RangeWriter(self._loader, chunking, options.write_workers)
        self.target_range_entries = chunking.target_entries
        self.max_range_bytes = chunking.max_bytes

    @classmethod
    def from_settings(cls, settings: Settings, **tuning: int) -> CommittedManager:
        from quarry.blob import open_blob_store

        sizes = {
            "range_cache_bytes": settings.range_cache_bytes,
            "metarange_cache_bytes": settings.metarange_cache_bytes,
        }
        return cls(
            lambda ns: open_blob_store(ns, settings),
            settings.effective_cache_dir,
            CommittedOptions(**{**sizes, **tuning}),
        )

    # ---- plumbing ---------------------------------------------------------------------------

    def store(self, namespace: str) -> BlobStore:
        """The (cached) blob store of a storage namespace."""
        return self._loader.store(namespace)

    @property
    def stats(self) -> CommittedStats:
        return self._stats.snapshot()

    def reset_stats(self) -> None:
        self._stats.reset()

    def add_stats(self, counts: dict[str, int]) -> None:
        """Count work done for this manager elsewhere: its span worker processes' files and
        reads (processes.ProcessSpanWorkers), so the range-writer's metrics include them."""
        for name, n in counts.items():
            if n:
                self._stats.count(name, n)

    def clear_memory_cache(self) -> None:
        self._loader.clear_memory_cache()

    def close(self) -> None:
        self._writer.close()
        self._loader.close()

    # ---- namespace ownership ----------------------------------------------------------------

    def claim_namespace(
        self, namespace: str, marker: bytes, replace: bytes | None = None
    ) -> NamespaceClaim:
        """Write a repository's ownership marker into its namespace (see
        quarry.blob.ownership.claim_namespace: if the namespace is empty, or if the current
        marker is exactly `replace`). Reports what it found; decides nothing else. A root
        (`/`, `s3://bucket`) or any other invalid namespace is refused before any access."""
        normalize_storage_namespace(namespace)
        return claim_namespace(self.store(namespace), marker, replace)

    # ---- reads ------------------------------------------------------------------------------

    def get_metarange(self, namespace: str, metarange_id: str) -> list[RangeInfo]:
        """The ranges of a metarange, in key order. "" is the empty metarange."""
        return list(self._loader.metarange(namespace, metarange_id).ranges)

    def metarange_page(
        self,
        namespace: str,
        metarange_id: str,
        page_size: int = 0,
        page_token: str = "",
        max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> tuple[list[RangeInfo], str]:
        """One page of get_metarange: at most `page_size` ranges (0 = no count limit) and
        no more than `max_bytes` of encoded response; the token resumes at the next range
        (a metarange is immutable, so a position is stable)."""
        return loader.metarange_page(
            self._loader, namespace, metarange_id, page_size, page_token, max_bytes
        )

    def missing_files(self, namespace: str, metarange_ids: Iterable[str]) -> list[str]:
        """The keys of the files these metaranges need that the namespace does not hold:
        each metarange's file (and index pages), and every range it lists. Asked of the
        store itself, not of the caches: a file deleted since it was read is missing. A
        metarange that is missing is not opened (its ranges are unknown)."""
        from quarry.blob.layout import metarange_key, range_key

        store = self.store(namespace)
        missing: list[str] = []
        ranges: set[str] = set()
        for metarange_id in dict.fromkeys(metarange_ids):
            if metarange_id in ("", EMPTY_METARANGE_ID):
                continue
            if not store.exists(metarange_key(metarange_id)):
                missing.append(metarange_key(metarange_id))
                continue
            held = self._loader.metarange(namespace, metarange_id)
            missing.extend(
                metarange_key(page.id)
                for page in held.pages
                if not store.exists(metarange_key(page.id))
            )
            ranges.update(info.id for info in held.ranges)
        missing.extend(range_key(r) for r in sorted(ranges) if not store.exists(range_key(r)))
        return missing

    def count(self, namespace: str, metarange_id: str) -> int:
        """Number of entries in a metarange (from the metarange alone)."""
        return self._loader.metarange(namespace, metarange_id).count

    def get_entry(self, namespace: str, metarange_id: str, path: str) -> Entry | None:
        """The entry at `path`, reading at most one range."""
        return loader.get_entry(self._loader, namespace, metarange_id, path)

    def iterate(
        self,
        namespace: str,
        metarange_id: str,
        start: str = "",
        prefix: str = "",
        readahead: int = 0,
    ) -> EntryIterator:
        """Entries with path >= start (and starting with prefix), in path order. Ranges are
        read lazily; ranges before start or outside the prefix are never read.
        `readahead` > 0 loads that many following ranges in the background (for full scans
        over a remote store; it may read ranges a consumer that stops early never needs)."""
        return loader.iterate(self._loader, namespace, metarange_id, start, prefix, readahead)

    def diff(
        self,
        namespace: str,
        left_id: str,
        right_id: str,
        prefix: str = "",
        start: str = "",
        readahead: int = 0,
    ) -> Iterator[Change]:
        """Changes from left to right, by path: ADDED / REMOVED (entry None) / CHANGED (the
        right entry), by identity. Ranges with equal ids on both sides are skipped unread.
        `readahead` > 0 loads upcoming ranges that differ in the background (see iterate)."""
        return diff.diff(
            self._loader,
            namespace,
            left_id,
            right_id,
            diff.DiffOptions(prefix=prefix, start=start, readahead=readahead),
        )

    # ---- writes -----------------------------------------------------------------------------

    def write_metarange(self, namespace: str, entries: Iterable[Entry]) -> ApplyResult:
        """Write a metarange holding exactly `entries` (strictly ascending by path)."""
        return self._writer.write_entries(namespace, entries)

    def write_columns(self, namespace: str, batches: Iterable[pa.RecordBatch]) -> ApplyResult:
        """write_metarange of entries in columns (quarry.committed.columns), each batch
        checked (check_batch): no Python object per entry."""
        return self._writer.write_columns(namespace, _checked(batches))

    def apply_changes(
        self, namespace: str, base_metarange_id: str, changes: Iterable[apply.ChangeItem]
    ) -> ApplyResult:
        """Apply changes (strictly ascending by path; entry None = delete) to a base
        metarange ("" = empty). Only ranges a change falls into are read (plus following
        ones until the rechunked stream realigns on a base boundary); every other base range
        is reused by id. The summary counts real changes only: deleting a missing path, or
        putting an entry whose identity equals the base entry's (every field but mtime, the
        physical address included), changes nothing (the base entry is kept). With no real
        change the base id is returned and nothing is written."""
        return apply.apply_changes(self._writer, namespace, base_metarange_id, changes)

    def replace_prefixes(
        self,
        namespace: str,
        base_metarange_id: str,
        prefixes: Sequence[str],
        import_metarange_id: str,
    ) -> ApplyResult:
        """The base with everything under `prefixes` replaced by the import metarange's
        entries (all under the prefixes), at range granularity (quarry.committed.replace)."""
        return replace.replace_prefixes(
            self._writer, namespace, base_metarange_id, prefixes, import_metarange_id
        )

    def merge_metaranges(  # noqa: PLR0913 — the CommittedReader protocol's signature
        self,
        namespace: str,
        base_id: str,
        source_id: str,
        destination_id: str,
        strategy: MergeStrategy = MergeStrategy.DEFAULT,
        max_conflicts: int = merge.DEFAULT_MAX_CONFLICTS,
        dry_run: bool = False,
    ) -> MergeResult:
        """Three-way merge of source into destination from their merge base ("" = the
        empty metarange). See quarry.committed.merge for semantics and cost. Conflicts
        (strategy DEFAULT) and dry runs write nothing and return metarange_id ""; the
        summary always counts what the merge changes (or would change) in the destination."""
        return merge.merge_metaranges(
            self._writer,
            namespace,
            merge.MergeRequest(
                base_id, source_id, destination_id, strategy, max_conflicts, dry_run
            ),
        )

    # ---- scale-out: an apply split into key spans (quarry.committed.spans) ---------------

    def plan_spans(
        self,
        namespace: str,
        base_metarange_id: str,
        changes: Sequence[spans.PutOrDelete],
        parts: int,
        min_ranges_per_span: int = 0,
    ) -> list[spans.Span]:
        """Split applying `changes` (sorted by path) to a base metarange into at most
        `parts` spans that separate writers apply in parallel (apply_span) and whose ranges,
        concatenated, are those of apply_changes (put_metarange names them); see
        spans.plan_spans for `min_ranges_per_span`."""
        base = self._loader.metarange(namespace, base_metarange_id)
        return spans.plan_spans(
            base.ranges, changes, parts, self.target_range_entries, min_ranges_per_span
        )

    def apply_span(
        self, namespace: str, base_metarange_id: str, span: spans.Span
    ) -> apply.AppliedRanges:
        """Apply one span of plan_spans: its ranges written and synced, no metarange."""
        base = self._loader.metarange(namespace, base_metarange_id)
        return spans.apply_span(self._writer, namespace, base.ranges, span)

    def put_metarange(
        self, namespace: str, base_metarange_id: str, applied: Sequence[apply.AppliedRanges]
    ) -> ApplyResult:
        """The metarange of the spans' ranges (in key order), as apply_changes would return
        it: the base's id when nothing changed. Every span must have returned (its ranges
        are durable) before this is called: a metarange never names a range that could be
        lost."""
        combined = spans.combine(applied)
        base = self._loader.metarange(namespace, base_metarange_id)
        if combined.summary.total == 0 and base.id != EMPTY_METARANGE_ID:
            return ApplyResult(base.id, combined.summary, 0, len(base.ranges))
        metarange_id = self._writer.write_metarange_file(namespace, combined.ranges, base)
        return ApplyResult(metarange_id, combined.summary, combined.written, combined.reused)

    def ensure_empty_metarange(self, namespace: str) -> str:
        """Make sure the empty metarange's file exists (e.g. for a new repository)."""
        return self._writer.write_metarange_file(namespace, [])


def _checked(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        columns.check_batch(batch)
        yield batch
