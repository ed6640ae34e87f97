"""Range and metarange files: schema, logical ids, byte accounting."""

from __future__ import annotations

import hashlib
import itertools

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quarry.committed import EMPTY_METARANGE_ID, metarange_key, range_key
from quarry.committed.format import (
    FORMAT_TAG,
    RANGE_FORMAT,
    RANGE_SCHEMA,
    RowBuffer,
    decode_range,
    encode_range,
    entry_bytes,
    is_boundary,
    metarange_id_of,
    range_id_of,
    row_bytes,
)
from quarry.committed.rangedata import CumulativeBytes, RangeData
from quarry.graveler.model import Entry, RangeInfo


def table_of(entries) -> pa.Table:
    rows = RowBuffer()
    for e in entries:
        rows.append(e, len(e.path.encode()))
    return rows.to_table()


def sample_entries(make_entry, n=20):
    return [
        make_entry(f"dir/é{i:03d}", i, metadata={"k" * (i % 4): "v" * i} if i % 3 else {})
        for i in range(n)
    ]


def test_empty_metarange_id_is_fixed():
    # Storage format 3 (two-level metaranges): the id header says v3.
    assert hashlib.sha256(b"quarry/metarange/v3\x00").hexdigest() == EMPTY_METARANGE_ID
    assert metarange_id_of([]) == EMPTY_METARANGE_ID


def test_metarange_id_covers_ids_bounds_and_counts():
    r = RangeInfo("a" * 64, "a", "b", 2, 100)
    base = metarange_id_of([r])
    for other in (
        RangeInfo("b" * 64, "a", "b", 2, 100),
        RangeInfo("a" * 64, "a", "c", 2, 100),
        RangeInfo("a" * 64, "a", "b", 3, 100),
    ):
        assert metarange_id_of([other]) != base
    assert metarange_id_of([r, r]) != base


def test_range_id_is_logical_not_file_bytes(make_entry):
    entries = sample_entries(make_entry)
    table = table_of(entries)
    rid = range_id_of(table)
    # Same content through different Parquet encodings and through slicing/concatenation.
    tagged = table.replace_schema_metadata({FORMAT_TAG: RANGE_FORMAT})
    for compression in ("zstd", "snappy", "none"):
        sink = pa.BufferOutputStream()
        pq.write_table(tagged, sink, compression=compression)
        assert range_id_of(decode_range(sink.getvalue().to_pybytes())) == rid
    big = table_of([make_entry("a/first", 9)] + entries + [make_entry("z/last", 9)])
    assert range_id_of(big.slice(1, len(entries))) == rid
    assert range_id_of(pa.concat_tables([table.slice(0, 7), table.slice(7)])) == rid
    # Every identity-relevant field and the address/mtime change the id.
    changed = [
        entries[:5] + [entries[5].with_path("dir/é005x")] + entries[6:],
        entries[:5]
        + [make_entry("dir/é005", 5, address="elsewhere", metadata=dict(entries[5].metadata))]
        + entries[6:],
        entries[:5]
        + [make_entry("dir/é005", 5, mtime_us=1, metadata=dict(entries[5].metadata))]
        + entries[6:],
        entries[:5]
        + [make_entry("dir/é005", 5, size=1, metadata=dict(entries[5].metadata))]
        + entries[6:],
        entries[:5] + [make_entry("dir/é005", 5, metadata={"other": "x"})] + entries[6:],
        entries[:-1],
    ]
    ids = {range_id_of(table_of(c)) for c in changed}
    assert rid not in ids and len(ids) == len(changed)


