"""The entry-level three-way merge of a merge's mixed pieces (merge.py), the pieces both
sides changed: column-wise when each side holds one range of the same paths
(aligned.plan_aligned, then write_aligned once the merge has a result), else walked entry
by entry (the diffs base -> source and base -> destination, paired by path). Collects the
changes to apply to the destination, the conflicts (bounded) and the summary."""

from __future__ import annotations

from quarry.committed.aligned import AlignedPlan, build_aligned, plan_aligned
from quarry.committed.gaps import Gap, paired, walk
from quarry.committed.loader import RangeLoader
from quarry.committed.rangedata import MetaRange, RangeData
from quarry.committed.writer import RangeWriter
from quarry.graveler.model import ChangeType, DiffSummary, Entry, MergeStrategy, RangeInfo

# Ranges a merge keeps in hand between its walk and its write (beyond what the shared range
# cache keeps): destination ranges the walks loaded and the ranges of aligned plans.
HOLD_BYTES = 256 * 1024 * 1024


class MixedMerge:
    """The entry-level three-way merge of mixed gaps: collects the changes to apply to the
    destination, the conflicts (bounded) and the summary."""

    def __init__(
        self,
        strategy: MergeStrategy,
        max_conflicts: int,
        summary: DiffSummary,
    ) -> None:
        self.strategy = strategy
        self.max_conflicts = max_conflicts
        self.summary = summary
        self.changes: list[tuple[str, Entry | None]] = []
        # (path, source entry, destination entry, whether the base had the path)
        self.conflicts: list[tuple[str, Entry | None, Entry | None, bool]] = []
        self.more_conflicts = 0
        # The diff base -> source over the gaps walked (whatever became of each change).
        self.source_diff = DiffSummary()
        # Destination ranges the walk loaded (for the apply), and the ranges aligned plans
        # hold (for their write): up to HOLD_BYTES, past it pieces are walked.
        self.held: dict[str, RangeData] = {}
        self.held_bytes = 0

    def aligned(
        self, writer: RangeWriter, namespace: str, gap: Gap, over_gap: list[RangeInfo]
    ) -> AlignedPlan | None:
        """The plan of a piece that is one range on every side, merged column-wise
        (plan_aligned; counted in the summary), or None: then `gap` walks it entry by entry."""
        if len(over_gap) != 1 or len(gap.base_run) != 1 or len(gap.source_run) != 1:
            return None
        if self.held_bytes >= HOLD_BYTES:
            return None
        loader, chunking = writer.loader, writer.chunking
        source = loader.range(namespace, gap.source_run[0])
        destination = loader.range(namespace, over_gap[0])
        plan = plan_aligned(
            loader.keys_range(namespace, gap.base_run[0]),
            source,
            destination,
            chunking.target_entries,
            chunking.max_bytes,
        )
        if plan is None:
            return None
        self.summary.changed += len(plan.rows)
        self.source_diff.changed += plan.source_changed
        if plan.rows:
            self.held_bytes += source.cache_bytes + destination.cache_bytes
        return plan

    def gap(self, loader: RangeLoader, namespace: str, gap: Gap, over_gap: list[RangeInfo]) -> None:
        # Base ranges are only compared (a conflict's base entry is read separately). (A
        # range on both sides is skipped unread by the walk; full loads for those anyway.)
        base_ids = {r.id for r in gap.base_run}
        dest_ids = {r.id for r in over_gap}
        base_ids -= dest_ids

        def load(info: RangeInfo) -> RangeData:
            if info.id in base_ids:
                return loader.keys_range(namespace, info)
            data = loader.range(namespace, info)
            if info.id in dest_ids and info.id not in self.held and self.held_bytes < HOLD_BYTES:
                # The apply below re-reads these unless held: the cache may have let them go.
                self.held[info.id] = data
                self.held_bytes += data.cache_bytes
            return data

        def prefetch(info: RangeInfo) -> None:
            loader.prefetch(namespace, info, keys_only=info.id in base_ids)

        base_run = MetaRange("", gap.base_run)
        source_changes = walk(load, prefetch, base_run, MetaRange("", gap.source_run))
        dest_changes = walk(load, prefetch, base_run, MetaRange("", over_gap))
        lo, hi = gap.lo, gap.hi
        # Destination ranges may stick out of the gap: what lies outside is not ours.
        dest_changes = (
            c for c in dest_changes if (lo is None or c.path > lo) and (hi is None or c.path < hi)
        )
        summary = self.summary
        changes = self.changes
        strategy = self.strategy
        source_diff = self.source_diff
        for path, src, dst in paired(source_changes, dest_changes):
            if src is not None:
                source_diff.count(src.type)
            if dst is None:
                # Changed on the source only: the destination still has the base's value.
                assert src is not None  # _paired yields at least one side
                summary.count(src.type)
                changes.append((path, src.entry if src.type != ChangeType.REMOVED else None))
                continue
            if src is None:
                continue  # changed on the destination only: keep it
            src_entry = src.entry if src.type != ChangeType.REMOVED else None
            dst_entry = dst.entry if dst.type != ChangeType.REMOVED else None
            if src_entry is None and dst_entry is None:
                continue  # deleted on both sides
            if (
                src_entry is not None
                and dst_entry is not None
                and src_entry.identity == dst_entry.identity
            ):
                continue  # changed identically on both sides
            if strategy == MergeStrategy.SOURCE_WINS:
                summary.count(
                    ChangeType.REMOVED
                    if src_entry is None
                    else ChangeType.ADDED
                    if dst_entry is None
                    else ChangeType.CHANGED
                )
                changes.append((path, src_entry))
            elif strategy == MergeStrategy.DEFAULT:
                if len(self.conflicts) < self.max_conflicts:
                    # The base had the path unless a side reports it ADDED.
                    in_base = src.type != ChangeType.ADDED and dst.type != ChangeType.ADDED
                    self.conflicts.append((path, src_entry, dst_entry, in_base))
                else:
                    self.more_conflicts += 1
            # DEST_WINS: keep the destination's value.


def write_aligned(writer: RangeWriter, namespace: str, plans: list[AlignedPlan]) -> list[RangeInfo]:
    """Build and write the ranges of aligned plans (each with rows to take), in order: on
    the write lanes of the store, the calling thread taking one of them (it would only
    wait). Every lane finishes before the first failure is raised."""
    sink = writer.sink(namespace, cache_written=True)
    lanes = min(writer.write_lanes(sink.store), len(plans))
    pool = writer.pool()

    def lane(k: int) -> list[RangeInfo]:
        written = []
        for plan in plans[k::lanes]:
            data = build_aligned(plan)
            sink.write_now(data.info, data.table)
            written.append(data.info)
        return written

    if pool is None or lanes <= 1:
        return lane(0) if plans else []
    futures = [pool.submit(lane, k) for k in range(1, lanes)]
    results: list[list[RangeInfo]] = []
    failure: BaseException | None = None
    try:
        results.append(lane(0))
    except BaseException as error:
        failure = error
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as error:
            failure = failure or error
    if failure is not None:
        raise failure
    ordered: list[RangeInfo] = [None] * len(plans)  # type: ignore[list-item]
    for k, written in enumerate(results):
        ordered[k::lanes] = written
    return ordered


__all__ = ["HOLD_BYTES", "MixedMerge", "write_aligned"]
