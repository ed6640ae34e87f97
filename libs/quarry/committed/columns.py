"""Entries in columns: how a metarange's entries travel to the range-writer (WriteMetaRange's
`entry_columns`, Arrow IPC) and become range rows without a Python object per entry.

An import streams ~10^6 entries: a protobuf message and an Entry per object cost more CPU
than listing the source (docs/performance.md). Here the committer appends the listing's
fields to column lists and sends Arrow record batches; the range-writer checks them
vectorized, computes each row's identity and chunk boundary (the two SHA-256s per entry no
one can skip) straight from the Arrow buffers, and slices range tables out of the batch.

Batch schema (ENTRY_COLUMNS_SCHEMA): the range file's columns (quarry.committed.format)
without `identity`, which the range-writer computes: never trusted from the sender. The
identity is quarry.graveler.model.entry_identity, byte for byte (a test compares both ways).
"""

from __future__ import annotations

import functools
import hashlib
import sys
from array import array
from collections.abc import Iterable, Iterator
from itertools import accumulate
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from quarry import errors
from quarry.blob.chunks import ColumnChunk
from quarry.committed.errors import InvalidPath
from quarry.committed.format import (
    IDENTITY_TYPE,
    METADATA_TYPE,
    MTIME_TYPE,
    RANGE_SCHEMA,
    entry_bytes,
)
from quarry.graveler.errors import InvalidEntry
from quarry.graveler.model import Entry, entry_identity

ENTRY_COLUMNS_SCHEMA = pa.schema([field for field in RANGE_SCHEMA if field.name != "identity"])
_TYPES = [(field.name, field.type) for field in ENTRY_COLUMNS_SCHEMA]

# mtime must be a protobuf Timestamp (years 1..9999), as over the per-entry path
# (quarry.convert.entry_from_proto): what reads give back as Entry.mtime is one.
_MIN_MTIME_US = -62_135_596_800 * 1_000_000
_MAX_MTIME_US = 253_402_300_799 * 1_000_000 + 999_999

# Rows per record batch and its byte budget (entry_bytes): well under the gRPC message limit,
# small enough that the range-writer works on one batch while the next is listed.
BATCH_ROWS = 8192
BATCH_BYTES = 4 * 1024 * 1024


# Arrays made from their buffers, not with pa.array: pa.array's first call in a process
# imports pandas (to ask whether its input is a pandas object), 0.4-0.5 s of CPU that a
# committer's first import, or a range-writer's first metarange, would pay (measured).


def string_array(values: list[str]) -> pa.Array:
    """A string array of `values` (UnicodeEncodeError for a str that is not Unicode text)."""
    encoded = [value.encode() for value in values]
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, encoded)))
    return pa.Array.from_buffers(
        pa.string(),
        len(values),
        [None, pa.py_buffer(little_endian(offsets)), pa.py_buffer(b"".join(encoded))],
    )


def empty_strings(n: int) -> pa.Array:
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(bytes(4 * (n + 1))), pa.py_buffer(b"")]
    )


def empty_maps(n: int) -> pa.Array:
    """n empty metadata maps."""
    return pa.MapArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))]),
        empty_strings(0),
        empty_strings(0),
        type=METADATA_TYPE,
    )


def int64_array(values: list[int], type: pa.DataType) -> pa.Array:
    """An array of 64-bit `values` of `type` (OverflowError / TypeError for others)."""
    return pa.Array.from_buffers(
        type, len(values), [None, pa.py_buffer(little_endian(array("q", values)))]
    )


def little_endian(values: array) -> array:
    """Arrow buffers are little-endian."""
    if sys.byteorder != "little":
        values.byteswap()
    return values


