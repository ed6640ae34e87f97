"""Decoded ranges and metaranges, kept columnar: Python objects are built only on demand."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from quarry.committed.format import ENTRY_OVERHEAD_BYTES, is_boundary
from quarry.graveler.model import Entry, RangeInfo

# Rough per-row cost of the Python objects a range grows on demand (a list entry and the
# object): a path or identity list, and the rest of the columns for entries.
_PY_BYTES_PER_LIST_ROW = 80
_PY_BYTES_PER_ENTRY_ROW = 400


def _offsets(array: pa.Array) -> tuple[memoryview, int]:
    """The int32 offsets of a string/list-like array and the array's slice offset."""
    return memoryview(array.buffers()[1]).cast("B").cast("i"), array.offset


def _chunk(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class CumulativeBytes:
    """Prefix sums of format.entry_bytes over a range table's rows, computed on access from
    the Arrow offsets (the UTF-8 byte lengths of every string are offset differences)."""

    __slots__ = ("_n", "_strings", "_map", "_keys", "_items")

    def __init__(self, table: pa.Table):
        self._n = table.num_rows
        self._strings = [
            _offsets(_chunk(table, name))
            for name in ("path", "physical_address", "checksum", "content_type")
        ]
        metadata = _chunk(table, "metadata")
        self._map = _offsets(metadata)
        # Map offsets index the underlying keys/items arrays (absolute, even when sliced).
        self._keys = _offsets(metadata.keys)
        self._items = _offsets(metadata.items)

    def __len__(self) -> int:
        return self._n + 1

    def __getitem__(self, i: int) -> int:
        if i < 0:
            i += self._n + 1
        if not 0 <= i <= self._n:
            raise IndexError(i)
        total = ENTRY_OVERHEAD_BYTES * i
        for offsets, base in self._strings:
            total += offsets[base + i] - offsets[base]
        map_offsets, map_base = self._map
        first, last = map_offsets[map_base], map_offsets[map_base + i]
        for offsets, base in (self._keys, self._items):
            total += offsets[base + last] - offsets[base + first]
        return total


class PathColumn:
    """The paths of a range as a read-only sequence decoded one at a time from the Arrow
    buffers: for binary searches, which look at ~log2(n) paths of a range and would
    otherwise build a Python string for every row. (str order is UTF-8 byte order.)"""

    __slots__ = ("_offsets", "_base", "_data", "_n")

    def __init__(self, array: pa.Array):
        self._offsets, self._base = _offsets(array)
        data = array.buffers()[2]
        self._data = memoryview(data) if data is not None else memoryview(b"")
        self._n = len(array)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self._n:
            raise IndexError(i)
        at = self._base + i
        return str(self._data[self._offsets[at] : self._offsets[at + 1]], "utf-8")


# Entries decoded from a range are built without Entry.__init__'s coercions (the columns
# are already typed and the metadata pairs are stored in Entry's canonical sorted order),
# when Entry's layout is the one this code knows; otherwise through the constructor.
_ENTRY_SLOTS = (
    "path",
    "physical_address",
    "size_bytes",
    "checksum",
    "mtime_us",
    "content_type",
    "metadata",
    "_identity",
)
_FAST_ENTRIES = tuple(getattr(Entry, "__slots__", ())) == _ENTRY_SLOTS
_new_entry = object.__new__


def _make_entry(  # noqa: PLR0913 — Entry's fields, positional: the hot path of reads
    path: str,
    address: str,
    size: int,
    checksum: str,
    mtime_us: int,
    content_type: str,
    metadata: Any,
    identity: bytes,
) -> Entry:
    if not _FAST_ENTRIES:
        return Entry(
            path, address, size, checksum, mtime_us, content_type, metadata or (), identity
        )
    entry = _new_entry(Entry)
    entry.path = path
    entry.physical_address = address
    entry.size_bytes = size
    entry.checksum = checksum
    entry.mtime_us = mtime_us
    entry.content_type = content_type
    if not metadata:
        entry.metadata = ()
    elif len(metadata) == 1:
        entry.metadata = (tuple(metadata[0]),)
    else:
        entry.metadata = tuple(sorted(tuple(pair) for pair in metadata))
    entry._identity = identity
    return entry


class RangeData:
    """One range: its RangeInfo and its Arrow table, with lazily derived Python columns."""

    __slots__ = (
        "info",
        "table",
        "n",
        "_paths",
        "_path_column",
        "_identities",
        "_identity_blob",
        "_columns",
        "_cum",
        "_last_boundary",
        "_sparse_lookups",
        "_grown",
    )

    def __init__(self, info: RangeInfo, table: pa.Table):
        self.info = info
        self.table = table
        self.n = table.num_rows
        self._paths: list[str] | None = None
        self._path_column: PathColumn | None = None
        self._identities: list[bytes] | None = None
        self._identity_blob: bytes | None = None
        self._columns: tuple | None = None
        self._cum: CumulativeBytes | None = None
        self._last_boundary: dict[int, bool] = {}
        self._sparse_lookups = 0
        self._grown: Callable[[RangeData, int], None] | None = None

    def on_growth(self, grown: Callable[[RangeData, int], None] | None) -> None:
        """`grown(self, bytes)` is told what each Python column built later adds (the cache
        that holds this range charges it then: most ranges never build any). Handed the
        range rather than holding it: no reference cycle keeps a range alive."""
        self._grown = grown

    def _grew(self, rows_bytes: int) -> None:
        if self._grown is not None:
            self._grown(self, rows_bytes * self.n)

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def cache_bytes(self) -> int:
        # The buffers the table keeps alive, summed (what the cache really holds: a slice keeps
        # its whole buffers). Not Table.nbytes: it works out which bytes each slice references,
        # ~0.5 ms per decoded range, a sixth of a scattered merge's main-thread time.
        return self.table.get_total_buffer_size() + self.python_bytes()

    def buffers(self) -> dict[int, int]:
        """The Arrow buffers the table keeps alive, by address: what the range cache charges
        once however many ranges hold them (a rewritten range's slices hold its old
        version's buffers)."""
        held: dict[int, int] = {}
        for column in self.table.columns:
            for chunk in column.chunks:
                for buffer in chunk.buffers():  # children's too (the metadata map's)
                    if buffer is not None:
                        held[buffer.address] = buffer.size
        return held

    def python_bytes(self) -> int:
        """What the Python columns built so far hold (estimated)."""
        per_row = 32 if self._identity_blob is not None else 0
        if self._columns is not None:
            per_row += _PY_BYTES_PER_ENTRY_ROW
        per_row += _PY_BYTES_PER_LIST_ROW * (
            (self._paths is not None) + (self._identities is not None)
        )
        return per_row * self.n

    @property
    def paths(self) -> list[str]:
        if self._paths is None:
            self._paths = self.table.column("path").to_pylist()
            self._grew(_PY_BYTES_PER_LIST_ROW)
        return self._paths

    @property
    def sorted_paths(self) -> list[str] | PathColumn:
        """The paths for a binary search: the list if it is built already, else a
        PathColumn (no per-row objects)."""
        if self._paths is not None:
            return self._paths
        if self._path_column is None:
            self._path_column = PathColumn(_chunk(self.table, "path"))
        return self._path_column

    @property
    def identities(self) -> list[bytes]:
        if self._identities is None:
            self._identities = self.table.column("identity").to_pylist()
            self._grew(_PY_BYTES_PER_LIST_ROW)
        return self._identities

    def identity(self, i: int) -> bytes:
        """Identity of row i (a slice of identity_blob: no per-row objects are built)."""
        blob = self._identity_blob
        if blob is None:
            blob = self.identity_blob
        return blob[i * 32 : i * 32 + 32]

    def find(self, path: str) -> int:
        """Row index of `path`, or -1."""
        paths = self.sorted_paths
        i = bisect.bisect_left(paths, path)
        return i if i < self.n and paths[i] == path else -1

    @property
    def cum_bytes(self) -> CumulativeBytes:
        """cum_bytes[i] = entry_bytes of rows [0, i), for 0 <= i <= n (a sequence: bisect
        works on it). O(1) to build and to index: read off the Arrow offset buffers."""
        if self._cum is None:
            self._cum = CumulativeBytes(self.table)
        return self._cum

    def last_is_boundary(self, target_entries: int) -> bool:
        cached = self._last_boundary.get(target_entries)
        if cached is None:
            last = self.table.column("path")[self.n - 1].as_py()
            cached = self._last_boundary[target_entries] = is_boundary(last, target_entries)
        return cached

    def _all_columns(self) -> tuple:
        if self._columns is None:
            t = self.table
            self._columns = (
                self.paths,
                t.column("physical_address").to_pylist(),
                t.column("size_bytes").to_pylist(),
                t.column("checksum").to_pylist(),
                t.column("mtime").cast(pa.int64()).to_pylist(),
                t.column("content_type").to_pylist(),
                t.column("metadata").to_pylist(),
                self.identities,
            )
            self._grew(_PY_BYTES_PER_ENTRY_ROW)
        return self._columns

    def entry(self, i: int) -> Entry:
        """Row i as an Entry (builds the Python columns once: for iteration)."""
        columns = self._columns or self._all_columns()
        return _make_entry(
            columns[0][i],
            columns[1][i],
            columns[2][i],
            columns[3][i],
            columns[4][i],
            columns[5][i],
            columns[6][i],
            columns[7][i],
        )

    def sparse_entry(self, i: int) -> Entry:
        """Row i as an Entry when only a few rows of the range will be needed: point reads
        for the first few, whole columns after that."""
        if self._columns is None:
            self._sparse_lookups += 1
            if self._sparse_lookups <= 8:
                return self.entry_at(i)
        return self.entry(i)

    @property
    def identity_blob(self) -> bytes:
        """The identities of all rows, concatenated (32 bytes each)."""
        if self._identity_blob is None:
            column = _chunk(self.table, "identity")
            start = column.offset * 32
            self._identity_blob = bytes(
                memoryview(column.buffers()[1])[start : start + self.n * 32]
            )
            self._grew(32)
        return self._identity_blob

    def entry_at(self, i: int) -> Entry:
        """Row i as an Entry without building whole columns (for point lookups)."""
        if self._columns is not None:
            return self.entry(i)
        t = self.table
        return _make_entry(
            t.column("path")[i].as_py(),
            t.column("physical_address")[i].as_py(),
            t.column("size_bytes")[i].as_py(),
            t.column("checksum")[i].as_py(),
            t.column("mtime")[i].value,  # int us: no cast
            t.column("content_type")[i].as_py(),
            t.column("metadata")[i].as_py() or (),
            t.column("identity")[i].as_py(),
        )


# Keys a metarange's cache weight is estimated from (MetaRange.cache_bytes).
KEY_SAMPLE = 64


@dataclass
class MetaRange:
    id: str
    ranges: list[RangeInfo]
    # Every range's max_key (for bisect); built here unless given (writers splice them).
    max_keys: list[str] = field(default_factory=list)
    # The max keys' summed UTF-8 length, when the caller knows it (see cache_bytes).
    key_bytes: int | None = None
    # An index root's pages (its rows) and where in `ranges` each ends; empty for a flat
    # metarange (quarry.committed.metaranges).
    pages: tuple[RangeInfo, ...] = ()
    page_ends: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.max_keys:
            self.max_keys = [r.max_key for r in self.ranges]

    @property
    def cache_bytes(self) -> int:
        """Its weight in the metarange cache: min and max keys are about as long. Without
        key_bytes, the keys' length is estimated from at most ~2 x KEY_SAMPLE of them (a
        weight needs no exact sum, and a merge's result would otherwise cost a pass over
        every range: 10k at 10M entries)."""
        chars = self.key_bytes
        if chars is None:
            sample = self.max_keys[:: max(1, len(self.max_keys) // KEY_SAMPLE)]
            chars = sum(map(len, sample)) * len(self.max_keys) // max(1, len(sample))
        return 256 + 200 * len(self.ranges) + 2 * chars

    @property
    def count(self) -> int:
        return sum(r.count for r in self.ranges)

    def range_index(self, key: str) -> int:
        """Index of the first range whose max_key >= key (len(ranges) if none)."""
        return bisect.bisect_left(self.max_keys, key)


def changed_rows(left: RangeData, right: RangeData) -> int | None:
    """The number of rows whose identity differs between two ranges holding the same paths
    in the same order (compared as Arrow columns, without a Python object per row); None
    when their paths differ (then only a walk by path tells the changes)."""
    if left.n != right.n or not left.table.column("path").equals(right.table.column("path")):
        return None
    differ = pc.sum(pc.not_equal(left.table.column("identity"), right.table.column("identity")))
    return int(differ.as_py() or 0)
