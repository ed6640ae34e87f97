"""Committed storage: immutable ranges and metaranges in the object store (ARCHITECTURE §5).

    manager = CommittedManager.from_settings(settings)        # or CommittedManager(opener, cache_dir)
    result = manager.apply_changes(namespace, base_metarange_id, sorted_changes)
    manager.get_entry(namespace, result.metarange_id, "path")

Chunking is content-defined (format.is_boundary, DEFAULT_TARGET_RANGE_ENTRIES, and a byte
cap DEFAULT_MAX_RANGE_BYTES of format.entry_bytes): the same entry set gives the same range
and metarange ids whatever the history, under the same two parameters.

Object-store cost of each operation (n = entries, k = changes; "read" = one GET, or one local
file read; memory and disk caches make repeated reads free). "1 metarange" is one file for a
metarange of one index page (up to ~128 ranges, ~128k entries), else its root and every page
not yet cached (metaranges.py: a metarange sharing pages with one read before reads only the
root and the pages that differ):

    get_metarange / count        1 metarange read (0 for the empty metarange)
    get_entry                    1 metarange + at most 1 range
    iterate(start, prefix)       1 metarange + each range reached; ranges before start or
                                 past the prefix are never read
    diff(left, right)            2 metaranges + the ranges whose ids differ that the walk
                                 reaches; a pair of equal range ids is skipped unread
    apply_changes(k changes)     1 metarange + the ranges a change falls into (+ the next one
                                 when a change moves a range end: realignment), 1 put (if
                                 absent) per new range + <= 2 index pages + 1 for the new
                                 metarange; no put at all when nothing really changed.
                                 Independent of n: 1 change to 100k or 10M entries reads <= 2
                                 ranges and writes <= 2 ranges + <= 2 pages + 1 root (the root
                                 ~n / 128k rows, a page ~128: never a file naming every range).
    write_metarange(n entries)   ~n / 1024 range puts + ~n / 128k page puts + 1 metarange put
    merge_metaranges(b, s, d)    3 metaranges; ranges only where base and source differ
                                 (merge.py): where the destination kept the base's
                                 ranges, the source's are spliced in by id (compared on
                                 path + identity columns for the summary, never written);
                                 where both changed, base/source/destination ranges are
                                 read and the merged ranges re-derived (apply). What only
                                 the destination changed is never read.
Every put is content-addressed and conditional (put if_absent: S3 If-None-Match), so writing
a range that exists is a no-op.
"""

from quarry.committed.errors import (
    DuplicatePath,
    InvalidMetaRangeId,
    InvalidPath,
    InvalidStream,
    MetaRangeNotFound,
    NotImplementedYet,
    RangeCorrupt,
    RangeNotFound,
    UnsortedInput,
)
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    METARANGE_SCHEMA,
    RANGE_SCHEMA,
    entry_bytes,
    is_boundary,
    metarange_key,
    range_key,
)
from quarry.committed.iterators import EntryIterator
from quarry.committed.manager import CommittedManager, CommittedOptions
from quarry.committed.stats import CommittedStats
from quarry.committed.writer import DEFAULT_MAX_RANGE_BYTES, DEFAULT_TARGET_RANGE_ENTRIES

__all__ = [
    "CommittedManager",
    "CommittedOptions",
    "CommittedStats",
    "DEFAULT_MAX_RANGE_BYTES",
    "DEFAULT_TARGET_RANGE_ENTRIES",
    "DuplicatePath",
    "EMPTY_METARANGE_ID",
    "EntryIterator",
    "InvalidMetaRangeId",
    "InvalidPath",
    "InvalidStream",
    "METARANGE_SCHEMA",
    "MetaRangeNotFound",
    "NotImplementedYet",
    "RANGE_SCHEMA",
    "RangeCorrupt",
    "RangeNotFound",
    "UnsortedInput",
    "entry_bytes",
    "is_boundary",
    "metarange_key",
    "range_key",
]