class EntryColumns:
    """Column lists being filled, one value per entry, until they become a record batch."""

    __slots__ = ("path", "address", "size", "checksum", "mtime", "content_type", "metadata")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.path: list[str] = []
        self.address: list[str] = []
        self.size: list[int] = []
        self.checksum: list[str] = []
        self.mtime: list[int] = []
        self.content_type: list[str] = []
        self.metadata: list[Any] = []

    def __len__(self) -> int:
        return len(self.path)

    def append_entry(self, entry: Entry) -> None:
        self.path.append(entry.path)
        self.address.append(entry.physical_address)
        self.size.append(entry.size_bytes)
        self.checksum.append(entry.checksum)
        self.mtime.append(entry.mtime_us)
        self.content_type.append(entry.content_type)
        self.metadata.append(entry.metadata)

    def batch(self) -> pa.RecordBatch:
        """The rows so far as a record batch; the lists start again empty. A caller that
        appends to the first five lists only (an import: objects have no content type or
        metadata) gets those two columns empty for every row, built without lists. Only
        metadata goes through pa.array (see string_array)."""
        n = len(self.path)
        try:
            content_type = (
                string_array(self.content_type) if self.content_type else empty_strings(n)
            )
            metadata = (
                pa.array(self.metadata, METADATA_TYPE) if any(self.metadata) else empty_maps(n)
            )
            batch = pa.RecordBatch.from_arrays(
                [
                    string_array(self.path),
                    string_array(self.address),
                    int64_array(self.size, pa.int64()),
                    string_array(self.checksum),
                    int64_array(self.mtime, MTIME_TYPE),
                    content_type,
                    metadata,
                ],
                schema=ENTRY_COLUMNS_SCHEMA,
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, UnicodeEncodeError) as exc:
            raise errors.InvalidArgument(f"invalid entry: {exc}") from None
        except OverflowError as exc:
            raise errors.InvalidArgument(f"invalid entry: {exc}") from None
        self.clear()
        return batch


def chunks_batch(chunks: list[ColumnChunk]) -> pa.RecordBatch:
    """One record batch of the rows of listing chunks (quarry.blob.chunks: already column
    buffers), in their order; the objects have no content type or metadata."""

    def strings(buffers: tuple[bytes, bytes], n: int) -> pa.Array:
        offsets, data = buffers
        return pa.Array.from_buffers(
            pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )

    def integers(data: bytes, n: int, type: pa.DataType) -> pa.Array:
        return pa.Array.from_buffers(type, n, [None, pa.py_buffer(data)])

    def column(make: Any) -> pa.Array:
        arrays = [make(chunk) for chunk in chunks if chunk.rows]
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    n = sum(chunk.rows for chunk in chunks)
    return pa.RecordBatch.from_arrays(
        [
            column(lambda c: strings(c.paths, c.rows)),
            column(lambda c: strings(c.addresses, c.rows)),
            column(lambda c: integers(c.sizes, c.rows, pa.int64())),
            column(lambda c: strings(c.checksums, c.rows)),
            column(lambda c: integers(c.mtimes, c.rows, MTIME_TYPE)),
            empty_strings(n),
            empty_maps(n),
        ],
        schema=ENTRY_COLUMNS_SCHEMA,
    )


def entry_batches(
    entries: Iterable[Entry], max_rows: int = BATCH_ROWS, max_bytes: int = BATCH_BYTES
) -> Iterator[pa.RecordBatch]:
    """Entries as record batches of at most max_rows rows, and of max_bytes of entry_bytes
    (or one entry, if larger)."""
    columns = EntryColumns()
    size = 0
    for entry in entries:
        if not isinstance(entry, Entry):
            raise errors.InvalidArgument(f"expected an Entry, got {type(entry).__name__}")
        try:
            added = entry_bytes(entry)
        except UnicodeEncodeError:
            try:
                entry.path.encode()
            except UnicodeEncodeError:
                raise InvalidPath(f"path {entry.path!r} is not valid UTF-8") from None
            raise errors.InvalidArgument(
                f"entry {entry.path!r}: a field is not valid UTF-8"
            ) from None
        if len(columns) and size + added > max_bytes:
            yield columns.batch()
            size = 0
        columns.append_entry(entry)
        size += added
        if len(columns) >= max_rows:
            yield columns.batch()
            size = 0
    if len(columns):
        yield columns.batch()


