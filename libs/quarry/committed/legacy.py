"""Committed data of EARLIER storage formats, rewritten in this build's format — used only by
`quarry store import` (quarry.exporting). This is the one place that reads a range or metarange
file of another format version; everything else refuses one (quarry.committed.format).

Format 1 → 2 (docs/architecture.md §2): the Parquet schemas are the same, but format 1's identity
column left the physical address out. Rewriting a range recomputes every row's identity
(quarry.graveler.model.entry_identity), which gives it a new range id; a metarange is
rewritten with the same bounds, counts and sizes and the new range ids, which gives it a
new metarange id. Files already in this build's format are kept as they are.

Format 2 → 3 (docs/architecture.md §5): a metarange of many ranges became two levels (an
index root over pages, quarry.committed.metaranges); format 2's metaranges are flat. A
range keeps its rows (identities as in format 2) under the new id header; a metarange is
rewritten as this build writes it (pages and root, or flat when it is one page).

Work is proportional to the distinct ranges and metaranges referenced, not to commits ×
entries: every old range id and metarange id is converted once (memoized) per namespace, and
the many metaranges of a history share most of their ranges.

Must never: delete or overwrite a file (new files are put if absent and content-addressed,
old ones stay for the old build and become garbage GC may collect once no commit refers to
them); read a file of an unknown or newer version as if it were a known one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from quarry import FORMAT_VERSION
from quarry.blob import BlobStore, ObjectNotFound
from quarry.committed.errors import MetaRangeNotFound, RangeCorrupt, RangeNotFound
from quarry.committed.format import (
    EMPTY_METARANGE_ID,
    IDENTITY_TYPE,
    METARANGE_FORMAT,
    METARANGE_INDEX_FORMAT,
    RANGE_COLUMNS,
    RANGE_FORMAT,
    encode_range,
    format_tag_of,
    metarange_key,
    metarange_rows,
    range_id_of,
    range_key,
    read_tagged_parquet,
)
from quarry.committed.metaranges import write_metarange
from quarry.graveler.model import RangeInfo, entry_identity

# Storage format versions whose committed data this build rewrites (same file schemas as
# this version's; only what the identity column covers differs).
LEGACY_VERSIONS = (1, 2)
_LEGACY_RANGE_TAGS = {b"range/v%d" % v for v in LEGACY_VERSIONS}
_LEGACY_METARANGE_TAGS = {b"metarange/v%d" % v for v in LEGACY_VERSIONS}
# Versions whose identity column covered less than this build's (their rows are recomputed).
_OTHER_IDENTITY_TAGS = {b"range/v1"}
# The empty metarange of each legacy version (it may have no file).
_LEGACY_EMPTY_METARANGE_IDS = {
    hashlib.sha256(b"quarry/metarange/v%d\x00" % v).hexdigest() for v in LEGACY_VERSIONS
}
assert FORMAT_VERSION not in LEGACY_VERSIONS


@dataclass
class RewriteStats:
    ranges_rewritten: int = 0
    metaranges_rewritten: int = 0
    metaranges_kept: int = 0  # already in this build's format


class CommittedRewriter:
    """Maps the metarange ids of one storage namespace to their ids in this build's format,
    writing the rewritten ranges and metaranges there (memoized per old id)."""

    def __init__(self, store: BlobStore, namespace: str):
        self._store = store
        self._namespace = namespace
        self._metaranges: dict[str, str] = {}
        self._ranges: dict[str, RangeInfo] = {}
        self.stats = RewriteStats()

    @property
    def rewrote_anything(self) -> bool:
        return bool(self.stats.metaranges_rewritten)

    def metarange(self, metarange_id: str) -> str:
        """The id, in this build's format, of the metarange `metarange_id` ("" stays "")."""
        if metarange_id in ("", EMPTY_METARANGE_ID):
            return metarange_id
        found = self._metaranges.get(metarange_id)
        if found is None:
            found = self._metaranges[metarange_id] = self._rewrite_metarange(metarange_id)
        return found

    def _rewrite_metarange(self, metarange_id: str) -> str:
        try:
            data = self._store.get(metarange_key(metarange_id))
        except ObjectNotFound:
            if metarange_id in _LEGACY_EMPTY_METARANGE_IDS:
                return self._write_metarange([])
            raise MetaRangeNotFound(
                f"metarange {metarange_id} is missing from "
                f"{self._namespace}; the committed data cannot be "
                f"rebuilt",
                metadata={"metarange_id": metarange_id, "namespace": self._namespace},
            ) from None
        tag = format_tag_of(data)
        if tag in (METARANGE_FORMAT, METARANGE_INDEX_FORMAT):
            self.stats.metaranges_kept += 1
            return metarange_id
        # Anything but a legacy tag: the reader's own refusal (version mismatch or corrupt).
        expected = tag if tag in _LEGACY_METARANGE_TAGS else METARANGE_FORMAT
        ranges = metarange_rows(read_tagged_parquet(data, "metarange", expected))
        return self._write_metarange([self._range(info) for info in ranges])

    def _write_metarange(self, ranges: list[RangeInfo]) -> str:
        # The ranges and pages it names become durable before it can become visible.
        new_id = write_metarange(self._store, ranges)
        self.stats.metaranges_rewritten += 1
        return new_id

    def _range(self, info: RangeInfo) -> RangeInfo:
        found = self._ranges.get(info.id)
        if found is None:
            found = self._ranges[info.id] = self._rewrite_range(info)
        return found

    def _rewrite_range(self, info: RangeInfo) -> RangeInfo:
        try:
            data = self._store.get(range_key(info.id))
        except ObjectNotFound:
            raise RangeNotFound(
                f"range {info.id} is missing from {self._namespace}; the "
                f"committed data cannot be rebuilt",
                metadata={"range_id": info.id, "namespace": self._namespace},
            ) from None
        tag = format_tag_of(data)
        if tag == RANGE_FORMAT:
            return info
        expected = tag if tag in _LEGACY_RANGE_TAGS else RANGE_FORMAT
        table = read_tagged_parquet(data, "range", expected)
        if table.schema.names != list(RANGE_COLUMNS) or table.num_rows != info.count:
            raise RangeCorrupt(
                f"range {info.id} in {self._namespace} has columns "
                f"{table.schema.names} and {table.num_rows} rows, its "
                f"metarange says {info.count}"
            )
        table = table.replace_schema_metadata(None).combine_chunks()
        if tag in _OTHER_IDENTITY_TAGS:
            table = with_current_identities(table)
        new_id = range_id_of(table)
        self._store.put_deferred(range_key(new_id), encode_range(table, new_id))
        self.stats.ranges_rewritten += 1
        return RangeInfo(new_id, info.min_key, info.max_key, info.count, info.size_bytes)


def with_current_identities(table: pa.Table) -> pa.Table:
    """A range table with its identity column recomputed by this build's rule."""
    columns = [
        table.column(name).to_pylist()
        for name in ("physical_address", "size_bytes", "checksum", "content_type", "metadata")
    ]
    identities = [
        entry_identity(address, size, checksum, content_type, metadata)
        for address, size, checksum, content_type, metadata in zip(*columns, strict=True)
    ]
    index = table.schema.get_field_index("identity")
    return table.set_column(index, table.schema.field(index), pa.array(identities, IDENTITY_TYPE))


__all__ = ["CommittedRewriter", "LEGACY_VERSIONS", "RewriteStats", "with_current_identities"]
