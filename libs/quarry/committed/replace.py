"""Replacing everything under some path prefixes of a metarange by another metarange's
entries, at range granularity (the commit of an import, docs/architecture.md §10).

    result = (base entries under none of the prefixes) ∪ (the import's entries)

The import's entries must all lie under the prefixes. Base ranges outside every prefix are
reused by id, base ranges wholly inside one are dropped without being read; only a base
range that straddles a prefix's edge is read (to keep its rows outside the prefix). The
import's ranges are reused by id as well where they start on a range boundary of the result,
so a retry of an import onto a new branch head costs a few range reads, not a relisting.

Safety: a base entry outside every prefix is never dropped or changed (a test checks every
entry outside the prefix, with ranges straddling its edges), and an import entry outside
the prefixes is refused (INVALID_ARGUMENT), never written.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from quarry import errors
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.committed.writer import RangeWriter
from quarry.graveler.model import ApplyResult, DiffSummary, RangeInfo

# [lo, hi): the keys starting with a prefix; hi None = no upper bound (the empty prefix).
Interval = tuple[str, str | None]


@dataclass(frozen=True)
class _Whole:
    key: str
    info: RangeInfo


@dataclass(frozen=True)
class _Slice:
    key: str
    data: RangeData
    start: int
    stop: int


def prefix_interval(prefix: str) -> Interval:
    """The keys that start with `prefix`, as a half-open interval of strings."""
    if not prefix:
        return ("", None)
    last = prefix[-1]
    if ord(last) >= 0x10FFFF:
        raise errors.InvalidArgument(f"prefix {prefix!r} ends in the last code point")
    return (prefix, prefix[:-1] + chr(ord(last) + 1))


def check_prefixes(prefixes: Sequence[str]) -> list[Interval]:
    """Sorted, disjoint intervals of `prefixes`; nested or repeated prefixes are refused (the
    import would own a path twice)."""
    ordered = sorted(prefixes)
    for before, after in zip(ordered, ordered[1:], strict=False):
        if after.startswith(before):
            raise errors.InvalidArgument(
                f"destination paths {before!r} and {after!r} overlap: one contains the other"
            )
    return [prefix_interval(p) for p in ordered]


def _below(key: str, hi: str | None) -> bool:
    return hi is None or key < hi


def _inside(info: RangeInfo, interval: Interval) -> bool:
    lo, hi = interval
    return info.min_key >= lo and _below(info.max_key, hi)


def _meets(info: RangeInfo, interval: Interval) -> bool:
    lo, hi = interval
    return info.max_key >= lo and _below(info.min_key, hi)


def _runs(paths: list[str], intervals: list[Interval]) -> list[tuple[int, int, bool]]:
    """Rows of a range cut into runs [start, stop) inside (True) or outside the intervals."""
    runs: list[tuple[int, int, bool]] = []
    pos = 0
    n = len(paths)
    for lo, hi in intervals:
        start = bisect.bisect_left(paths, lo, pos)
        stop = n if hi is None else bisect.bisect_left(paths, hi, start)
        if start > pos:
            runs.append((pos, start, False))
        if stop > start:
            runs.append((start, stop, True))
        pos = stop
        if pos >= n:
            break
    if pos < n:
        runs.append((pos, n, False))
    return runs


def replace_prefixes(
    writer: RangeWriter,
    namespace: str,
    base_metarange_id: str,
    prefixes: Sequence[str],
    import_metarange_id: str,
) -> ApplyResult:
    """Write the metarange of `base` with everything under `prefixes` replaced by the
    entries of `import_metarange_id` (see the module docstring). summary.added counts the
    imported entries, summary.removed the base entries replaced (an entry in both counts
    in both: this is not a diff)."""
    loader = writer.loader
    intervals = check_prefixes(prefixes)
    base = loader.metarange(namespace, base_metarange_id)
    imported = loader.metarange(namespace, import_metarange_id)
    pieces: list[_Whole | _Slice] = []
    summary = DiffSummary()
    for info in base.ranges:
        met = [iv for iv in intervals if _meets(info, iv)]
        if not met:
            pieces.append(_Whole(info.min_key, info))
            continue
        if len(met) == 1 and _inside(info, met[0]):
            summary.removed += info.count
            continue
        data = loader.range(namespace, info)
        paths = data.paths
        for start, stop, inside in _runs(paths, met):
            if inside:
                summary.removed += stop - start
            else:
                pieces.append(_Slice(paths[start], data, start, stop))
    for info in imported.ranges:
        summary.added += info.count
        if any(_inside(info, iv) for iv in intervals):
            pieces.append(_Whole(info.min_key, info))
            continue
        data = loader.range(namespace, info)
        paths = data.paths
        for start, stop, inside in _runs(paths, intervals):
            if not inside:
                raise errors.InvalidArgument(
                    f"imported entry {paths[start]!r} is under none of the destination paths"
                )
            pieces.append(_Slice(paths[start], data, start, stop))
    pieces.sort(key=lambda piece: piece.key)
    return _write(writer, namespace, base, pieces, summary)


def _write(
    writer: RangeWriter,
    namespace: str,
    base: MetaRange,
    pieces: list[_Whole | _Slice],
    summary: DiffSummary,
) -> ApplyResult:
    loader = writer.loader
    ends_at_boundary = writer.chunking.ends_at_boundary
    sink = writer.sink(namespace, cache_written=True)
    builder = writer.builder(sink)
    last = len(pieces) - 1
    with sink:
        for index, piece in enumerate(pieces):
            if isinstance(piece, _Slice):
                builder.add_slice(piece.data, piece.start, piece.stop)
                continue
            info = piece.info
            # A range is reused as it is only where a range of the result starts (the
            # builder is empty) and ends where the chunker would end it, or ends the result.
            if builder.empty and (index == last or ends_at_boundary(info)):
                builder.reuse(info)
                continue
            data = loader.range(namespace, info)
            builder.add_slice(data, 0, data.n)
        ranges = builder.finish()
    metarange_id = writer.write_metarange_file(namespace, ranges, base, max_keys=builder.max_keys)
    return ApplyResult(
        metarange_id, summary, ranges_written=builder.written, ranges_reused=builder.reused
    )


__all__ = ["check_prefixes", "prefix_interval", "replace_prefixes"]
