"""The executor side of Spark writes that runs without Spark (quarry.spark.executor):
splitting rows into files, naming them, encoding them."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import io
import json

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from quarry.graveler.names import check_path
from quarry.spark.common import JOB_DATA_PREFIX, Connection
from quarry.spark.executor import (
    FORMATS,
    HIVE_NULL,
    WriteSpec,
    _files,
    _partitions,
    _tables,
    encode_file,
    file_entry,
    file_key,
    job_path_prefix,
    object_path,
    partition_value_text,
)

UTC = dt.UTC
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def batch(start: int, count: int) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    return pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)


def batches(*sizes: int) -> list[pa.RecordBatch]:
    out, start = [], 0
    for size in sizes:
        out.append(batch(start, size))
        start += size
    return out


def split(sizes, max_rows) -> list[pa.Table]:
    return list(_tables(iter(batches(*sizes)), max_rows))


def ids(tables) -> list[int]:
    return [i for t in tables for i in t.column("id").to_pylist()]


# --- _tables -------------------------------------------------------------------------------


def test_no_limit_gives_one_table_with_every_row():
    tables = split([3, 5, 2], 0)
    assert [t.num_rows for t in tables] == [10]
    assert ids(tables) == list(range(10))
    assert tables[0].schema == SCHEMA


def test_small_batches_are_combined_up_to_the_limit():
    tables = split([2, 2, 2], 3)
    assert [t.num_rows for t in tables] == [3, 3]
    assert ids(tables) == list(range(6))


def test_a_batch_larger_than_the_limit_is_split():
    tables = split([7], 3)
    assert [t.num_rows for t in tables] == [3, 3, 1]
    assert [t.column("id").to_pylist() for t in tables] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [t.column("name").to_pylist() for t in tables][-1] == ["n6"]


def test_exact_multiple_leaves_no_empty_table():
    tables = split([4, 2], 3)
    assert [t.num_rows for t in tables] == [3, 3]


def test_limit_of_one():
    tables = split([3, 1], 1)
    assert [t.num_rows for t in tables] == [1, 1, 1, 1]
    assert ids(tables) == [0, 1, 2, 3]


@pytest.mark.parametrize("max_rows", [0, 1, 3])
def test_no_rows_gives_no_tables(max_rows):
    assert split([], max_rows) == []
    assert split([0, 0], max_rows) == []


def test_empty_batches_are_skipped():
    tables = split([0, 2, 0, 0, 2, 0], 3)
    assert [t.num_rows for t in tables] == [3, 1]
    assert ids(tables) == [0, 1, 2, 3]
    assert all(t.num_rows for t in split([0, 2, 0], 0))


@pytest.mark.parametrize(
    "sizes", [[1], [5], [1, 1, 1, 1, 1], [10, 3, 0, 7], [2, 9, 4, 1, 6], [100], [0, 33, 0, 34]]
)
@pytest.mark.parametrize("max_rows", [0, 1, 2, 3, 5, 7, 10, 1000])
def test_split_properties(sizes, max_rows):
    tables = split(sizes, max_rows)
    total = sum(sizes)
    assert ids(tables) == list(range(total))  # every row once, in order
    assert all(t.num_rows > 0 for t in tables)
    assert all(t.schema == SCHEMA for t in tables)
    if max_rows:
        # Every table full except the last one.
        assert all(t.num_rows == max_rows for t in tables[:-1])
        assert 0 < tables[-1].num_rows <= max_rows
        assert len(tables) == -(-total // max_rows)
    else:
        assert len(tables) == 1


def test_tables_are_yielded_as_soon_as_full():
    """A full table is produced before the following batches are consumed."""
    consumed = []

    def source():
        for b in batches(3, 3, 3):
            consumed.append(b.num_rows)
            yield b

    it = _tables(source(), 3)
    first = next(it)
    assert first.num_rows == 3 and len(consumed) == 1
    assert [t.num_rows for t in it] == [3, 3]


# --- object paths and file keys ------------------------------------------------------------


def spec(**changes) -> WriteSpec:
    base = WriteSpec(
        Connection("bm:1", "committer:2"),
        "lake",
        "_quarry-spark-x",
        "s3://bucket/ns",
        "tables/t1/",
        "20240305T070809-0123456789ab",
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_object_path_is_deterministic_and_under_the_prefix(fmt):
    s = spec(format=fmt)
    path = object_path(s, 3, 7)
    assert path == object_path(spec(format=fmt), 3, 7)
    assert path.startswith("tables/t1/")
    assert "/" not in path[len("tables/t1/") :]
    assert s.job_id in path
    assert path.endswith("." + FORMATS[fmt][0])
    assert check_path(path) == path


def test_object_paths_differ_per_partition_index_and_job():
    s = spec()
    paths = {object_path(s, p, i) for p in range(4) for i in range(4)}
    assert len(paths) == 16
    assert object_path(s, 0, 0) != object_path(spec(job_id="other-job"), 0, 0)


def test_object_paths_sort_by_partition_then_index():
    s = spec()
    keys = [(p, i) for p in (0, 2, 10, 11, 100, 9999) for i in (0, 1, 9, 10, 99)]
    assert sorted(keys, key=lambda k: object_path(s, *k)) == keys


def test_object_path_at_the_root():
    s = spec(prefix="")
    path = object_path(s, 0, 0)
    assert path.startswith(f"part-{s.job_id}-00000-")
    assert not path.startswith("/")


def test_every_object_path_of_a_job_shares_the_job_prefix_and_no_other_job_does():
    s, other = spec(), spec(job_id="20261126T000000-ffffffffffff")
    assert all(
        object_path(s, p, i).startswith(job_path_prefix(s)) for p in range(3) for i in range(3)
    )
    assert not object_path(other, 0, 0).startswith(job_path_prefix(s))


def test_file_entry_is_what_the_driver_rebuilds_from_the_result_row():
    s = spec()
    row = {
        "path": object_path(s, 0, 0),
        "physical_address": "/ns/data/x",
        "size_bytes": 10,
        "checksum": "abc",
        "mtime_us": 1_700_000_000_123_456,
        "rows": 7,
        "partition": 0,
    }
    entry = file_entry(s, row)
    assert (entry.path, entry.physical_address, entry.size_bytes, entry.checksum) == (
        row["path"],
        "/ns/data/x",
        10,
        "abc",
    )
    assert entry.mtime.ToMicroseconds() == row["mtime_us"]
    assert entry.metadata["quarry.spark.rows"] == "7"
    assert entry.content_type == "application/vnd.apache.parquet"
    assert file_entry(s, dict(row)) == entry


def test_file_key_differs_per_task_attempt():
    s = spec()
    assert file_key(s, 1, 2, 100) == file_key(s, 1, 2, 100)
    assert file_key(s, 1, 2, 100) != file_key(s, 1, 2, 101)
    # The object path stays the same for every attempt.
    assert object_path(s, 1, 2) == object_path(s, 1, 2)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_file_key_is_in_the_job_folder(fmt):
    s = spec(format=fmt)
    key = file_key(s, 4, 5, 42)
    assert key.startswith(f"{JOB_DATA_PREFIX}{s.job_id}/")
    assert key.endswith("." + FORMATS[fmt][0])
    assert not key.startswith("tables/")  # physical keys are not under the logical prefix


def test_file_keys_differ_per_partition_index_attempt_and_job():
    s = spec()
    keys = {file_key(s, p, i, t) for p in range(3) for i in range(3) for t in range(3)}
    assert len(keys) == 27
    assert file_key(s, 0, 0, 0) != file_key(spec(job_id="other-job"), 0, 0, 0)


# --- encode_file ---------------------------------------------------------------------------


def sample() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "name": pa.array(["plain", 'comma, "quote"', None], pa.string()),
            "score": pa.array([1.5, None, -2.25], pa.float64()),
            "flag": pa.array([True, False, None], pa.bool_()),
            "at": pa.array(
                [
                    dt.datetime(2024, 3, 5, 7, 8, 9, tzinfo=UTC),
                    dt.datetime(2000, 1, 1, tzinfo=UTC),
                    None,
                ],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def test_encode_parquet_round_trip():
    table = sample()
    data = encode_file(table, "parquet")
    assert data[:4] == b"PAR1" and data[-4:] == b"PAR1"
    back = pq.read_table(pa.BufferReader(data))
    assert back.schema.equals(table.schema)
    assert back.to_pylist() == table.to_pylist()
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    assert meta.num_rows == 3
    assert meta.row_group(0).column(0).compression == "SNAPPY"


def test_encode_csv_round_trip():
    table = sample().select(["id", "name", "score", "flag"])
    data = encode_file(table, "csv")
    assert data.splitlines()[0].decode() == '"id","name","score","flag"'
    back = pcsv.read_csv(pa.BufferReader(data))
    assert back.column_names == ["id", "name", "score", "flag"]
    assert back.column("id").to_pylist() == [1, 2, 3]
    assert back.column("name").to_pylist()[:2] == ["plain", 'comma, "quote"']
    assert back.column("score").to_pylist() == [1.5, None, -2.25]
    assert back.column("flag").to_pylist() == [True, False, None]


def test_encode_csv_timestamps():
    table = sample().select(["id", "at"])
    back = pcsv.read_csv(pa.BufferReader(encode_file(table, "csv")))
    assert pa.types.is_timestamp(back.schema.field("at").type)
    assert [v and v.astimezone(UTC) for v in back.column("at").to_pylist()] == table.column(
        "at"
    ).to_pylist()


def json_rows(data: bytes) -> list[dict]:
    text = data.decode("utf-8")
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_encode_json_lines():
    table = sample()
    rows = json_rows(encode_file(table, "json"))
    assert rows == [
        {"id": 1, "name": "plain", "score": 1.5, "flag": True, "at": "2024-03-05T07:08:09+00:00"},
        {
            "id": 2,
            "name": 'comma, "quote"',
            "score": None,
            "flag": False,
            "at": "2000-01-01T00:00:00+00:00",
        },
        {"id": 3, "name": None, "score": -2.25, "flag": None, "at": None},
    ]
    for row in rows[:2]:
        assert dt.datetime.fromisoformat(row["at"]).tzinfo is not None


def test_encode_json_other_types():
    table = pa.table(
        {
            "day": pa.array([dt.date(2024, 2, 29)], pa.date32()),
            "naive": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6)], pa.timestamp("us")),
            "blob": pa.array([b"\x00\xffab"], pa.binary()),
            "text": pa.array(["café ✓"], pa.string()),
            "items": pa.array([[1, 2]], pa.list_(pa.int32())),
            "nested": pa.array(
                [{"a": 1, "b": "x"}], pa.struct([("a", pa.int32()), ("b", pa.string())])
            ),
        }
    )
    data = encode_file(table, "json")
    assert "café ✓".encode() in data  # UTF-8, not \u escapes
    (row,) = json_rows(data)
    assert row == {
        "day": "2024-02-29",
        "naive": "2024-01-02T03:04:05.000006",
        "blob": base64.b64encode(b"\x00\xffab").decode(),
        "text": "café ✓",
        "items": [1, 2],
        "nested": {"a": 1, "b": "x"},
    }


def test_encode_json_one_line_per_row():
    table = pa.table({"s": ["line\nbreak", "tab\t", ""]})
    data = encode_file(table, "json")
    assert data.count(b"\n") == 3
    assert [r["s"] for r in json_rows(data)] == ["line\nbreak", "tab\t", ""]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_encode_empty_table(fmt):
    table = sample().slice(0, 0)
    data = encode_file(table, fmt)
    if fmt == "json":
        assert data == b""
    elif fmt == "csv":
        assert pcsv.read_csv(io.BytesIO(data)).num_rows == 0
    else:
        assert pq.read_table(pa.BufferReader(data)).num_rows == 0


@pytest.mark.parametrize("fmt", ["avro", "orc", "PARQUET", "snappy.parquet", ""])
def test_unsupported_format(fmt):
    with pytest.raises(ValueError, match="unsupported format"):
        encode_file(sample(), fmt)


# ---- partition_by -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (None, HIVE_NULL),
        ("", HIVE_NULL),
        (3, "3"),
        (True, "true"),
        ("plain", "plain"),
        ("a/b", "a%2Fb"),
        ("k=v", "k%3Dv"),
        ("50%", "50%25"),
        ("tab\there", "tab%09here"),
        ("what?#", "what%3F%23"),
        ("spaces stay", "spaces stay"),
        ("é", "é"),
        (dt.date(2026, 11, 26), "2026-11-26"),
        (dt.datetime(2026, 11, 26, 1, 2, 3), "2026-11-26 01%3A02%3A03"),
    ],
)
def test_partition_values_are_written_as_hive_does(value, text):
    assert partition_value_text(value) == text


def test_partitions_place_every_row_once_in_its_folder_in_folder_order():
    table = pa.table(
        {
            "k": pa.array([2, 1, None, 1, 2], pa.int64()),
            "s": pa.array(["x", "a/b", "x", "a/b", "y"]),
            "v": pa.array([1.0, float("nan"), 3.0, float("nan"), 5.0]),
        }
    )
    got = [
        (folder, rows.column("k").to_pylist()) for folder, rows in _partitions(table, ("k", "s"))
    ]
    assert got == [
        ("k=1/s=a%2Fb/", [1, 1]),
        ("k=2/s=x/", [2]),
        ("k=2/s=y/", [2]),
        (f"k={HIVE_NULL}/s=x/", [None]),
    ]
    by_v = {folder: rows.num_rows for folder, rows in _partitions(table, ("v",))}
    assert by_v == {"v=1.0/": 1, "v=3.0/": 1, "v=5.0/": 1, "v=nan/": 2}
    # The partition columns stay in the data.
    assert all(rows.column_names == ["k", "s", "v"] for _f, rows in _partitions(table, ("k",)))


def test_files_of_a_partitioned_task_split_each_folder_by_max_records():
    table = pa.table(
        {"k": pa.array([i % 2 for i in range(7)], pa.int64()), "x": pa.array(range(7), pa.int64())}
    )
    spec = WriteSpec(
        Connection("a:1", "b:2"),
        "r",
        "b",
        "/ns",
        "t/",
        "job",
        max_records_per_file=2,
        partition_by=("k",),
    )
    files = [
        (folder, t.column("x").to_pylist())
        for folder, t in _files(spec, iter(table.to_batches(max_chunksize=3)))
    ]
    assert files == [("k=0/", [0, 2]), ("k=0/", [4, 6]), ("k=1/", [1, 3]), ("k=1/", [5])]
    assert list(_files(spec, iter([]))) == []
    assert object_path(spec, 3, 1, "k=0/") == "t/k=0/part-job-00003-c001.snappy.parquet"
