"""On-storage format of ranges and metaranges (docs/architecture.md §5) and their content ids.

Range file (`_quarry/ranges/<id>.parquet`): one row group, rows sorted by path, columns
    path string, physical_address string, size_bytes int64, checksum string,
    mtime timestamp[us, UTC], content_type string, metadata map<string,string>,
    identity fixed_size_binary(32)
(all required) — plain Parquet types that Spark reads directly.

Metarange file (`_quarry/metaranges/<id>.parquet`): rows (range_id, min_key, max_key, count,
size_bytes) sorted by key. A metarange of many ranges is two levels (docs/architecture.md §5):
its file is an index root (tag `metarange-index/v<N>`) whose rows, in the same schema, name
index pages (range_id = the page's id, the page's first min_key and last max_key, summed count
and size_bytes); each page is a flat metarange file of a run of the ranges, stored under the
same key shape. Where pages end is content-defined (quarry.committed.metaranges), so a
localized change rewrites the ranges it touches, one or two pages and the root, never a file
naming every range. A metarange of one page is that page's flat file (small repositories pay
nothing for the index).

Both carry the file metadata key `quarry.format` = `range/v<N>` / `metarange/v<N>`, N being
quarry.FORMAT_VERSION (the one storage format number; the tags and id headers below derive
from it). Reading a file of another version raises FormatVersionMismatch
(FAILED_PRECONDITION, naming `quarry store export` / `quarry store import`), a file without the tag
RangeCorrupt: never read with the wrong identity semantics. (Earlier versions are read
only by quarry.committed.legacy, for `quarry store import`.)

Ids hash the LOGICAL content, never file bytes, so they do not depend on the Parquet writer:

range id = hex SHA-256 of
    b"quarry/range/v<N>\\0" | u64le(n)
    | u32le len(path_i) for every row | path bytes of every row (UTF-8, concatenated)
    | u32le len(address_i) ...        | address bytes ...
    | identity_i (32 bytes) for every row
    | i64le mtime_us_i for every row
(column-wise length-prefixed encoding: unambiguous given n; identity covers the physical
address, size, checksum, content type and metadata, quarry.graveler.model.entry_identity).

metarange id = hex SHA-256 of b"quarry/metarange/v<N>\\0" followed, per range, by the
length-prefixed (u32be) fields range_id, min_key, max_key, count, size_bytes (decimal).
The empty metarange (no ranges) therefore has a fixed id per format version,
EMPTY_METARANGE_ID. An index root's id hashes b"quarry/metarange-index/v<N>\\0" followed by its
page rows, framed the same way: a root and a flat metarange never share an id. A new format version gives every range and metarange a new id.

Range size (`RangeInfo.size_bytes`, and the byte cap of chunking) is a logical measure,
`entry_bytes`: 48 + UTF-8 bytes of path, physical address, checksum, content type and every
metadata key and value. It never depends on the file encoding.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import sys
from collections.abc import Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader as _ParquetReader

from quarry import FORMAT_VERSION, errors

# The keys of ranges and metaranges are the object-store layout's (quarry.blob.layout).
from quarry.blob.layout import METARANGE_KEY, RANGE_KEY, metarange_key, range_key
from quarry.committed.errors import RangeCorrupt
from quarry.graveler.model import Entry, RangeInfo
from quarry.runtime.format_version import REBUILD_HINT, FormatVersionMismatch

# A file's content, or the path of a local file (read in place).
Source = bytes | memoryview | str


class Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


FORMAT_TAG = b"quarry.format"
RANGE_FORMAT = b"range/v%d" % FORMAT_VERSION
METARANGE_FORMAT = b"metarange/v%d" % FORMAT_VERSION
METARANGE_INDEX_FORMAT = b"metarange-index/v%d" % FORMAT_VERSION


MTIME_TYPE = pa.timestamp("us", tz="UTC")
IDENTITY_TYPE = pa.binary(32)
METADATA_TYPE = pa.map_(pa.string(), pa.string())

RANGE_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("physical_address", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("mtime", MTIME_TYPE, nullable=False),
        pa.field("content_type", pa.string(), nullable=False),
        pa.field("metadata", METADATA_TYPE, nullable=False),
        pa.field("identity", IDENTITY_TYPE, nullable=False),
    ]
)
RANGE_COLUMNS = tuple(RANGE_SCHEMA.names)

METARANGE_SCHEMA = pa.schema(
    [
        pa.field("range_id", pa.string(), nullable=False),
        pa.field("min_key", pa.string(), nullable=False),
        pa.field("max_key", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
    ]
)

# Fixed per-entry overhead in entry_bytes: identity (32) + size (8) + mtime (8).
ENTRY_OVERHEAD_BYTES = 48

_PARQUET_OPTIONS = dict(
    # Snappy: half the encode and decode time of zstd on 1,000-entry ranges (measured),
    # ~35% larger files, and the codec every Parquet reader (Spark included) has.
    compression="snappy",
    # Paths, addresses and identities are unique: dictionaries would only cost time.
    use_dictionary=["content_type", "metadata.key_value.key", "metadata.key_value.value"],
    write_statistics=["path"],
)

METARANGE_ID_HEADER = b"quarry/metarange/v%d\x00" % FORMAT_VERSION
METARANGE_INDEX_ID_HEADER = b"quarry/metarange-index/v%d\x00" % FORMAT_VERSION
RANGE_ID_HEADER = b"quarry/range/v%d\x00" % FORMAT_VERSION
_LITTLE = sys.byteorder == "little"


# The framed fields of recently hashed RangeInfo objects, by object id (with the object, so
# the id cannot be reused while cached): a commit hashes every range of the repository into
# the new metarange id, and nearly all are the same objects as in the base metarange.
_FRAMES: dict[int, tuple[RangeInfo, bytes]] = {}
_FRAMES_MAX = 65536


def range_frame(r: RangeInfo) -> bytes:
    """What metarange_id_of hashes of one range (its fields, length-prefixed)."""
    cached = _FRAMES.get(id(r))
    if cached is not None and cached[0] is r:
        return cached[1]
    parts = (r.id, r.min_key, r.max_key, str(int(r.count)), str(int(r.size_bytes)))
    framed = b"".join(struct.pack(">I", len(b)) + b for b in (part.encode() for part in parts))
    if len(_FRAMES) >= _FRAMES_MAX:
        _FRAMES.clear()
    _FRAMES[id(r)] = (r, framed)
    return framed


def metarange_id_of(ranges: Sequence[RangeInfo], header: bytes = METARANGE_ID_HEADER) -> str:
    """`header`: another version's, only to reproduce that version's ids (legacy, tests)."""
    return hashlib.sha256(header + b"".join([range_frame(r) for r in ranges])).hexdigest()


EMPTY_METARANGE_ID = metarange_id_of(())


def _fixed_buffer(array: pa.Array, width: int) -> memoryview:
    """The value bytes of a fixed-width array (respecting slice offsets)."""
    buf = array.buffers()[1]
    start = array.offset * width
    return memoryview(buf)[start : start + len(array) * width]


def _le(view: memoryview, fmt: str) -> bytes | memoryview:
    if _LITTLE:
        return view
    import array as _array

    values = _array.array(fmt, bytes(view))
    values.byteswap()
    return values.tobytes()


def _hash_strings(h: Hasher, column: pa.ChunkedArray) -> None:
    """u32le length of every string, then the bytes of every string: fed chunk by chunk,
    the same stream as for the column in one piece."""
    for lengths in pc.binary_length(column).chunks:
        if len(lengths):
            h.update(_le(_fixed_buffer(lengths, 4), "i"))
    for array in column.chunks:
        n = len(array)
        _validity, offsets_buf, data_buf = array.buffers()
        if n == 0 or data_buf is None:
            continue
        offsets = memoryview(offsets_buf).cast("B").cast("i")  # native int32 (Arrow layout)
        h.update(memoryview(data_buf)[offsets[array.offset] : offsets[array.offset + n]])


def _single_chunk(table: pa.Table, name: str) -> pa.Array:
    column = table.column(name)
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks() if column.num_chunks else pa.array([], column.type)


def range_id_of(table: pa.Table, header: bytes = RANGE_ID_HEADER) -> str:
    """The content id of a range table (see the module docstring), whatever its chunking.
    `header`: another version's, only to reproduce that version's ids (legacy, tests)."""
    n = table.num_rows
    h = hashlib.sha256(header)
    h.update(struct.pack("<Q", n))
    _hash_strings(h, table.column("path"))
    _hash_strings(h, table.column("physical_address"))
    for chunk in table.column("identity").chunks:
        h.update(_fixed_buffer(chunk, 32))
    for chunk in table.column("mtime").chunks:
        h.update(_le(_fixed_buffer(chunk.view(pa.int64()), 8), "q"))
    return h.hexdigest()


# ---- chunking -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def is_boundary(path: str, target_entries: int) -> bool:
    """A range ends after this path (content-defined, independent of neighbours). Cached:
    apply and merge ask it of the last path of every range they reuse."""
    digest = hashlib.sha256(path.encode()).digest()
    return int.from_bytes(digest[:8], "big") % target_entries == 0


def _ulen(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def entry_bytes(entry: Entry) -> int:
    size = (
        ENTRY_OVERHEAD_BYTES
        + _ulen(entry.path)
        + _ulen(entry.physical_address)
        + _ulen(entry.checksum)
        + _ulen(entry.content_type)
    )
    for key, value in entry.metadata:
        size += _ulen(key) + _ulen(value)
    return size


def row_bytes(table: pa.Table) -> pa.Array:
    """entry_bytes of every row, vectorized (int64)."""
    total = pc.add(
        pc.add(
            pc.binary_length(_single_chunk(table, "path")).cast(pa.int64()),
            pc.binary_length(_single_chunk(table, "physical_address")).cast(pa.int64()),
        ),
        pc.add(
            pc.binary_length(_single_chunk(table, "checksum")).cast(pa.int64()),
            pc.binary_length(_single_chunk(table, "content_type")).cast(pa.int64()),
        ),
    )
    metadata = _single_chunk(table, "metadata")
    # Sum of key+value lengths per row: cumulative sum over the flattened pairs, sampled at
    # the list offsets.
    keys = metadata.keys
    items = metadata.items
    if len(keys):
        pair = pc.add(
            pc.binary_length(keys).cast(pa.int64()),
            pc.fill_null(pc.binary_length(items), 0).cast(pa.int64()),
        )
        cum = pa.concat_arrays([pa.array([0], pa.int64()), pc.cumulative_sum(pair)])
        # Offsets index the underlying (unsliced) keys/items, as do `keys` and `items`.
        at = pc.take(cum, metadata.offsets)
        n = len(metadata)
        per_row = pc.subtract(at.slice(1, n), at.slice(0, n))
        total = pc.add(total, per_row)
    return pc.add(total, ENTRY_OVERHEAD_BYTES)


# ---- tables ---------------------------------------------------------------------------------


class RowBuffer:
    """Columns of new entries being accumulated before they become a table."""

    __slots__ = (
        "path",
        "physical_address",
        "size_bytes",
        "checksum",
        "mtime",
        "content_type",
        "metadata",
        "identity",
    )

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.path: list[str] = []
        self.physical_address: list[str] = []
        self.size_bytes: list[int] = []
        self.checksum: list[str] = []
        self.mtime: list[int] = []
        self.content_type: list[str] = []
        self.metadata: list = []
        self.identity: list[bytes] = []

    def __len__(self) -> int:
        return len(self.path)

    def append(self, entry: Entry, path_bytes: int) -> int:
        """Add an entry; returns its entry_bytes (inlined here: this is the hot loop of bulk
        writes). `path_bytes` is the UTF-8 length of the path, which the caller has."""
        address = entry.physical_address or ""
        checksum = entry.checksum or ""
        content_type = entry.content_type or ""
        metadata = entry.metadata
        self.path.append(entry.path)
        self.physical_address.append(address)
        self.size_bytes.append(entry.size_bytes)
        self.checksum.append(checksum)
        self.mtime.append(entry.mtime_us)
        self.content_type.append(content_type)
        self.metadata.append(metadata)
        self.identity.append(entry.identity)
        size = (
            ENTRY_OVERHEAD_BYTES
            + path_bytes
            + (len(address) if address.isascii() else len(address.encode()))
            + (len(checksum) if checksum.isascii() else len(checksum.encode()))
            + (len(content_type) if content_type.isascii() else len(content_type.encode()))
        )
        for key, value in metadata:
            size += (len(key) if key.isascii() else len(key.encode())) + (
                len(value) if value.isascii() else len(value.encode())
            )
        return size

    def to_table(self) -> pa.Table:
        try:
            return pa.Table.from_arrays(
                [
                    pa.array(self.path, pa.string()),
                    pa.array(self.physical_address, pa.string()),
                    pa.array(self.size_bytes, pa.int64()),
                    pa.array(self.checksum, pa.string()),
                    pa.array(self.mtime, MTIME_TYPE),
                    pa.array(self.content_type, pa.string()),
                    pa.array(self.metadata, METADATA_TYPE),
                    pa.array(self.identity, IDENTITY_TYPE),
                ],
                schema=RANGE_SCHEMA,
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeEncodeError) as exc:
            raise errors.InvalidArgument(f"invalid entry: {exc}") from None


def encode_range(table: pa.Table, range_id: str) -> memoryview:
    table = table.replace_schema_metadata(
        {FORMAT_TAG: RANGE_FORMAT, b"quarry.range_id": range_id.encode()}
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=max(1, table.num_rows), **_PARQUET_OPTIONS)
    return file_bytes(sink)


def file_bytes(sink: pa.BufferOutputStream) -> memoryview:
    """What a sink holds, as bytes without a copy (see quarry.blob.base.BlobBytes)."""
    return memoryview(sink.getvalue()).cast("B")


def read_tagged_parquet(
    source: Source, what: str, tag: bytes, columns: list[str] | None = None
) -> pa.Table:
    """Read a whole small Parquet file from bytes or a local path (FileNotFoundError if the
    path is missing), refusing a file whose format tag is not `tag`: FormatVersionMismatch
    for a tag of another storage format version, RangeCorrupt for none or a foreign one.
    Reading the bytes and parsing from memory, single-threaded, is the fastest way for files
    of this size."""
    return read_parquet_tagged_one_of(source, what, (tag,), columns)[1]


def read_parquet_tagged_one_of(
    source: Source, what: str, tags: tuple[bytes, ...], columns: list[str] | None = None
) -> tuple[bytes, pa.Table]:
    """read_tagged_parquet accepting any of `tags`: (the file's tag, its table)."""
    if isinstance(source, str):
        with open(source, "rb") as fh:
            source = fh.read()
    try:
        # The reader under pq.ParquetFile, without its per-file Python set-up (a third of
        # the time of decoding a range).
        reader = _ParquetReader()
        reader.open(pa.BufferReader(source))
        found = (reader.metadata.metadata or {}).get(FORMAT_TAG)
        _check_tag(found, tags, what)
        indices = None
        if columns is not None:
            indices = [reader.column_name_idx(name) for name in columns]
        assert found is not None
        return found, reader.read_all(column_indices=indices, use_threads=False)
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise RangeCorrupt(f"unreadable {what} file: {exc}") from None


def format_tag_of(source: bytes) -> bytes | None:
    """The `quarry.format` tag of a range or metarange file's bytes (None without one)."""
    try:
        metadata = pq.ParquetFile(pa.BufferReader(source)).metadata.metadata or {}
    except (pa.ArrowInvalid, OSError) as exc:
        raise RangeCorrupt(f"unreadable range or metarange file: {exc}") from None
    return metadata.get(FORMAT_TAG)


def _check_tag(found: bytes | None, tags: tuple[bytes, ...], what: str) -> None:
    if found in tags:
        return
    tag = tags[0]
    kind, _, version = tag.partition(b"/v")
    found_kind, _, found_version = (found or b"").partition(b"/v")
    kinds = {t.partition(b"/v")[0] for t in tags}
    # A flat metarange of an earlier version counts as a metarange of that version too.
    if found_kind in kinds and found_version.isdigit():
        raise FormatVersionMismatch(
            f"this {what} file was written in storage format version "
            f"{found_version.decode()}, but this build of Quarry reads and writes version "
            f"{version.decode()}. {REBUILD_HINT}",
            metadata={"found": found_version.decode(), "expected": version.decode(), "file": what},
        )
    raise RangeCorrupt(f"not a quarry {what} file (format tag {found!r}, expected {tag!r})")


def decode_range(source: Source) -> pa.Table:
    """A range table from bytes or a local file path."""
    table = read_tagged_parquet(source, "range", RANGE_FORMAT)
    if table.schema.names != list(RANGE_COLUMNS):
        raise RangeCorrupt(f"range file has columns {table.schema.names}")
    return table.replace_schema_metadata(None).combine_chunks()


def decode_range_keys(source: Source) -> pa.Table:
    """Only the path and identity columns of a range (from bytes or a local file path):
    what comparing ranges needs, for about a third of a full decode."""
    table = read_tagged_parquet(source, "range", RANGE_FORMAT, ["path", "identity"])
    if table.schema.names != ["path", "identity"]:
        raise RangeCorrupt(f"range file has columns {table.schema.names}")
    return table.replace_schema_metadata(None).combine_chunks()


def decode_metarange(source: Source) -> list[RangeInfo]:
    """The rows of a flat metarange file (an index page, or a one-page metarange)."""
    return metarange_rows(read_tagged_parquet(source, "metarange", METARANGE_FORMAT))


def metarange_rows(table: pa.Table) -> list[RangeInfo]:
    if table.schema.names != METARANGE_SCHEMA.names:
        raise RangeCorrupt(f"metarange file has columns {table.schema.names}")
    columns = [table.column(name).to_pylist() for name in METARANGE_SCHEMA.names]
    return [RangeInfo(*row) for row in zip(*columns, strict=True)]


__all__ = [
    "EMPTY_METARANGE_ID",
    "range_frame",
    "METARANGE_FORMAT",
    "METARANGE_INDEX_FORMAT",
    "read_parquet_tagged_one_of",
    "METARANGE_SCHEMA",
    "RANGE_FORMAT",
    "RANGE_SCHEMA",
    "RangeCorrupt",
    "RowBuffer",
    "decode_metarange",
    "decode_range",
    "decode_range_keys",
    "encode_range",
    "entry_bytes",
    "format_tag_of",
    "metarange_rows",
    "read_tagged_parquet",
    "is_boundary",
    "metarange_id_of",
    "metarange_key",
    "METARANGE_KEY",
    "RANGE_KEY",
    "range_id_of",
    "range_key",
    "row_bytes",
]
