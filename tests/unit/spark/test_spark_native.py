"""The parts of Spark's-writer path (quarry.spark.native) that run without Spark: describing
a committed file from its bytes, and naming the files as the Python path names them."""

from __future__ import annotations

import hashlib
import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from quarry.retention import classify
from quarry.spark.common import JOB_DATA_PREFIX, Connection, new_job_id
from quarry.spark.executor import WriteSpec, object_path
from quarry.spark.native import _name_files, describe_file, describe_files


def spec(root: str, partition_by: tuple = ()) -> WriteSpec:
    return WriteSpec(
        Connection("a:1", "b:2"), "repo", "br", root, "t/", new_job_id(), partition_by=partition_by
    )


def spark_file(root: str, s: WriteSpec, relative: str, rows: int) -> str:
    """A Parquet file where Spark's writer puts it; its key."""
    key = f"{JOB_DATA_PREFIX}{s.job_id}/{relative}"
    path = os.path.join(root, *key.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.table({"id": list(range(rows))}), path)
    return key


def test_a_committed_file_is_described_from_its_bytes(tmp_path):
    root = str(tmp_path)
    s = spec(root, ("k", "g"))
    write = uuid.uuid4()
    key = spark_file(
        root,
        s,
        f"__quarry_partition_0=1/__quarry_partition_1=a%2Fb/part-00003-{write}.c002.snappy.parquet",
        7,
    )
    row = describe_file(s, root, key)
    data = (tmp_path / key).read_bytes()
    assert row["size_bytes"] == len(data) and row["checksum"] == hashlib.sha256(data).hexdigest()
    assert row["rows"] == 7 and row["partition"] == 3 and row["counter"] == 2
    assert row["folder"] == "k=1/g=a%2Fb/"  # the real column names, Spark's value text
    assert row["physical_address"] == f"{root}/{key}"
    assert classify(key).kind == "data"


def test_files_are_named_in_the_order_the_python_path_writes_them():
    s = spec("/ns", ("k",))
    rows = [
        {"partition": 1, "folder": "k=b/", "counter": 0, "key": "x", "rows": 1},
        {"partition": 1, "folder": "k=a/", "counter": 1, "key": "x", "rows": 1},
        {"partition": 1, "folder": "k=a/", "counter": 0, "key": "x", "rows": 1},
        {"partition": 0, "folder": "k=b/", "counter": 0, "key": "x", "rows": 1},
    ]
    named = _name_files(s, rows)
    assert [r["path"] for r in named] == [
        object_path(s, 0, 0, "k=b/"),
        object_path(s, 1, 0, "k=a/"),
        object_path(s, 1, 1, "k=a/"),
        object_path(s, 1, 2, "k=b/"),
    ]
    assert not {"folder", "counter", "key"} & {k for r in named for k in r}


def test_describing_deletes_protocol_leftovers_and_empty_files_only(tmp_path):
    """Never deletes a file of another shape than Quarry's: a foreign file in the job's
    folder stays, and is no entry either."""
    root = str(tmp_path)
    s = spec(root)
    write = uuid.uuid4()
    kept = spark_file(root, s, f"part-00000-{write}-c000.snappy.parquet", 5)
    empty = spark_file(root, s, f"part-00001-{write}-c000.snappy.parquet", 0)
    leftover = spark_file(
        root, s, f"_temporary/0/task_2026_0001_m_000002/part-00002-{write}-c000.snappy.parquet", 3
    )
    foreign = spark_file(root, s, "notes/part-00004.parquet", 3)
    rows = describe_files(None, s, root)
    assert [r["physical_address"] for r in rows] == [f"{root}/{kept}"]
    assert rows[0]["path"] == object_path(s, 0, 0) and rows[0]["rows"] == 5
    assert (tmp_path / kept).exists() and (tmp_path / foreign).exists()
    assert not (tmp_path / empty).exists() and not (tmp_path / leftover).exists()
