"""The two-level metarange (docs/architecture.md §5): which index pages a list of ranges is
cut into, the ids of pages and root, and the files a writer puts.

A flat metarange names every range of the repository (10k at 10M entries, 1.5 MB), so a
commit or merge that touches one range used to rewrite and sync all of it. Here the ranges
are cut into index pages, content-defined like ranges themselves: a page ends after a range
whose id's hash says so (is_page_end, ~PAGE_TARGET_RANGES ranges per page), or once it holds
PAGE_MAX_RANGES. Each page is a flat metarange file; the root lists the pages. The cut is a
pure function of the list of ranges, so the same ranges always give the same pages and root
id, whatever the history; and a localized change re-cuts only the pages around it
(plan_metarange derives the rest from the base's pages): it writes the changed ranges, one or
two pages and a root of ~ranges / PAGE_TARGET_RANGES rows.

A list of ranges that is one page (at most PAGE_MAX_RANGES ranges, usually fewer than
PAGE_TARGET_RANGES) is stored flat, as that page alone: small repositories pay nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from quarry.committed.columns import int64_array, string_array
from quarry.committed.errors import RangeCorrupt
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    FORMAT_TAG,
    METARANGE_FORMAT,
    METARANGE_INDEX_FORMAT,
    METARANGE_INDEX_ID_HEADER,
    METARANGE_SCHEMA,
    Source,
    decode_metarange,
    file_bytes,
    metarange_id_of,
    metarange_key,
    metarange_rows,
    range_frame,
    read_parquet_tagged_one_of,
)
from quarry.graveler.model import RangeInfo

if TYPE_CHECKING:
    from quarry.blob.base import BlobStore
    from quarry.committed.rangedata import MetaRange

# Index pages: part of the storage format (the same ranges give the same pages only under
# the same two numbers). ~80 pages of ~128 ranges at 10M entries: a localized change writes
# a page of ~128 rows and a root of ~80, where a flat metarange had 10k rows.
PAGE_TARGET_RANGES = 128
PAGE_MAX_RANGES = 4 * PAGE_TARGET_RANGES


def is_page_end(info: RangeInfo) -> bool:
    """An index page ends after this range (content-defined: a function of its id only)."""
    return int(info.id[:8], 16) % PAGE_TARGET_RANGES == 0


def metarange_table(ranges: Sequence[RangeInfo]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            string_array([r.id for r in ranges]),
            string_array([r.min_key for r in ranges]),
            string_array([r.max_key for r in ranges]),
            int64_array([r.count for r in ranges], pa.int64()),
            int64_array([r.size_bytes for r in ranges], pa.int64()),
        ],
        schema=METARANGE_SCHEMA,
    )


def encode_metarange(
    ranges: Sequence[RangeInfo], metarange_id: str, compress: bool = True, root: bool = False
) -> memoryview:
    """The file of a flat metarange (or index page) naming `ranges`, or with `root` of an
    index root whose rows (`ranges`) name pages. `compress`: zstd, else uncompressed (local
    directories: the CPU costs more than the bytes); readers take either, and the id does
    not depend on it. No column statistics: readers read the whole file."""
    table = metarange_table(ranges).replace_schema_metadata(
        {
            FORMAT_TAG: METARANGE_INDEX_FORMAT if root else METARANGE_FORMAT,
            b"quarry.metarange_id": metarange_id.encode(),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(
        table,
        sink,
        row_group_size=max(1, table.num_rows),
        compression="zstd" if compress else "none",
        use_dictionary=False,
        write_statistics=False,
    )
    return file_bytes(sink)


def read_metarange(store: BlobStore, metarange_id: str) -> list[RangeInfo]:
    """The ranges of a metarange stored in `store` (a BlobStore of its namespace), without
    CommittedManager's caches: for readers outside the services (Spark jobs, GC, doctor).
    The empty metarange ("" too) has no file. ObjectNotFound if a file is missing."""
    return read_metarange_tree(store, metarange_id)[1]


def read_metarange_tree(
    store: BlobStore, metarange_id: str, pages_read: dict[str, list[RangeInfo]] | None = None
) -> tuple[list[str], list[RangeInfo]]:
    """(the ids of the metarange's index pages, its ranges): every file a metarange id
    names besides its own. No pages for a flat metarange (its file is its only page).
    `pages_read`: pages already read, by id, and where to keep the ones read now (a walk
    over many metaranges of one history reads each shared page once)."""
    if metarange_id in ("", EMPTY_METARANGE_ID):
        return [], []
    is_root, rows = decode_metarange_file(store.get(metarange_key(metarange_id)))
    if not is_root:
        return [], rows
    if pages_read is None:
        pages_read = {}
    ranges: list[RangeInfo] = []
    for page in rows:
        held = pages_read.get(page.id)
        if held is None:
            held = pages_read[page.id] = decode_metarange(store.get(metarange_key(page.id)))
        ranges.extend(checked_page(page, held))
    return [page.id for page in rows], ranges


def checked_page(page: RangeInfo, ranges: list[RangeInfo]) -> list[RangeInfo]:
    """The ranges of an index page, checked against the root's row naming it."""
    if not ranges or ranges[0].min_key != page.min_key or ranges[-1].max_key != page.max_key:
        raise RangeCorrupt(f"index page {page.id} does not hold the keys its root names")
    return ranges


def decode_metarange_file(source: Source) -> tuple[bool, list[RangeInfo]]:
    """(whether the file is an index root, its rows): a root's rows name index pages, a
    flat metarange's name ranges."""
    tag, table = read_parquet_tagged_one_of(
        source, "metarange", (METARANGE_FORMAT, METARANGE_INDEX_FORMAT)
    )
    return tag == METARANGE_INDEX_FORMAT, metarange_rows(table)


def root_id_of(pages: Sequence[RangeInfo]) -> str:
    """The id of an index root whose rows are `pages`."""
    return hashlib.sha256(
        METARANGE_INDEX_ID_HEADER + b"".join([range_frame(p) for p in pages])
    ).hexdigest()


def page_info(ranges: Sequence[RangeInfo]) -> RangeInfo:
    """A root's row naming the page of `ranges` (its id is their flat metarange id)."""
    return RangeInfo(
        metarange_id_of(ranges),
        ranges[0].min_key,
        ranges[-1].max_key,
        sum(r.count for r in ranges),
        sum(r.size_bytes for r in ranges),
    )


@dataclass(frozen=True, slots=True)
class MetaRangePlan:
    """The layout of a metarange of some list of ranges: its id, its pages (root rows; empty
    when it is flat) with the index in the list where each ends, and which pages are new
    (not pages of the base it was planned from: only those may need writing)."""

    id: str
    pages: tuple[RangeInfo, ...]
    page_ends: tuple[int, ...]
    new_pages: tuple[int, ...]

    @property
    def is_root(self) -> bool:
        return bool(self.pages)


def _cut(ranges: Sequence[RangeInfo], start: int) -> int:
    """The end (exclusive) of the page that starts at `start`."""
    limit = min(len(ranges), start + PAGE_MAX_RANGES)
    for i in range(start, limit):
        if is_page_end(ranges[i]):
            return i + 1
    return limit


def _common_run(limit: int, start: int, same: Callable[[int, int], bool]) -> int:
    """The length (at most `limit`) of the run of equal elements two sequences start with,
    the first `start` known equal; same(a, b): whether their elements a..b-1 are equal.
    Growing steps, then a binary search in the step that fails: O(log n) slice comparisons,
    each at C speed."""
    lo, step = start, 64
    while lo < limit:
        hi = min(lo + step, limit)
        if not same(lo, hi):
            while hi - lo > 1:  # 0..lo-1 are equal; the first difference is in lo..hi-1
                mid = (lo + hi) // 2
                if same(lo, mid):
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, step * 2
    return limit


def common_prefix_length(
    left: Sequence[RangeInfo], right: Sequence[RangeInfo], start: int = 0
) -> int:
    """The length of the longest common prefix of two lists of ranges, by slice comparisons
    (C speed: merge and the metarange planner compare the ranges of two metaranges).
    `start`: a length already known to be common (shared_ends)."""
    return _common_run(
        min(len(left), len(right)), start, lambda lo, hi: left[lo:hi] == right[lo:hi]
    )


def common_suffix_length(
    left: Sequence[RangeInfo], right: Sequence[RangeInfo], limit: int, start: int = 0
) -> int:
    """The length of the longest common suffix of two lists of ranges, at most `limit`
    (what a common prefix left over), compared as common_prefix_length compares, from the
    ends and without reversed copies. `start`: a length already known to be common."""
    n, m = len(left), len(right)
    limit = min(limit, n, m)
    return _common_run(
        limit, min(start, limit), lambda lo, hi: left[n - hi : n - lo] == right[m - hi : m - lo]
    )


def shared_ends(left: MetaRange, right: MetaRange) -> tuple[int, int]:
    """(head, tail): how many leading ranges two metaranges have in common, and how many
    trailing ones after those. Index pages both have at either end are counted by their ids
    alone (a page's id is the hash of its ranges): only the pages where they part are
    compared range by range, so a localized change costs O(pages), not O(ranges)."""
    head = tail = 0
    if left.pages and right.pages:
        pages = min(len(left.pages), len(right.pages))
        k = 0
        while k < pages and left.pages[k].id == right.pages[k].id:
            k += 1
        head = left.page_ends[k - 1] if k else 0
        t = 0
        while t < pages - k and left.pages[-1 - t].id == right.pages[-1 - t].id:
            t += 1
        tail = len(left.ranges) - left.page_ends[-1 - t] if t else 0
    left_ranges, right_ranges = left.ranges, right.ranges
    head = common_prefix_length(left_ranges, right_ranges, head)
    limit = min(len(left_ranges), len(right_ranges)) - head
    return head, common_suffix_length(left_ranges, right_ranges, limit, tail)


def plan_metarange(ranges: list[RangeInfo], base: MetaRange | None = None) -> MetaRangePlan:
    """The layout of the metarange of `ranges`. `base`: a metarange they were made from (a
    commit's base, a merge's destination); its pages before the first range that differs
    and after the last one are taken as they are, so the work is proportional to the pages
    a change falls into, not to the ranges. The result never depends on `base`."""
    n = len(ranges)
    cuts: list[tuple[int, RangeInfo | None]] = []  # (page end, page info if the base's)
    start = 0
    base_ends: dict[int, int] = {}
    shift = 0
    tail_start = n
    if base is not None and base.pages:
        base_ranges = base.ranges
        head = common_prefix_length(ranges, base_ranges)
        tail = common_suffix_length(ranges, base_ranges, min(n, len(base_ranges)) - head)
        tail_start = n - tail
        shift = len(base_ranges) - n
        # (Not the base's last page: it may end only because the base's ranges did.)
        for k, end in enumerate(base.page_ends[:-1]):
            if end > head:
                break
            cuts.append((end, base.pages[k]))
            start = end
        base_ends = {end: k for k, end in enumerate(base.page_ends)}
    while start < n:
        end = _cut(ranges, start)
        cuts.append((end, None))
        start = end
        # Both lists cut here and are the same from here on: so are their pages.
        same = base_ends.get(end + shift) if end >= tail_start else None
        if same is not None and base is not None:
            cuts.extend(
                (base_end - shift, base.pages[j])
                for j, base_end in enumerate(base.page_ends[same + 1 :], same + 1)
            )
            break
    if len(cuts) <= 1:
        return MetaRangePlan(metarange_id_of(ranges) if n else EMPTY_METARANGE_ID, (), (), ())
    pages: list[RangeInfo] = []
    new: list[int] = []
    previous = 0
    for index, (end, info) in enumerate(cuts):
        if info is None:
            info = page_info(ranges[previous:end])
            new.append(index)
        pages.append(info)
        previous = end
    return MetaRangePlan(root_id_of(pages), tuple(pages), tuple(end for end, _ in cuts), tuple(new))


def metarange_files(
    ranges: list[RangeInfo], plan: MetaRangePlan, compress: bool
) -> tuple[list[tuple[str, memoryview]], tuple[str, memoryview]]:
    """The files of a planned metarange: (its new pages' (key, bytes)), (its own key, bytes)."""
    if not plan.is_root:
        return [], (metarange_key(plan.id), encode_metarange(ranges, plan.id, compress))
    pages = []
    for index in plan.new_pages:
        start = plan.page_ends[index - 1] if index else 0
        page = plan.pages[index]
        pages.append(
            (
                metarange_key(page.id),
                encode_metarange(ranges[start : plan.page_ends[index]], page.id, compress),
            )
        )
    root = (metarange_key(plan.id), encode_metarange(plan.pages, plan.id, compress, root=True))
    return pages, root


def write_metarange(store: BlobStore, ranges: list[RangeInfo]) -> str:
    """Put the metarange of `ranges` (pages, then the root, each if absent) into `store`
    without caches (import's rewrite of older formats); its id. The ranges and the pages
    become durable before the root can become visible."""
    plan = plan_metarange(ranges)
    pages, (key, data) = metarange_files(ranges, plan, compress=not store.is_local)
    for page_key, page_data in pages:
        store.put_deferred(page_key, page_data)
    store.put_after_sync(key, data)
    return plan.id


__all__ = [
    "MetaRangePlan",
    "checked_page",
    "decode_metarange_file",
    "read_metarange",
    "read_metarange_tree",
    "PAGE_MAX_RANGES",
    "PAGE_TARGET_RANGES",
    "common_prefix_length",
    "common_suffix_length",
    "encode_metarange",
    "is_page_end",
    "metarange_files",
    "metarange_table",
    "page_info",
    "plan_metarange",
    "root_id_of",
    "shared_ends",
    "write_metarange",
]