def test_range_file_is_plain_parquet_spark_can_read(make_entry, tmp_path):
    entries = sample_entries(make_entry)
    table = table_of(entries)
    path = tmp_path / "r.parquet"
    path.write_bytes(encode_range(table, range_id_of(table)))
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.num_row_groups == 1
    schema = parquet.schema_arrow
    assert schema.field("path").type == pa.string()
    assert schema.field("physical_address").type == pa.string()
    assert schema.field("size_bytes").type == pa.int64()
    assert schema.field("checksum").type == pa.string()
    assert schema.field("mtime").type == pa.timestamp("us", tz="UTC")
    assert schema.field("content_type").type == pa.string()
    assert schema.field("metadata").type == pa.map_(pa.string(), pa.string())
    assert schema.field("identity").type == pa.binary(32)
    # The Parquet-level types Spark maps: INT64 TIMESTAMP(MICROS, UTC), FIXED_LEN_BYTE_ARRAY.
    columns = {
        parquet.schema.column(i).path: parquet.schema.column(i) for i in range(len(parquet.schema))
    }
    assert columns["mtime"].physical_type == "INT64"
    assert "isAdjustedToUTC=true, timeUnit=microseconds" in str(columns["mtime"].logical_type)
    assert columns["mtime"].converted_type == "TIMESTAMP_MICROS"  # what older readers use
    assert columns["identity"].physical_type == "FIXED_LEN_BYTE_ARRAY"
    assert columns["path"].logical_type.type == "STRING"
    read = pq.read_table(path)
    assert read.column("path").to_pylist() == [e.path for e in entries]
    assert read.column("identity").to_pylist() == [e.identity for e in entries]
    assert read.column("mtime").cast(pa.int64()).to_pylist() == [e.mtime_us for e in entries]
    assert [dict(m) for m in read.column("metadata").to_pylist()] == [
        dict(e.metadata) for e in entries
    ]
    assert schema.remove_metadata().equals(RANGE_SCHEMA)


def test_layout_keys():
    assert range_key("ab") == "_quarry/ranges/ab.parquet"
    assert metarange_key("cd") == "_quarry/metaranges/cd.parquet"


def test_byte_accounting_agrees_everywhere(make_entry):
    entries = sample_entries(make_entry, 30) + [
        Entry("ü/€", "адрес", 1, "ß", 0, "тип", {"ключ": "значение", "": ""})
    ]
    entries.sort(key=lambda e: e.path)
    table = table_of(entries)
    expected = [entry_bytes(e) for e in entries]
    assert row_bytes(table).to_pylist() == expected
    cum = CumulativeBytes(table)
    assert [cum[i] for i in range(len(cum))] == [0, *itertools.accumulate(expected)]
    sliced = CumulativeBytes(table.slice(4, 10))
    assert [sliced[i] for i in range(11)] == [0, *itertools.accumulate(expected[4:14])]
    rows = RowBuffer()
    assert [rows.append(e, len(e.path.encode())) for e in entries] == expected


def test_range_data_point_and_full_access_agree(make_entry):
    entries = sample_entries(make_entry)
    table = table_of(entries)
    data = RangeData(
        RangeInfo(range_id_of(table), entries[0].path, entries[-1].path, len(entries), 0), table
    )
    for i, e in enumerate(entries):
        assert data.entry_at(i) == e and data.entry_at(i).identity == e.identity
        assert data.identity(i) == e.identity
    assert [data.entry(i) for i in range(len(entries))] == entries
    assert data.find(entries[3].path) == 3 and data.find("nope") == -1


def test_boundary_is_a_pure_function_of_the_path():
    paths = [f"p/{i}" for i in range(5000)]
    hits = [p for p in paths if is_boundary(p, 64)]
    assert hits == [p for p in paths if is_boundary(p, 64)]
    assert 40 <= len(hits) <= 120  # ~1 in 64
    assert all(is_boundary(p, 1) for p in paths[:10])


def test_decode_rejects_garbage():
    from quarry.committed import RangeCorrupt

    with pytest.raises(RangeCorrupt):
        decode_range(b"not parquet at all")


def test_a_range_written_from_slices_is_one_row_group_any_parquet_reader_reads(
    make_entry, tmp_path
):
    # Ranges rebuilt from slices of others are encoded from a table in chunks: the file
    # is the same plain Parquet (one row group, the same rows), read by pyarrow's own
    # reader (as main's reader and Spark do) with the same id.
    table = table_of(sample_entries(make_entry, 40))
    pieces = pa.concat_tables([table.slice(0, 13), table.slice(13, 1), table.slice(14)])
    assert pieces.column("path").num_chunks == 3
    rid = range_id_of(pieces)
    assert rid == range_id_of(table)
    path = tmp_path / "r.parquet"
    path.write_bytes(encode_range(pieces, rid))
    parquet = pq.ParquetFile(path)
    assert parquet.metadata.num_row_groups == 1
    assert parquet.metadata.metadata[FORMAT_TAG] == RANGE_FORMAT
    plain = parquet.read().replace_schema_metadata(None).combine_chunks()
    assert plain.equals(table)
    assert decode_range(str(path)).equals(table)