def encode_batch(batch: pa.RecordBatch) -> bytes:
    """One record batch as an Arrow IPC stream (schema and batch): a message of its own."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batches(data: bytes) -> list[pa.RecordBatch]:
    """The record batches of an IPC stream (not yet checked: CommittedManager.write_columns
    checks each); a stream that does not decode is InvalidArgument, never INTERNAL."""
    try:
        return list(pa.ipc.open_stream(pa.py_buffer(data)))
    except (pa.ArrowInvalid, OSError) as exc:
        raise errors.InvalidArgument(f"entry_columns: not an Arrow IPC stream: {exc}") from None


def check_batch(batch: pa.RecordBatch) -> None:
    """The schema is ENTRY_COLUMNS_SCHEMA's (names and types), no value is null, strings
    are valid UTF-8 and mtimes are Timestamps."""
    got = [(field.name, field.type) for field in batch.schema]
    if got != _TYPES:
        raise errors.InvalidArgument(
            f"entry_columns: expected columns {[f'{n}: {t}' for n, t in _TYPES]}, "
            f"got {[f'{n}: {t}' for n, t in got]}"
        )
    metadata = batch.column("metadata")
    if any(column.null_count for column in batch.columns) or (
        metadata.keys.null_count or metadata.items.null_count
    ):
        raise errors.InvalidArgument("entry_columns: null values are not allowed")
    try:
        batch.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise errors.InvalidArgument(f"entry_columns: invalid batch: {exc}") from None
    if batch.num_rows:
        low, high = pc.min_max(batch.column("mtime").view(pa.int64())).values()
        if low.as_py() < _MIN_MTIME_US or high.as_py() > _MAX_MTIME_US:
            raise InvalidEntry("entry_columns: an mtime is outside the Timestamp range")


def _values(array: pa.Array) -> tuple[bytes, list[int]]:
    """(data, bounds) of a string or binary array: value i is data[bounds[i]:bounds[i + 1]].
    Sliced from one bytes copy of the data, a value costs a small bytes object: cheaper to
    make and to hash than a memoryview slice (the hash loops below run once per entry)."""
    _validity, offsets_buf, data_buf = array.buffers()
    offsets = memoryview(offsets_buf).cast("B").cast("i")  # native int32 (Arrow layout)
    bounds = offsets[array.offset : array.offset + len(array) + 1].tolist()
    return (data_buf.to_pybytes() if data_buf is not None else b""), bounds


def _length_prefixes(lengths: pa.Array) -> pa.Array:
    """u32be of every length (int32, from binary_length), as a binary array of 4-byte
    values: the int32 buffer byte-swapped whole, no Python int per row."""
    n = len(lengths)
    values = array("i")
    values.frombytes(lengths.buffers()[1])  # native int32 (Arrow layout)
    values = values[lengths.offset : lengths.offset + n]
    if sys.byteorder == "little":
        values.byteswap()
    return pa.Array.from_buffers(
        pa.binary(), n, [None, _fixed_offsets(n, 4), pa.py_buffer(values.tobytes())]
    )


@functools.lru_cache(maxsize=64)
def _fixed_offsets(n: int, width: int) -> pa.Buffer:
    """The offsets of n values of `width` bytes each (0, width, 2 width, ...), kept per
    (n, width): a batch of BATCH_ROWS rows asks for the same ones 4 times, and every batch
    of an import for the same ones again (building them is a Python int per row)."""
    return pa.py_buffer(little_endian(array("i", range(0, width * n + 1, width))))


def _sha256_each(data: bytes, bounds: list[int]) -> bytes:
    """The SHA-256 digests of data[bounds[i]:bounds[i + 1]] for every i, joined (32 bytes
    each). The one per-row Python loop of an import's range writing (two per entry: the
    identity's and the path's): a slice and a hash per row, nothing else."""
    sha256 = hashlib.sha256
    return b"".join([sha256(data[a:b]).digest() for a, b in zip(bounds, bounds[1:], strict=False)])


def identities(batch: pa.RecordBatch) -> pa.Array:
    """entry_identity of every row (fixed_size_binary(32)). Rows without metadata (every
    imported object) are framed by Arrow kernels and hashed in one loop over the buffers;
    a batch with metadata goes row by row through entry_identity itself."""
    n = batch.num_rows
    metadata = batch.column("metadata")
    if len(metadata.keys):
        return _identities_by_row(batch)
    fields = [
        batch.column("physical_address").cast(pa.binary()),
        batch.column("size_bytes").cast(pa.string()).cast(pa.binary()),
        batch.column("checksum").cast(pa.binary()),
        batch.column("content_type").cast(pa.binary()),
    ]
    parts: list[pa.Array] = []
    for field in fields:
        parts.append(_length_prefixes(pc.binary_length(field)))
        parts.append(field)
    # The separator an array, not b"": converting a Python scalar imports pandas (as pa.array).
    empty = pa.Array.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(bytes(4 * (n + 1))), pa.py_buffer(b"")]
    )
    frames = pc.binary_join_element_wise(*parts, empty)
    digests = _sha256_each(*_values(frames))
    return pa.Array.from_buffers(IDENTITY_TYPE, n, [None, pa.py_buffer(digests)])


def _identities_by_row(batch: pa.RecordBatch) -> pa.Array:
    rows = zip(
        batch.column("physical_address").to_pylist(),
        batch.column("size_bytes").to_pylist(),
        batch.column("checksum").to_pylist(),
        batch.column("content_type").to_pylist(),
        batch.column("metadata").to_pylist(),
        strict=True,
    )
    out = []
    for address, size, checksum, content_type, pairs in rows:
        keys = [key for key, _ in pairs]
        if any(a >= b for a, b in zip(keys, keys[1:], strict=False)):
            # Stored as sent: only the canonical order (Entry's) gives one file per content.
            raise errors.InvalidArgument(
                "entry_columns: metadata keys must be unique and sorted in each row"
            )
        out.append(entry_identity(address, size, checksum, content_type, pairs))
    return pa.array(out, IDENTITY_TYPE)


def boundaries(paths: pa.Array, target_entries: int) -> list[int]:
    """Rows i after which a range ends: format.is_boundary(path_i), without a str per row:
    the digests joined, and each one's first 8 bytes (big-endian) read as one array."""
    heads = array("Q")
    heads.frombytes(_sha256_each(*_values(paths)))
    heads = heads[::4]  # the first of each digest's four 8-byte words
    if sys.byteorder == "little":
        heads.byteswap()
    return [i for i, head in enumerate(heads) if head % target_entries == 0]


def range_table(batch: pa.RecordBatch) -> pa.Table:
    """The batch's rows as range rows (RANGE_SCHEMA): its columns and their identities."""
    return pa.Table.from_arrays([*batch.columns, identities(batch)], schema=RANGE_SCHEMA)


def first_unsorted(paths: pa.Array) -> int:
    """The first row i >= 1 whose path is not strictly after row i-1's, or -1. (Arrow
    compares strings by their UTF-8 bytes: code point order, as Python compares str.)"""
    n = len(paths)
    if n < 2:
        return -1
    ascending = pc.greater(paths.slice(1), paths.slice(0, n - 1))
    if pc.all(ascending).as_py():
        return -1
    return pc.index(ascending, False).as_py() + 1


__all__ = [
    "BATCH_BYTES",
    "BATCH_ROWS",
    "ENTRY_COLUMNS_SCHEMA",
    "EntryColumns",
    "boundaries",
    "check_batch",
    "decode_batches",
    "encode_batch",
    "entry_batches",
    "first_unsorted",
    "identities",
    "range_table",
]
