"""Three-way merge of metaranges (docs/architecture.md §4 Merge, §5).

    result = manager.merge_metaranges(namespace, base_id, source_id, destination_id,
                                      strategy=MergeStrategy.DEFAULT)
    # or, without the facade:
    result = merge_metaranges(writer, namespace, MergeRequest(base_id, source_id, dest_id))

Semantics, per path (entries compared by identity; an absent entry counts as "deleted"):

    source == base                  -> the destination's value
    destination == base             -> the source's value
    source == destination           -> that value (both changed identically: no conflict)
    otherwise (changed differently) -> a conflict: DEFAULT reports it and writes nothing,
                                       SOURCE_WINS takes the source's, DEST_WINS the
                                       destination's value.

The summary counts what the merge changes in the DESTINATION (added / removed / changed);
a path whose merged value equals the destination's is not a change. Conflicts are listed
in path order, at most `max_conflicts`; `more_conflicts` counts the rest. A DEFAULT merge
with conflicts, and every dry run, write nothing and return metarange_id "" (with the
summary of what the merge applies, or would apply without the conflicts).

Retries (docs/architecture.md §4, merge retry reuse): a merge that lost the race for the
destination HEAD is retried as merge(base' = the old destination, source' = its own result,
destination' = the new HEAD). That gives the seed's table, with one difference from a merge
from scratch onto the new HEAD: a path that source and old destination changed identically
(or that a strategy resolved) and that the new HEAD changed again keeps the new HEAD's value,
where a fresh merge would report a conflict (DEFAULT) or take the source's (SOURCE_WINS).

Algorithm: at range granularity first, entries only where both sides changed.

  Shortcuts (no range read, nothing written): source == base or source == destination ->
  the destination; destination == base (fast-forward) -> the source (its summary is
  counted from the ranges that differ, path and identity columns only).

  1. Gaps. Ranges with the same id in base and source ("anchors") hold the same entries,
     so base and source differ only in the key intervals between consecutive anchors. Each
     such gap holds a run of base ranges and a run of source ranges. Found from the three
     metaranges alone.
  2. A gap the destination did not touch (its ranges over the gap are exactly the base's
     run) is "source-only": the result there is the source's run, spliced in by id
     without reading or writing it. Its summary is counted from a diff of the two runs
     reading path and identity columns only.
  3. Otherwise ("mixed"), the gap is merged entry by entry: diff(base run -> source run)
     and diff(base -> destination) within the gap, walked together by path, give the
     conflicts and the source changes the destination lacks. (A gap whose source and
     destination runs are the same ranges is skipped unread.) The destination's changes
     outside every gap are never read at all. A piece that is one range on every side
     over the same paths (both sides re-pointed existing entries: the common case) is
     merged column-wise instead (committed/aligned.py: the same result, decided on the
     identity columns; its range is built and written after the walk).
  4. The destination's ranges, with the source-only runs spliced in, and the mixed-gap
     changes go through apply (apply_changes' walk): every range no change falls into is
     reused by id when it sits on a chunk boundary; the others are re-derived with
     content-defined chunking. Chunking being a pure function of the entry set, the result
     is the same metarange whatever the path to it.

Retry (docs/architecture.md §4, merge retry reuse): merging again with base' = the old
destination, source' = the previous result and destination' = the new destination gives the
same content as merging the original inputs onto the new destination. Ranges only the first
merge touched are source-only gaps on the retry: reused, neither read nor written again;
ranges both changed are re-derived, and what the first attempt already wrote exists (put if
absent is a no-op). The retry's summary needs no read of those reused ranges either: a merge
that writes a result remembers its summary, which is exactly the diff destination -> result,
i.e. the retry's diff base' -> source' (RangeLoader.diff_counts, by metarange ids); the
source-only gaps' share is that diff less what the other gaps hold (_add_source_only_share).

Identity covers every field a user writes and reads back — the physical address included,
not mtime (docs/architecture.md §2) — so an entry re-pointed at another address is a change like
any other: taken when only one side made it, a conflict (or resolved by the strategy) when
the other side changed the path differently. The only difference identity ignores is mtime:
in a source-only gap the source's entries are taken as they are, so an entry the source
re-staged with the same identity arrives with the source's mtime; in a mixed gap the
destination's entry (and mtime) is kept.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass

from quarry import errors
from quarry.committed.aligned import AlignedPlan
from quarry.committed.apply import ApplyOptions, apply_to_ranges
from quarry.committed.gaps import (
    MERGE_READAHEAD,
    Gap,
    count_gap,
    find_gaps,
    inside,
    range_ids,
)
from quarry.committed.loader import RangeLoader, get_entry
from quarry.committed.pieces import MixedMerge, write_aligned
from quarry.committed.rangedata import MetaRange
from quarry.committed.writer import RangeWriter
from quarry.graveler.model import (
    Conflict,
    DiffSummary,
    MergeResult,
    MergeStrategy,
    RangeInfo,
)
from quarry.runtime import deadlines

log = logging.getLogger(__name__)

DEFAULT_MAX_CONFLICTS = 100


@dataclass(frozen=True)
class MergeRequest:
    """The three metaranges of a merge ("" = the empty metarange) and how to merge them."""

    base_id: str
    source_id: str
    destination_id: str
    strategy: MergeStrategy = MergeStrategy.DEFAULT
    max_conflicts: int = DEFAULT_MAX_CONFLICTS
    dry_run: bool = False


def merge_metaranges(writer: RangeWriter, namespace: str, request: MergeRequest) -> MergeResult:
    """Three-way merge of request.source_id into request.destination_id (see the module
    docstring)."""
    try:
        strategy = MergeStrategy(int(request.strategy))
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"unknown merge strategy {request.strategy!r}") from None
    if request.max_conflicts is None or int(request.max_conflicts) < 0:
        raise errors.InvalidArgument("max_conflicts must be >= 0")
    max_conflicts = int(request.max_conflicts)
    dry_run = request.dry_run
    loader = writer.loader
    loader.store(namespace)  # validates the namespace even if every input is empty
    base = loader.metarange(namespace, request.base_id)
    source = loader.metarange(namespace, request.source_id)
    destination = loader.metarange(namespace, request.destination_id)

    # ---- shortcuts ------------------------------------------------------------------------
    if source.id == base.id or source.id == destination.id:
        return _done(destination.id, DiffSummary(), dry_run, reused=len(destination.ranges))
    if destination.id == base.id:
        known = loader.diff_counts(namespace, destination.id, source.id)
        if known is not None:
            summary = DiffSummary(*known)
        else:
            summary = DiffSummary()
            for gap in find_gaps(destination, source):
                count_gap(loader, namespace, gap, summary)
            _remember(loader, namespace, destination.id, source.id, summary)
        return _done(source.id, summary, dry_run, reused=len(source.ranges))

    # ---- gaps: source-only ones spliced, mixed ones merged column-wise or by entry ----------
    dest_ranges, dest_keys = destination.ranges, destination.max_keys
    plan: list[_Step] = []  # (kind, gap, destination ranges over it)
    settled: list[Gap] = []  # gaps (and pieces) where the destination has the source's ranges
    for gap in find_gaps(base, source):
        first = bisect.bisect_right(destination.max_keys, gap.lo) if gap.lo is not None else 0
        stop = _first_at_or_after(destination, gap.hi, first)
        over_gap = dest_ranges[first:stop]  # every destination range with keys in the gap
        if range_ids(over_gap) == range_ids(gap.base_run) and inside(over_gap, gap):
            plan.append((_SOURCE_ONLY, gap, first, stop))  # the destination has the base's
        elif range_ids(over_gap) == range_ids(gap.source_run) and inside(over_gap, gap):
            settled.append(gap)  # the destination already holds the source's ranges
        else:
            plan.extend(_split_mixed(gap, over_gap, first, settled))
    # A retry (base' = an earlier attempt's destination, source' = its result) knows the
    # diff base' -> source' from that attempt: then the source-only gaps are counted as
    # what remains of it once the other gaps' share is taken out, instead of being read.
    known = loader.diff_counts(namespace, base.id, source.id)
    summary = DiffSummary()
    merged = MixedMerge(strategy, max_conflicts, summary)
    spliced = _Spliced(destination, source)
    aligned: list[tuple[int, AlignedPlan]] = []  # (position in spliced.ranges, plan)
    taken = 0  # destination ranges [0, taken) are settled in `spliced`
    ahead = _ReadAhead(loader, namespace, plan, dest_ranges, source_only_read=known is None)
    for number, (kind, gap, first, stop) in enumerate(plan):
        # A loop point: stop once the caller's deadline passed or it cancelled.
        deadlines.check()
        ahead.through(number)
        if kind == _SOURCE_ONLY:
            if known is None:
                count_gap(loader, namespace, gap, summary)
            spliced.extend(dest_ranges[taken:first], dest_keys[taken:first])
            spliced.extend(gap.source_run)
            taken = stop
        elif column_wise := merged.aligned(writer, namespace, gap, dest_ranges[first:stop]):
            spliced.extend(dest_ranges[taken:first], dest_keys[taken:first])
            # The destination's range holds the place of the merged one until it is written.
            spliced.extend([column_wise.destination.info])
            if column_wise.rows:
                aligned.append((len(spliced.ranges) - 1, column_wise))
            taken = stop
        else:
            merged.gap(loader, namespace, gap, dest_ranges[first:stop])
    spliced.extend(dest_ranges[taken:], dest_keys[taken:])
    if known is not None:
        _add_source_only_share(loader, namespace, (known, plan, settled), merged)
    conflicts = tuple(
        Conflict(
            path,
            get_entry(loader, namespace, base.id, path) if in_base else None,
            src_entry,
            dst_entry,
        )
        for path, src_entry, dst_entry, in_base in merged.conflicts
    )
    if dry_run or conflicts or merged.more_conflicts:
        return MergeResult("", summary, conflicts, merged.more_conflicts)

    # ---- write: apply the mixed-gap changes to the spliced ranges ---------------------------
    # The ranges merged column-wise, built and written only now that the merge has a
    # result, on the write lanes (writing them during the walk was slower: the threads
    # contended for the GIL with it). Until now the destination's range held their place.
    written = write_aligned(writer, namespace, [plan for _position, plan in aligned])
    for (position, _plan), info in zip(aligned, written, strict=True):
        spliced.ranges[position] = info
    if not merged.changes and spliced.ranges == dest_ranges:
        return MergeResult(destination.id, summary, ranges_reused=len(dest_ranges))
    applied = apply_to_ranges(
        writer,
        namespace,
        MetaRange("", spliced.ranges, spliced.max_keys),
        merged.changes,
        ApplyOptions(open_ends=spliced.open_ends, loaded=merged.held),
    )
    layout = writer.plan_metarange(applied.ranges, destination)
    metarange_id = layout.id
    if metarange_id != destination.id:
        writer.write_metarange_file(
            namespace, applied.ranges, plan=layout, max_keys=applied.max_keys
        )
    # The summary is exactly the diff destination -> result (module docstring): a retry of
    # this merge starts from it.
    _remember(loader, namespace, destination.id, metarange_id, summary)
    return MergeResult(
        metarange_id,
        summary,
        ranges_written=applied.written + len(written),
        ranges_reused=applied.reused,
    )


def _first_at_or_after(metarange: MetaRange, key: str | None, start: int) -> int:
    """The index of the first range from `start` whose keys all lie at or after `key`
    (len(ranges) for None): ranges are disjoint and sorted, so it is the range that may
    hold `key` or the one after it, found on the max keys the metarange has at hand."""
    ranges = metarange.ranges
    if key is None:
        return len(ranges)
    i = bisect.bisect_left(metarange.max_keys, key, start)
    return i if i == len(ranges) or ranges[i].min_key >= key else i + 1


class _Spliced:
    """The destination's ranges with source-only runs spliced in, and the positions of the
    ranges that were the last of their metarange (the only ones that may not end at a chunk
    boundary: ApplyOptions.open_ends)."""

    def __init__(self, destination: MetaRange, source: MetaRange) -> None:
        self.ranges: list[RangeInfo] = []
        self.max_keys: list[str] = []
        self.open_ends: list[int] = []
        self._lasts = [m.ranges[-1] for m in (destination, source) if m.ranges]

    def extend(self, run: list[RangeInfo], max_keys: list[str] | None = None) -> None:
        """`max_keys`: those of `run` when the caller has them (a slice of a metarange's)."""
        self.ranges.extend(run)
        self.max_keys.extend([r.max_key for r in run] if max_keys is None else max_keys)
        # A run is a slice of one metarange: only its final range can be that one's last.
        if run and run[-1] in self._lasts:
            self.open_ends.append(len(self.ranges) - 1)


_SOURCE_ONLY = "source-only"
_MIXED = "mixed"
# A step of a merge's plan: (kind, gap, first, stop) with destination ranges [first, stop)
# over the gap.
_Step = tuple[str, Gap, int, int]


def _remember(
    loader: RangeLoader, namespace: str, left_id: str, right_id: str, summary: DiffSummary
) -> None:
    loader.remember_diff_counts(
        namespace, left_id, right_id, (summary.added, summary.removed, summary.changed)
    )


def _add_source_only_share(
    loader: RangeLoader,
    namespace: str,
    work: tuple[tuple[int, int, int], list[_Step], list[Gap]],
    merged: MixedMerge,
) -> None:
    """Add the source-only gaps' changes to merged.summary without reading them: the gaps
    (and pieces) partition the keys where base and source differ, so the source-only share
    of the known diff base -> source is that diff less what the mixed gaps' walks saw
    (merged.source_diff) and less the gaps the destination already holds (counted here,
    by reading: rare). Counts that come out negative cannot be exact: those gaps are then
    counted by reading, as without the known diff."""
    known, plan, settled = work
    covered = DiffSummary(
        merged.source_diff.added, merged.source_diff.removed, merged.source_diff.changed
    )
    for gap in settled:
        count_gap(loader, namespace, gap, covered)
    share = (known[0] - covered.added, known[1] - covered.removed, known[2] - covered.changed)
    summary = merged.summary
    if min(share) < 0:
        log.warning(
            "merge: remembered diff counts %s below the walked %s: recounting", known, covered
        )
        for kind, gap, _first, _stop in plan:
            if kind == _SOURCE_ONLY:
                count_gap(loader, namespace, gap, summary)
        return
    summary.added += share[0]
    summary.removed += share[1]
    summary.changed += share[2]


class _ReadAhead:
    """Starts loading, in the background, the ranges of the next gaps of the plan: the
    per-gap walks are too short for their own read-ahead to help. `source_only_read` False:
    source-only gaps are not read (their summary share is known), so not loaded either."""

    def __init__(
        self,
        loader: RangeLoader,
        namespace: str,
        plan: list[_Step],
        dest_ranges: list[RangeInfo],
        source_only_read: bool = True,
    ) -> None:
        self._loader = loader
        self._namespace = namespace
        self._plan = plan
        self._source_only_read = source_only_read
        self._dest_ranges = dest_ranges
        self._next = 0  # the next gap whose ranges are not requested yet
        self._enabled = loader.reads_ahead(namespace)

    def through(self, current: int) -> None:
        """Called before working on gap `current`: keeps MERGE_READAHEAD ranges requested
        past it."""
        if not self._enabled:
            return
        budget = MERGE_READAHEAD
        for kind, gap, first, stop in self._plan[current + 1 : self._next]:
            if kind == _SOURCE_ONLY and not self._source_only_read:
                continue
            budget -= (
                len(gap.base_run) + len(gap.source_run) + (stop - first if kind == _MIXED else 0)
            )
        prefetch = self._loader.prefetch
        namespace = self._namespace
        while budget > 0 and self._next < len(self._plan):
            kind, gap, first, stop = self._plan[self._next]
            self._next += 1
            if self._next <= current + 1:
                continue  # the current gap loads its own first ranges
            if kind == _SOURCE_ONLY and not self._source_only_read:
                continue
            over_gap = self._dest_ranges[first:stop] if kind == _MIXED else []
            # As the walks will load them (see MixedMerge.gap): base ranges keys only,
            # unless the destination has them too.
            dest_ids = {r.id for r in over_gap}
            for info in gap.base_run:
                prefetch(namespace, info, keys_only=info.id not in dest_ids)
            for info in gap.source_run:
                prefetch(namespace, info, keys_only=kind == _SOURCE_ONLY)
            for info in over_gap:
                prefetch(namespace, info)
            budget -= (
                len(gap.base_run) + len(gap.source_run) + (stop - first if kind == _MIXED else 0)
            )


def _done(metarange_id: str, summary: DiffSummary, dry_run: bool, reused: int) -> MergeResult:
    if dry_run:
        return MergeResult("", summary)
    return MergeResult(metarange_id, summary, ranges_reused=reused)


def _split_mixed(
    gap: Gap, over_gap: list[RangeInfo], first: int, settled: list[Gap]
) -> list[_Step]:
    """A gap the destination touched, cut where base, source and destination all end a
    range at the same key: each piece covers the same keys on all three sides, and a piece
    the destination left as the base's is source-only (spliced, never read or written).
    Pieces where the destination holds the source's ranges go to `settled`."""
    base_run, source_run = gap.base_run, gap.source_run
    cuts: list[tuple[int, int, int]] = []  # exclusive ends (base, source, destination)
    i = j = k = 0
    while i < len(base_run) and j < len(source_run) and k < len(over_gap):
        kb, ks, kd = base_run[i].max_key, source_run[j].max_key, over_gap[k].max_key
        if kb == ks == kd:
            i, j, k = i + 1, j + 1, k + 1
            cuts.append((i, j, k))
            continue
        top = max(kb, ks, kd)
        i += kb < top
        j += ks < top
        k += kd < top
    if not cuts:
        return [(_MIXED, gap, first, first + len(over_gap))]
    if cuts[-1] != (len(base_run), len(source_run), len(over_gap)):
        cuts.append((len(base_run), len(source_run), len(over_gap)))
    steps: list[_Step] = []
    pb = ps = pd = 0
    for number, (eb, es, ed) in enumerate(cuts):
        piece_base, piece_source = base_run[pb:eb], source_run[ps:es]
        piece_dest = over_gap[pd:ed]
        # Keys outside the gap can only be in the destination's first and last pieces.
        piece = Gap(
            gap.lo if number == 0 else None,
            gap.hi if number == len(cuts) - 1 else None,
            piece_base,
            piece_source,
        )
        if range_ids(piece_source) == range_ids(piece_base):
            pass  # the source did not change these keys: the destination's value stays
        elif range_ids(piece_dest) == range_ids(piece_base):
            steps.append((_SOURCE_ONLY, piece, first + pd, first + ed))
        elif range_ids(piece_dest) != range_ids(piece_source):
            steps.append((_MIXED, piece, first + pd, first + ed))
        else:
            settled.append(piece)
        pb, ps, pd = eb, es, ed
    return steps
