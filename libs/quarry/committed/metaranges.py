"""The encoding of a metarange a writer produces: its file's rows (an Arrow table) and the
framed fields its id hashes (format.metarange_id_of), derived from a neighbour's.

A commit or merge writes a metarange that differs from one it starts from (its base, its
destination) in a few ranges, but a flat metarange names every range of the repository (10k
at 10M entries). derive_metarange_encoding copies the unchanged prefix and suffix of that
one's encoding (kept in the metarange cache by RangeLoader) instead of rebuilding every row
from its RangeInfo. The result is the same table, frames and id as metarange_encoding of the
same ranges: ids and files do not depend on the path to them.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quarry.committed.format import (
    FORMAT_TAG,
    METARANGE_FORMAT,
    METARANGE_ID_HEADER,
    METARANGE_SCHEMA,
    file_bytes,
    range_frame,
)
from quarry.graveler.model import RangeInfo

# Ranges between two kept states of the id's hash (MetaRangeEncoding.checkpoints).
CHECKPOINT_RANGES = 1024


def common_prefix_length(left: list[Any], right: list[Any]) -> int:
    """The length of the longest common prefix of two lists, by slice comparisons (C
    speed: merge and the metarange writer compare the ranges of two metaranges)."""
    limit = min(len(left), len(right))
    lo, step = 0, 64
    while lo < limit:
        hi = min(lo + step, limit)
        if left[lo:hi] != right[lo:hi]:
            while hi - lo > 1:  # left[:lo] == right[:lo]; the first difference is in [lo, hi)
                mid = (lo + hi) // 2
                if left[lo:mid] == right[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo
        lo, step = hi, step * 2
    return limit


@dataclass(frozen=True, slots=True)
class MetaRangeEncoding:
    """A metarange's rows the two ways its writer needs them: the Arrow table its file
    holds (METARANGE_SCHEMA, one chunk per column) and the framed fields its id hashes
    (`frames`, range i's frame ending at ends[i]), with that id."""

    id: str
    table: pa.Table
    frames: bytes
    ends: pa.Array  # int64
    # The id's hash state after the header and the frames of ranges [0, j * CHECKPOINT_RANGES)
    # for j = 0, 1, ...: a derived metarange hashes on from the last one its prefix covers.
    # (Never updated: copied first.)
    checkpoints: tuple[Any, ...] = ()

    @property
    def nbytes(self) -> int:
        return (
            256 * (1 + len(self.checkpoints))
            + self.table.nbytes
            + len(self.frames)
            + (self.ends.nbytes)
        )

    def frame_start(self, i: int) -> int:
        return 0 if i == 0 else int(self.ends[i - 1].as_py())


def metarange_table(ranges: Sequence[RangeInfo]) -> pa.Table:
    return pa.Table.from_arrays(
        [
            pa.array([r.id for r in ranges], pa.string()),
            pa.array([r.min_key for r in ranges], pa.string()),
            pa.array([r.max_key for r in ranges], pa.string()),
            pa.array([r.count for r in ranges], pa.int64()),
            pa.array([r.size_bytes for r in ranges], pa.int64()),
        ],
        schema=METARANGE_SCHEMA,
    )


def encode_metarange(ranges: Sequence[RangeInfo], metarange_id: str) -> memoryview:
    return encode_metarange_table(metarange_table(ranges), metarange_id)


def encode_metarange_table(table: pa.Table, metarange_id: str, compress: bool = True) -> memoryview:
    """The file of a metarange whose rows are `table` (METARANGE_SCHEMA). `compress`: zstd,
    else uncompressed (see RangeWriter.write_metarange_file); readers take either, and the
    id does not depend on it. No column statistics: readers read the whole file."""
    table = table.replace_schema_metadata(
        {FORMAT_TAG: METARANGE_FORMAT, b"quarry.metarange_id": metarange_id.encode()}
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


def _hash_on(frames: bytes, ends: pa.Array, start: int, state: Any) -> tuple[str, list[Any]]:
    """The id of a metarange whose frames are `frames`, hashing on from `state` (the hash
    after the frames of ranges [0, start), start a multiple of CHECKPOINT_RANGES), and the
    checkpoints after `start`'s."""
    h = state.copy()
    view = memoryview(frames)
    position = 0 if start == 0 else int(ends[start - 1].as_py())
    checkpoints = []
    for stop in range(start + CHECKPOINT_RANGES, len(ends) + 1, CHECKPOINT_RANGES):
        end = int(ends[stop - 1].as_py())
        h.update(view[position:end])
        position = end
        checkpoints.append(h.copy())
    h.update(view[position:])
    return h.hexdigest(), checkpoints


def _frames(ranges: Sequence[RangeInfo]) -> tuple[bytes, pa.Array]:
    framed = [range_frame(r) for r in ranges]
    return b"".join(framed), pa.array(itertools.accumulate(map(len, framed)), pa.int64())


def metarange_encoding(ranges: Sequence[RangeInfo]) -> MetaRangeEncoding:
    """The encoding of `ranges` built row by row."""
    frames, ends = _frames(ranges)
    first = hashlib.sha256(METARANGE_ID_HEADER)
    metarange_id, checkpoints = _hash_on(frames, ends, 0, first)
    return MetaRangeEncoding(
        metarange_id, metarange_table(ranges), frames, ends, (first, *checkpoints)
    )


def derive_metarange_encoding(
    base_ranges: list[RangeInfo], base: MetaRangeEncoding, ranges: list[RangeInfo]
) -> MetaRangeEncoding:
    """The encoding of `ranges`, copying from `base` (the encoding of `base_ranges`) the
    rows of the prefix and suffix the two lists share; only the rows between are built."""
    head = common_prefix_length(ranges, base_ranges)
    tail = common_prefix_length(ranges[head:][::-1], base_ranges[head:][::-1])
    if head == tail == 0:
        return metarange_encoding(ranges)
    n_base = len(base_ranges)
    middle = ranges[head : len(ranges) - tail]
    middle_frames, middle_ends = _frames(middle)
    lo, hi = base.frame_start(head), base.frame_start(n_base - tail)
    view = memoryview(base.frames)
    frames = b"".join((view[:lo], middle_frames, view[hi:]))
    ends = pa.concat_arrays(
        [
            base.ends.slice(0, head),
            pc.add(middle_ends, lo),
            pc.add(base.ends.slice(n_base - tail), lo + len(middle_frames) - hi),
        ]
    )
    table = pa.concat_tables(
        [base.table.slice(0, head), metarange_table(middle), base.table.slice(n_base - tail)]
    ).combine_chunks()
    # The prefix's checkpoints hold for these frames too.
    kept = min(head // CHECKPOINT_RANGES, len(base.checkpoints) - 1)
    metarange_id, checkpoints = _hash_on(
        frames, ends, kept * CHECKPOINT_RANGES, base.checkpoints[kept]
    )
    return MetaRangeEncoding(
        metarange_id, table, frames, ends, (*base.checkpoints[: kept + 1], *checkpoints)
    )


__all__ = [
    "MetaRangeEncoding",
    "common_prefix_length",
    "derive_metarange_encoding",
    "encode_metarange",
    "encode_metarange_table",
    "metarange_encoding",
    "metarange_table",
]
