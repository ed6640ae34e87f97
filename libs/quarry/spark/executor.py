"""The part of a Quarry Spark write that runs inside executors: each task writes its rows
as data files into the repository's storage namespace and stages their entries on the
job's ephemeral branch through the BranchManager stubs (PutObjects streams of up to 100
entries; one channel per executor process).

Idempotence under task retries and speculative execution:
- the object PATH of a file depends only on (job, Spark partition, file index within the
  task, and its rows' partition folder with partition_by), so every attempt of a task
  stages the same paths: the last attempt's entry replaces an earlier one, never adds a
  second;
- the physical file KEY also names the task attempt (Spark's unique task attempt id), so
  two attempts never write the same file (a slower attempt cannot overwrite bytes another
  attempt's entry points to);
- a file is written completely, and made durable, before its entry is staged, so no entry
  points at a partial or lost file (a batch's files are synced together, just before the
  batch is staged). Files of attempts whose entries lost are unreferenced and left to
  `quarry gc`;
- an attempt that failed, or a speculative attempt that lost (and may still be running),
  can stage entries the successful attempts did not report: the driver makes the committed
  files exactly the reported ones (quarry.spark.writer).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import io
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

# Spark's writer's key shapes are the layout's (re-exported for quarry.spark.native/writer).
from quarry.blob.layout import JOB_FILE_EXTENSIONS, job_file_key
from quarry.blob.layout import JOB_FILE_KEY as JOB_FILE_KEY
from quarry.blob.layout import SPARK_PARTITION_COLUMN as SPARK_PARTITION_COLUMN
from quarry.blob.layout import SPARK_WRITER_FILE_NAME as SPARK_WRITER_FILE_NAME
from quarry.spark.common import Connection, client_for

if TYPE_CHECKING:
    from quarry.v1 import types_pb2

FORMATS = {
    # format: (file extension (the layout's, quarry.blob.layout), content type)
    "parquet": (JOB_FILE_EXTENSIONS["parquet"], "application/vnd.apache.parquet"),
    "csv": (JOB_FILE_EXTENSIONS["csv"], "text/csv"),
    "json": (JOB_FILE_EXTENSIONS["json"], "application/x-ndjson"),
}

# One row per file a task wrote: the staged entry's fields (the driver rebuilds the exact
# entry from them, see file_entry) and the row count.
RESULT_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("physical_address", pa.string(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("mtime_us", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
    ]
)


@dataclass(frozen=True)
class WriteSpec:
    """Everything a write task needs (pickled into the task closure)."""

    connection: Connection
    repository: str
    branch: str  # the ephemeral branch
    storage_namespace: str
    prefix: str  # folder of the written files in the repository ("tables/t1/")
    job_id: str
    format: str = "parquet"
    max_records_per_file: int = 0  # 0 = one file per task
    trace_carrier: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)  # added to every file's entry
    # Entries are staged as files are written, this many per PutObjects stream, so a task
    # writing many files holds few entries and its progress is visible on the branch.
    stage_batch_files: int = 100
    # Columns whose values make Hive-style folders (`k=v/`) under the prefix.
    partition_by: tuple = ()


def job_path_prefix(spec: WriteSpec) -> str:
    """The longest prefix of every object path this job writes (a partitioned write puts
    its files in folders under the write's prefix)."""
    return spec.prefix if spec.partition_by else f"{spec.prefix}part-{spec.job_id}-"


def object_path(spec: WriteSpec, partition: int, index: int, folder: str = "") -> str:
    """`folder` is the Hive partition folder ("k=v/") of a partitioned write."""
    extension = FORMATS[spec.format][0]
    return f"{spec.prefix}{folder}part-{spec.job_id}-{partition:05d}-c{index:03d}.{extension}"


def is_job_file(spec: WriteSpec, path: str) -> bool:
    return path.rsplit("/", 1)[-1].startswith(f"part-{spec.job_id}-")


# Hive's escaping of partition values in folder names (and its name for null).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_HIVE_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^")


def partition_value_text(value: Any) -> str:
    """A partition column value as Hive writes it in a folder name."""
    if value is None:
        return HIVE_NULL
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, _dt.datetime):
        text = value.isoformat(sep=" ")
    elif isinstance(value, _dt.date):
        text = value.isoformat()
    else:
        text = str(value)
    if text == "":
        return HIVE_NULL
    return hive_escape(text)


def hive_escape(text: str) -> str:
    """A partition column's name or value as Hive (and Spark) write it in a folder name:
    `/`, `=`, `%` and the like percent-encoded (a column `a/b` made a folder `a/b=x/`)."""
    return "".join(f"%{ord(c):02X}" if c in _HIVE_ESCAPED or ord(c) < 0x20 else c for c in text)


def _partitions(table: pa.Table, columns: tuple) -> Iterator[tuple[str, pa.Table]]:
    """(folder, rows) for every distinct combination of the partition columns' values, in
    folder order. The columns stay in the data: files are self-describing, so reading them
    back (whatever folder they sit in) gives the partition columns too."""
    import pyarrow.compute as pc

    keys = table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist()
    found = []
    for key in keys:
        folder = "".join(
            f"{hive_escape(name)}={partition_value_text(key[name])}/" for name in columns
        )
        mask = None
        for name in columns:
            value = key[name]
            column = table.column(name)
            if value is None:
                test = pc.is_null(column)
            elif isinstance(value, float) and value != value:
                test = pc.fill_null(pc.is_nan(column), False)
            else:
                test = pc.fill_null(pc.equal(column, pa.scalar(value, column.type)), False)
            mask = test if mask is None else pc.and_(mask, test)
        found.append((folder, table.filter(mask)))
    if sum(rows.num_rows for _folder, rows in found) != table.num_rows:
        raise ValueError(f"partitioning by {list(columns)} did not place every row once")
    found.sort(key=lambda item: item[0])
    return iter(found)


