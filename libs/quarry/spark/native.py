"""The Spark-writer path of `quarry.spark.write`: Spark's own Parquet writer writes the data
files, so the rows never leave the JVM (handing them to Python workers alone costs more
than the whole plain Spark write: docs/performance.md).

1. `df.write.parquet` (mode errorifexists: the folder must be new) writes into the job's own
   folder of the storage namespace, `JOB_DATA_PREFIX<job id>/`, the folder the Python path
   writes into, under Spark's commit protocol (FileOutputCommitter, algorithm 1): task
   attempts write under `_temporary/`, only committed attempts' files are moved into the
   folder when the job commits, and an aborted job deletes `_temporary/`. No `_SUCCESS`
   marker, no `.crc` side files (the raw local file system), no Parquet summary files: the
   folder ends up holding exactly the committed data files.
2. `describe_files` reads each committed file's bytes (not its rows: size, SHA-256, the row
   count from the Parquet footer) and fsyncs it and its folders, so no entry ever outlives
   its file across a crash; on the driver's threads for a few files, in a Spark job on the
   executors for many.
3. The entries go through the writer's common flow (staged exactly, committed, checked,
   merged; on failure the branch and the job's files are deleted).

The object path of a file is the one the Python path gives the same file (_name_files): the
folder of a partitioned write from Spark's own partition folder, the Spark partition and
the file's place among its task's files from Spark's file name. A partitioned write keeps the partition columns in the
files (what `write` promises, unlike Spark): Spark partitions by hidden copies of them,
`__quarry_partition_<i>`, whose folders exist only in the physical keys; the object paths
use the real column names.

Safety: this path writes only inside the job's own folder (Spark refuses an existing one),
and deletes only keys of the shapes it writes there (JOB_FILE_KEY: what GC also collects
once no entry refers to them, so an abandoned job's files, `_temporary/` included, are
cleaned like the Python path's).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from quarry.blob import layout
from quarry.blob.layout import JOB_FILE_KEY, SPARK_COMMITTED_FILE, SPARK_PARTITION_COLUMN
from quarry.blob.local import fsync_directory
from quarry.spark.executor import WriteSpec, hive_escape, object_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("quarry.spark")

# Spark conf that picks the file writer: "auto" (the default: see spark_writes_files),
# "spark" (Spark's writer wherever it can write the files at all, whatever their size) or
# "python" (always the Python workers' writer).
FILE_WRITER_CONF = "spark.quarry.fileWriter"
FILE_WRITERS = ("auto", "spark", "python")
# Below this many rows per file (max_records_per_file), "auto" leaves the files to the
# Python workers: Spark's writer and commit protocol cost ~2.7 ms more per file than they do
# (opening a Parquet writer, two renames; 2,000 files of 10 rows: 7.0 s against 1.7 s),
# Python costs ~1.7 us more per row (1.28M rows in 64 files: 3.7 s against 1.5 s), so they
# break even near 1,600 rows per file (benchmarks/spark_write.py, 3 narrow columns).
SPARK_WRITER_MIN_RECORDS_PER_FILE = 2000
# Describe the files on the executors (one Spark job) rather than on the driver's threads
# from this many files or bytes on (the hashing then spreads over the cluster).
DESCRIBE_ON_EXECUTORS_FILES = 4096
DESCRIBE_ON_EXECUTORS_BYTES = 1 << 30
_DRIVER_THREADS = 16
_HASH_CHUNK_BYTES = 1 << 20

# What Spark's writer is told (write options reach the Hadoop configuration of the job, on
# the driver and in every task): see the module docstring.
_WRITE_OPTIONS = {
    "compression": "snappy",  # the extension FORMATS gives parquet
    "mapreduce.fileoutputcommitter.algorithm.version": "1",  # files move only at job commit
    "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",  # no _SUCCESS
    "parquet.summary.metadata.level": "NONE",  # no _metadata / _common_metadata
    # The raw local file system writes no .crc side files; its own instance (not the
    # cached one of the session) so the setting takes effect.
    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "fs.file.impl.disable.cache": "true",
}
_DEFAULT_COMMIT_PROTOCOL = (
    "org.apache.spark.sql.execution.datasources.SQLHadoopMapReduceCommitProtocol"
)
# Partition column types whose folder text Spark writes exactly as partition_value_text
# does (other types, e.g. timestamps and floats, are written differently: Python path).
_FOLDER_TYPES = (
    "StringType",
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "BooleanType",
    "DateType",
)

# A committed file in the job's folder: (partition folders, Spark partition, file counter).
_COMMITTED = SPARK_COMMITTED_FILE
_FOLDER = re.compile(re.escape(SPARK_PARTITION_COLUMN) + r"(\d+)=([^/]+)/")


def spark_writes_files(  # what the choice depends on, from write's options
    spark: SparkSession,
    df: DataFrame,
    storage_namespace: str,
    format: str,
    partition_by: Sequence[str],
    max_records_per_file: int,
) -> bool:
    """THE choice between the two file writers of `write` (everything after the files are
    written is shared): Spark's writer (this module) where it gives the same result and is
    the faster, the Python workers' writer (quarry.spark.executor) otherwise. Spark's writer
    needs:
    - a local (file://) namespace, which the driver and every executor see at the same
      path: Spark here has no S3 file system (no S3A jars), Python writes S3 itself;
    - Parquet: Spark's CSV and JSON differ from the Python path's bytes (header, nulls,
      dates), and their row counts would need the rows parsed again;
    - partition columns only of the types whose folder names Spark writes exactly as the
      Python path does;
    - Spark's default commit protocol (its file layout is what JOB_FILE_KEY knows);
    and, with "auto", files of at least SPARK_WRITER_MIN_RECORDS_PER_FILE rows (or no
    limit): for many small files the Python workers are the faster.
    `spark.quarry.fileWriter` (FILE_WRITER_CONF) overrides "auto" (benchmarks, tests)."""
    from quarry.blob import parse_storage_namespace

    chosen = (spark.conf.get(FILE_WRITER_CONF, "auto") or "auto").lower()
    if chosen not in FILE_WRITERS:
        from quarry.spark.writer import InvalidWriteOptions

        raise InvalidWriteOptions(
            f"{FILE_WRITER_CONF}={chosen!r} is not one of {', '.join(FILE_WRITERS)}"
        )
    why_not = ""
    kind, root, _prefix = parse_storage_namespace(storage_namespace)
    if chosen == "python":
        why_not = f"{FILE_WRITER_CONF}=python"
    elif kind != "local" or ":" in root:  # Hadoop paths cannot hold a ':'
        why_not = "the storage namespace is not a local directory"
    elif format != "parquet":
        why_not = f"format {format}"
    elif spark.conf.get("spark.sql.sources.commitProtocolClass", _DEFAULT_COMMIT_PROTOCOL) != (
        _DEFAULT_COMMIT_PROTOCOL
    ):
        why_not = "the session's commit protocol is not Spark's default"
    elif chosen == "auto" and 0 < max_records_per_file < SPARK_WRITER_MIN_RECORDS_PER_FILE:
        why_not = f"small files ({max_records_per_file} rows at most)"
    else:
        types = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
        odd = [c for c in partition_by if types.get(c) not in _FOLDER_TYPES]
        if odd:
            why_not = f"partition columns {odd} of types Spark names folders differently"
        elif partition_by and any(c.startswith(SPARK_PARTITION_COLUMN) for c in types):
            why_not = "a column is named like the hidden partition columns"  # never replace it
    if why_not:
        log.debug("Python workers write the files: %s", why_not)
    return not why_not


def write_files(spark: SparkSession, df: DataFrame, spec: WriteSpec) -> list[dict]:
    """Write `df` with Spark's Parquet writer into the job's folder; the result rows of its
    files (executor.RESULT_SCHEMA's fields), files without rows left out and deleted. Never
    writes into a folder that exists (mode errorifexists): the job's folder is new, its own."""
    from pyspark.sql import functions as F

    from quarry.blob import parse_storage_namespace

    _kind, root, _prefix = parse_storage_namespace(spec.storage_namespace)
    frame = df
    hidden = [f"{SPARK_PARTITION_COLUMN}{i}" for i in range(len(spec.partition_by))]
    for name, column in zip(hidden, spec.partition_by, strict=True):
        frame = frame.withColumn(name, F.col(column))
    writer = (
        frame.write.format("parquet")
        .mode("errorifexists")
        .options(**_WRITE_OPTIONS)
        .option("maxRecordsPerFile", spec.max_records_per_file)
    )
    if hidden:
        writer = writer.partitionBy(*hidden)
    writer.save(f"file://{root}/{job_folder(spec)}")
    return describe_files(spark, spec, root)


def job_folder(spec: WriteSpec) -> str:
    return layout.job_folder(spec.job_id)


def describe_files(spark: SparkSession, spec: WriteSpec, root: str) -> list[dict]:
    """The result rows of the committed files in the job's folder (bytes read, never rows).
    Leftovers of Spark's protocol (`_temporary/`) are deleted: they never become entries.
    Never deletes a key of another shape than JOB_FILE_KEY's (a file Quarry did not write
    stays, and is no entry either)."""
    from quarry.blob import open_blob_store

    folder = job_folder(spec) + "/"
    with open_blob_store(spec.storage_namespace, spec.connection) as store:
        listing = list(store.list(folder))
        committed = [o for o in listing if _COMMITTED.fullmatch(o.key[len(folder) :])]
        for other in listing:
            if not _COMMITTED.fullmatch(other.key[len(folder) :]) and JOB_FILE_KEY.fullmatch(
                other.key
            ):
                store.delete(other.key)
        keys = [o.key for o in committed]
        size = sum(o.size for o in committed)
        if len(keys) >= DESCRIBE_ON_EXECUTORS_FILES or size >= DESCRIBE_ON_EXECUTORS_BYTES:
            rows = _describe_on_executors(spark, spec, root, keys)
        else:
            with ThreadPoolExecutor(min(_DRIVER_THREADS, max(1, len(keys)))) as pool:
                rows = list(pool.map(lambda key: describe_file(spec, root, key), keys))
        # The folders' entries (the files' names, the job folder's own) made durable too.
        folders = {os.path.dirname(os.path.join(root, k)) for k in keys}
        ancestor = job_folder(spec)
        while ancestor:  # the job folder and the folders above it Spark may have made
            folders.add(os.path.join(root, *ancestor.split("/")))
            ancestor = ancestor.rpartition("/")[0]
        folders.add(root)
        for directory in sorted(folders):
            fsync_directory(directory)
        empty = [row for row in rows if not row["rows"]]
        for row in empty:  # Spark writes one file without rows for an empty DataFrame
            store.delete(row["key"])
    return _name_files(spec, [row for row in rows if row["rows"]])


def _name_files(spec: WriteSpec, rows: list[dict]) -> list[dict]:
    """Give the files the object paths the Python path gives the same files: per Spark
    partition, the index counts the task's files in the order it writes them (folders in
    order, then Spark's file counter), so both writers name a write's files alike and every
    attempt of a task names its files alike."""
    by_partition: dict[int, list[dict]] = {}
    for row in rows:
        by_partition.setdefault(row["partition"], []).append(row)
    named = []
    for partition, files in sorted(by_partition.items()):
        files.sort(key=lambda row: (row["folder"], row["counter"]))
        for index, row in enumerate(files):
            folder = row.pop("folder")
            del row["key"], row["counter"]
            named.append({"path": object_path(spec, partition, index, folder), **row})
    return named


def describe_file(spec: WriteSpec, root: str, key: str) -> dict:
    """A committed file's result row, from its bytes; the file is fsynced first."""
    import pyarrow.parquet as pq

    from quarry.blob import object_address

    path = os.path.join(root, *key.split("/"))
    # Hashed piece by piece (a data file may be far larger than a worker should hold; up to
    # _DRIVER_THREADS are described at once) and its row count from the footer alone.
    digest, size = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY)
    try:
        with os.fdopen(os.dup(fd), "rb") as fh:
            while chunk := fh.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
                size += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    match = _COMMITTED.fullmatch(key[len(job_folder(spec)) + 1 :])
    if match is None:  # describe_files passes committed files only
        raise ValueError(f"{key} is not a committed file of job {spec.job_id}")
    folders = match["folders"]
    partition, counter = int(match["partition"]), int(match["counter"])
    folder = "".join(
        f"{hive_escape(spec.partition_by[int(index)])}={value}/"
        for index, value in _FOLDER.findall(folders)
    )
    return {
        "key": key,
        "folder": folder,
        "counter": counter,
        "physical_address": object_address(spec.storage_namespace, key),
        "size_bytes": size,
        "checksum": digest.hexdigest(),
        "mtime_us": int(_dt.datetime.now(_dt.UTC).timestamp() * 1e6),
        "rows": pq.read_metadata(path).num_rows,
        "partition": partition,
    }


def _describe_on_executors(
    spark: SparkSession, spec: WriteSpec, root: str, keys: list[str]
) -> list[dict]:
    context = spark.sparkContext
    slices = max(1, min(len(keys) // 64 + 1, context.defaultParallelism * 4))

    def describe(part):  # noqa: ANN001, ANN202 — Spark's mapPartitions callback
        return [describe_file(spec, root, key) for key in part]

    return context.parallelize(keys, slices).mapPartitions(describe).collect()
