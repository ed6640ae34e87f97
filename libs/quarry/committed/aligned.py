"""The three-way merge of one range both sides changed, column-wise (merge.py's fast path).

When base, source and destination each hold one range over a piece of a merge's plan and
the three hold exactly the same paths (the common case: both sides re-pointed or
re-described existing entries), the merged range is the destination's with the rows only
the source changed taken from the source. That is decided on the identity columns as
Arrow arrays, and the result is built from slices of the two tables: no per-row Python
object, no diff walk, no re-chunking.

plan_aligned decides (on the merge's thread, before anything is written); build_aligned
makes the range (on a write thread, once the merge is known to have a result). Together
they give exactly what merge.py's entry walk and apply give (tests/unit/committed/
test_committed_aligned.py compares the two on random edits), and declines (None) whatever
it does not decide the same way:
  - the paths differ on any side (an add or a delete moves rows and maybe boundaries);
  - a row both sides changed differently (a conflict: the walk reports it or applies the
    strategy);
  - the destination's range does not end at a chunk boundary, or the merged range's
    entry_bytes reach the byte cap (the chunker could end it elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from quarry.committed.format import entry_bytes, range_id_of
from quarry.committed.rangedata import RangeData
from quarry.graveler.model import RangeInfo


@dataclass(frozen=True)
class AlignedPlan:
    """What merging one piece column-wise takes: the destination's range with the source's
    `rows` swapped in (none: the destination's range as it is), its entry_bytes, and the
    rows the source changed from the base (its diff, whatever became of each change).
    Deciding is cheap; build_aligned makes the table and its id (on a write thread)."""

    source: RangeData
    destination: RangeData
    rows: list[int]
    size_bytes: int
    source_changed: int


def plan_aligned(
    base: RangeData,
    source: RangeData,
    destination: RangeData,
    target_entries: int,
    max_bytes: int,
) -> AlignedPlan | None:
    """How to merge one range piece column-wise, or None when the entry walk must decide
    (see the module docstring). `base` may be a keys-only load (path and identity); source
    and destination are full."""
    n = destination.n
    if base.n != n or source.n != n or n == 0:
        return None
    paths = destination.table.column("path")
    if not (paths.equals(base.table.column("path")) and paths.equals(source.table.column("path"))):
        return None
    if not destination.last_is_boundary(target_entries):
        return None
    base_ids = base.table.column("identity")
    source_ids = source.table.column("identity")
    dest_ids = destination.table.column("identity")
    source_changed = pc.not_equal(source_ids, base_ids)
    dest_changed = pc.not_equal(dest_ids, base_ids)
    # Changed on both sides, to different values: a conflict (or a strategy's call).
    both = pc.and_(source_changed, dest_changed)
    if pc.any(pc.and_(both, pc.not_equal(source_ids, dest_ids))).as_py():
        return None
    take = pc.and_(source_changed, pc.invert(dest_changed))
    rows = pc.indices_nonzero(take).to_pylist()
    changed = int(pc.sum(source_changed).as_py() or 0)
    # The destination's size with the taken rows' entry_bytes swapped (a few rows: built as
    # entries; a range's cumulative sizes would combine every column of a chunked table).
    size = destination.info.size_bytes
    for row in rows:
        size += entry_bytes(source.entry_at(row)) - entry_bytes(destination.entry_at(row))
    if size >= max_bytes:
        return None
    return AlignedPlan(source, destination, rows, size, changed)


def build_aligned(plan: AlignedPlan) -> RangeData:
    """The merged range of a plan: slices of the destination's table around the source's
    rows (no copy), and its id."""
    if not plan.rows:
        return plan.destination
    destination, source = plan.destination.table, plan.source.table
    pieces: list[pa.Table] = []
    start = 0
    for row in plan.rows:
        if row > start:
            pieces.append(destination.slice(start, row - start))
        pieces.append(source.slice(row, 1))
        start = row + 1
    if start < len(destination):
        pieces.append(destination.slice(start, len(destination) - start))
    table = pa.concat_tables(pieces)
    info = plan.destination.info
    merged = RangeInfo(range_id_of(table), info.min_key, info.max_key, info.count, plan.size_bytes)
    return RangeData(merged, table)


__all__ = ["AlignedPlan", "build_aligned", "plan_aligned"]