def _files(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[str, pa.Table]]:
    """(folder, table) of every file a task writes, in order."""
    if not spec.partition_by:
        for table in _tables(batches, spec.max_records_per_file):
            yield "", table
        return
    # Grouping needs the task's rows at once (one Spark partition).
    received = list(batches)
    if not received:
        return
    whole = pa.Table.from_batches(received)
    for folder, rows in _partitions(whole, spec.partition_by):
        for table in _tables(iter(rows.to_batches()), spec.max_records_per_file):
            yield folder, table


def file_entry(spec: WriteSpec, row: dict) -> types_pb2.Entry:
    """The entry staged for a written file, from its result row (executor and driver)."""
    from quarry.client import make_entry

    metadata = {**spec.metadata, "quarry.spark.rows": str(row["rows"])}
    return make_entry(
        row["path"],
        physical_address=row["physical_address"],
        size_bytes=row["size_bytes"],
        checksum=row["checksum"],
        mtime=row["mtime_us"] / 1e6,
        content_type=FORMATS[spec.format][1],
        metadata=metadata,
    )


def file_key(spec: WriteSpec, partition: int, index: int, task_attempt_id: int) -> str:
    """`task_attempt_id` is unique per task attempt in the Spark application."""
    return job_file_key(spec.job_id, spec.format, partition, index, task_attempt_id)


def encode_file(table: pa.Table, fmt: str) -> bytes:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="snappy")
        return sink.getvalue().to_pybytes()
    if fmt == "csv":
        import pyarrow.csv as pcsv

        sink = pa.BufferOutputStream()
        pcsv.write_csv(table, sink)
        return sink.getvalue().to_pybytes()
    if fmt == "json":
        out = io.StringIO()
        for row in table.to_pylist():
            out.write(json.dumps(row, default=_json_value, ensure_ascii=False))
            out.write("\n")
        return out.getvalue().encode()
    raise ValueError(f"unsupported format {fmt!r}")


def _json_value(value: Any) -> str:
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        import base64

        return base64.b64encode(value).decode()
    return str(value)


def _tables(batches: Iterator[pa.RecordBatch], max_rows: int) -> Iterator[pa.Table]:
    """The task's rows as tables of at most `max_rows` rows (all of them when 0)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = batch.num_rows if not max_rows else min(batch.num_rows, max_rows - count)
            pending.append(batch.slice(0, take))
            count += take
            batch = batch.slice(take)
            if max_rows and count >= max_rows:
                yield pa.Table.from_batches(pending)
                pending, count = [], 0
    if count:
        yield pa.Table.from_batches(pending)


def write_task(spec: WriteSpec) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function given to DataFrame.mapInArrow for a write."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None  # this runs in a Spark task
        partition = context.partitionId()
        with _task_span(spec, partition, context.attemptNumber()):
            rows = _write_and_stage(spec, batches, partition, context.taskAttemptId())
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=RESULT_SCHEMA)

    return run


def _write_and_stage(
    spec: WriteSpec, batches: Iterator[pa.RecordBatch], partition: int, task_attempt_id: int
) -> list[dict]:
    from quarry.blob import object_address, open_blob_store

    store = open_blob_store(spec.storage_namespace, spec.connection)
    client = client_for(spec.connection)
    entries: list[types_pb2.Entry] = []
    rows: list[dict] = []

    def stage() -> None:
        # Durable first (one parallel sync for the whole batch instead of two fsyncs per
        # file): an entry must never outlive, across a crash, the file it points to.
        store.sync()
        client.put_objects(spec.repository, spec.branch, entries)

    try:
        for index, (folder, table) in enumerate(_files(spec, batches)):
            data = encode_file(table, spec.format)
            key = file_key(spec, partition, index, task_attempt_id)
            if not store.put_deferred(key, data):
                # Keys are unique per task attempt: an existing one is not this file.
                raise FileExistsError(f"{key} already exists in {spec.storage_namespace}")
            row = {
                "path": object_path(spec, partition, index, folder),
                "physical_address": object_address(spec.storage_namespace, key),
                "size_bytes": len(data),
                "checksum": hashlib.sha256(data).hexdigest(),
                "mtime_us": int(_dt.datetime.now(_dt.UTC).timestamp() * 1e6),
                "rows": table.num_rows,
                "partition": partition,
            }
            rows.append(row)
            entries.append(file_entry(spec, row))
            if len(entries) >= spec.stage_batch_files:
                stage()
                entries = []
        if entries:
            stage()
    finally:
        store.close()
    return rows


@contextlib.contextmanager
def _task_span(spec: WriteSpec, partition: int, attempt: int) -> Iterator[None]:
    """A span for the task, child of the driver's write span when the driver sent its trace
    context; nothing at all when it did not."""
    if not spec.trace_carrier:
        yield
        return
    from opentelemetry.propagate import extract

    from quarry import telemetry

    telemetry.enable_propagation("spark-executor")
    with telemetry.tracer("quarry.spark").start_as_current_span(
        "quarry.spark.write_task",
        context=extract(spec.trace_carrier),
        attributes={
            "quarry.repository": spec.repository,
            "quarry.spark.job": spec.job_id,
            "quarry.spark.partition": partition,
            "quarry.spark.attempt": attempt,
        },
    ):
        yield
