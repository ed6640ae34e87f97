"""Where two metaranges differ, at range granularity, and the change counts there
(what merge.py plans and counts with; docs/architecture.md §4 Merge, §5)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from quarry.committed.diff import DiffOptions, diff_metaranges
from quarry.committed.iterators import LoadRange
from quarry.committed.loader import RangeLoader
from quarry.committed.metaranges import shared_ends
from quarry.committed.rangedata import MetaRange, changed_rows
from quarry.graveler.model import Change, DiffSummary, RangeInfo

# Ranges loaded ahead in the background by each diff walk.
MERGE_READAHEAD = 8


@dataclass(slots=True)
class Gap:
    """Keys strictly between two anchors (None = unbounded), where base and source differ."""

    lo: str | None
    hi: str | None
    base_run: list[RangeInfo]
    source_run: list[RangeInfo]


def range_ids(ranges: list[RangeInfo]) -> list[str]:
    return [r.id for r in ranges]


def inside(ranges: list[RangeInfo], gap: Gap) -> bool:
    """Whether the ranges lie within the gap's open key interval."""
    if not ranges:
        return True
    return (gap.lo is None or ranges[0].min_key > gap.lo) and (
        gap.hi is None or ranges[-1].max_key < gap.hi
    )


def find_gaps(left: MetaRange, right: MetaRange) -> Iterator[Gap]:
    """The key intervals where two metaranges may differ: between consecutive ranges they
    share by id (which hold the same entries), with each side's ranges there."""
    left_ranges, right_ranges = left.ranges, right.ranges
    # Leading and trailing runs of the same ranges are anchors without gaps: only the
    # middle is walked (a localized change leaves almost every range of both in place).
    # Compared by index page ids, then as RangeInfo objects (equal ids, equal rows:
    # content-addressed), mostly the same objects: no list of every id is built.
    head, tail = shared_ends(left, right)
    right_stop = len(right_ranges) - tail + (1 if tail else 0)
    right_index = {right_ranges[j].id: j for j in range(head, right_stop)}
    prev_left = prev_right = head - 1
    end = len(left_ranges) - tail + (1 if tail else 0)  # through the first trailing anchor
    for i in range(head, min(end, len(left_ranges)) if tail else len(left_ranges) + 1):
        if i < len(left_ranges):
            j = right_index.get(left_ranges[i].id)
            if j is None or j <= prev_right:
                continue
        else:
            j = len(right_ranges)
        if i > prev_left + 1 or j > prev_right + 1:
            yield Gap(
                left_ranges[prev_left].max_key if prev_left >= 0 else None,
                left_ranges[i].min_key if i < len(left_ranges) else None,
                left_ranges[prev_left + 1 : i],
                right_ranges[prev_right + 1 : j],
            )
        prev_left, prev_right = i, j


def count_gap(loader: RangeLoader, namespace: str, gap: Gap, summary: DiffSummary) -> None:
    """Add the changes from the gap's left run to its right run (by path and identity:
    no entry is built, only those two columns are read)."""
    runs = gap.base_run, gap.source_run
    if len(runs[0]) == len(runs[1]) == 1 and runs[0][0].count == runs[1][0].count:
        left, right = (loader.keys_range(namespace, run[0]) for run in runs)
        changed = changed_rows(left, right)
        if changed is not None:  # the same paths: a range changed in place (the usual case)
            summary.changed += changed
            return
    for change in walk(
        lambda info: loader.keys_range(namespace, info),
        lambda info: loader.prefetch(namespace, info, keys_only=True),
        MetaRange("", gap.base_run),
        MetaRange("", gap.source_run),
        entries=False,
    ):
        summary.count(change.type)


def walk(
    load: LoadRange,
    prefetch: Callable[[RangeInfo], None],
    left: MetaRange,
    right: MetaRange,
    entries: bool = True,
) -> Iterator[Change]:
    return diff_metaranges(
        load, left, right, DiffOptions(readahead=MERGE_READAHEAD, entries=entries), prefetch
    )


def paired(
    left: Iterator[Change], right: Iterator[Change]
) -> Iterator[tuple[str, Change | None, Change | None]]:
    """Two change streams sorted by path, joined: (path, left change, right change)."""
    a = next(left, None)
    b = next(right, None)
    while a is not None or b is not None:
        if a is not None and (b is None or a.path < b.path):
            yield a.path, a, None
            a = next(left, None)
        elif b is not None and (a is None or b.path < a.path):
            yield b.path, None, b
            b = next(right, None)
        else:
            assert a is not None and b is not None  # neither is ahead: the same path
            yield a.path, a, b
            a = next(left, None)
            b = next(right, None)
