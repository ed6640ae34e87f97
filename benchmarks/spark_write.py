"""quarry.spark.write through a real local Spark session, against plain Spark writing the
same DataFrame as Parquet to the same disk in the same run (the overhead Quarry adds):

A. N large files (one per partition): rows/s and files/s, Quarry vs plain Spark.
B. many small files (max_records_per_file): files/s = entries staged per second during a
   write, Quarry vs plain Spark with maxRecordsPerFile.
A and B time both of Quarry's file writers (quarry.spark.native.spark_writes_files picks
one, `spark.quarry.fileWriter` forces one): Spark's own (rows stay in the JVM, the driver
describes the committed files; large files on a local namespace) and the Python workers'
(small files, S3, CSV/JSON). The first Quarry row of each is what `write` picks; the
target lines judge that one.
C. staging alone: a Spark job whose tasks only stage synthetic entries (PutObjects from the
   executors' Python workers), against one PutObjects stream of the same entries from the
   driver.

The services run in this process (tests/support/suite.py: kv-gateway on a memory store,
range-writer, branch-manager, committer on loopback gRPC); the executors are Spark's Python
workers, separate processes that reach branch-manager over gRPC. The DataFrames are cached
and materialized first, so generating the rows is in neither timing. Quarry and plain Spark
alternate, one warm-up each, then the median of BENCH_SPARK_ROUNDS.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# benchmarks/kv_gateway.py would shadow the kv_gateway service package the suite imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(HERE.parent / "tests"))
import quarry.spark as qs
from quarry.spark.native import FILE_WRITER_CONF, spark_writes_files
from quarry.spark.session import local_session
from support.suite import running_suite

ROUNDS = int(os.environ.get("BENCH_SPARK_ROUNDS", "3"))
A_FILES = int(os.environ.get("BENCH_SPARK_FILES", "64"))
A_ROWS_PER_FILE = int(os.environ.get("BENCH_SPARK_ROWS_PER_FILE", "20000"))
B_ROWS = int(os.environ.get("BENCH_SPARK_SMALL_ROWS", "20000"))
B_PARTITIONS = 4
B_RECORDS_PER_FILE = int(os.environ.get("BENCH_SPARK_RECORDS_PER_FILE", "10"))
C_TASKS = 4
# Issue 14: Quarry / plain Spark time, at most (large files: target 6; small files: keep).
TARGET_LARGE = 1.3
TARGET_SMALL = 0.17
C_ENTRIES_PER_TASK = int(os.environ.get("BENCH_SPARK_STAGE_ENTRIES", "25000"))


def frame(spark, rows: int, partitions: int):
    df = spark.range(0, rows, numPartitions=partitions).selectExpr(
        "id", "id * 2 as doubled", "concat('row-', cast(id as string)) as label"
    )
    df.cache()
    assert df.count() == rows
    return df


def parquet_files(directory: str) -> int:
    return sum(
        1
        for p in Path(directory).iterdir()
        if p.name.startswith("part-") and p.name.endswith(".parquet")
    )


def side_by_side(*writes) -> list[float]:
    """Alternate the writes: one warm-up each, then ROUNDS each; median seconds of each."""
    times: list[list[float]] = [[] for _ in writes]
    for round_ in range(ROUNDS + 1):
        for fn, spent in zip(writes, times, strict=True):
            start = time.perf_counter()
            fn(round_)
            if round_:  # round 0 is the warm-up
                spent.append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times]


def count_rows(batches):
    """mapInArrow function that only receives the rows: the cost of handing a partition's
    rows from the JVM to a Python worker, which any Python executor code pays."""
    import pyarrow as pa

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pylist([{"n": rows}], schema=pa.schema([("n", pa.int64())]))


def stage_task(conn, repo: str, branch: str, per_task: int):
    """mapInArrow function: each task stages `per_task` synthetic entries from its executor
    and yields how many the server counted."""

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from quarry.spark.common import client_for

        for _ in batches:  # the input rows only decide the partition
            pass
        partition = TaskContext.get().partitionId()
        entries = (
            {
                "path": f"staged/p{partition:03d}/e{i:06d}",
                "physical_address": f"data/staged/p{partition:03d}/{i}",
                "size_bytes": 1000 + i,
            }
            for i in range(per_task)
        )
        count = client_for(conn).put_objects(repo, branch, entries)
        yield pa.RecordBatch.from_pylist([{"n": count}], schema=pa.schema([("n", pa.int64())]))

    return run


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="quarry-bench-spark-"))
    spark = local_session("local[2]", "quarry-bench", **{"spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    started = time.perf_counter()
    try:
        with running_suite(home, auth_enabled=False) as suite, suite.client() as client:
            repo = "bench"
            namespace = suite.namespace(repo)
            client.create_repository(repo, namespace)
            conn = qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])

            def quarry_write(df, name: str, writer: str, max_records_per_file: int = 0):
                """qs.write with `writer` as spark.quarry.fileWriter; the commit."""
                spark.conf.set(FILE_WRITER_CONF, writer)
                try:
                    return qs.write(
                        df,
                        f"quarry://{repo}/main/bench/{name}-{writer}",
                        connection=conn,
                        max_records_per_file=max_records_per_file,
                    )
                finally:
                    spark.conf.unset(FILE_WRITER_CONF)

            def chosen(df, max_records_per_file: int = 0) -> tuple[str, str]:
                """(the writer "auto" picks, the other one) for this write."""
                spark.conf.unset(FILE_WRITER_CONF)
                if spark_writes_files(spark, df, namespace, "parquet", (), max_records_per_file):
                    return "spark", "python"
                return "python", "spark"

            # A: one large file per partition.
            a_rows = A_FILES * A_ROWS_PER_FILE
            big = frame(spark, a_rows, A_FILES)
            a_auto, a_other = chosen(big)

            def quarry_a(i, writer="auto"):
                commit = quarry_write(big, f"a{i}", writer)
                assert int(commit.metadata["quarry.spark.files"]) == A_FILES, commit.metadata
                assert int(commit.metadata["quarry.spark.rows"]) == a_rows, commit.metadata

            def quarry_other_a(i):
                quarry_a(i, a_other)

            def plain_a(i):
                target = f"{namespace}/plain/a{i}"
                big.write.mode("overwrite").parquet(target)
                assert parquet_files(target) == A_FILES

            def python_floor_a(_i):
                counted = big.mapInArrow(count_rows, "n long").collect()
                assert sum(row.n for row in counted) == a_rows

            quarry_a_time, other_a_time, plain_a_time, floor_a_time = side_by_side(
                quarry_a, quarry_other_a, plain_a, python_floor_a
            )
            big.unpersist()

            # B: many small files, one staged entry each.
            b_files = -(-B_ROWS // B_RECORDS_PER_FILE)
            small = frame(spark, B_ROWS, B_PARTITIONS)
            b_auto, b_other = chosen(small, B_RECORDS_PER_FILE)

            def quarry_b(i, writer="auto"):
                commit = quarry_write(small, f"b{i}", writer, B_RECORDS_PER_FILE)
                assert int(commit.metadata["quarry.spark.files"]) == b_files, commit.metadata

            def quarry_other_b(i):
                quarry_b(i, b_other)

            def plain_b(i):
                target = f"{namespace}/plain/b{i}"
                (
                    small.write.mode("overwrite")
                    .option("maxRecordsPerFile", B_RECORDS_PER_FILE)
                    .parquet(target)
                )
                assert parquet_files(target) == b_files

            quarry_b_time, other_b_time, plain_b_time = side_by_side(
                quarry_b, quarry_other_b, plain_b
            )
            small.unpersist()

            # C: staging alone, from the executors vs from the driver.
            c_entries = C_TASKS * C_ENTRIES_PER_TASK
            seeds = spark.range(0, 100_000, numPartitions=C_TASKS)

            def executors_c(i):
                branch = f"stage-executors-{i}"
                client.create_branch(repo, branch, "main")
                start = time.perf_counter()
                counts = seeds.mapInArrow(
                    stage_task(conn, repo, branch, C_ENTRIES_PER_TASK), "n long"
                ).collect()
                elapsed = time.perf_counter() - start
                assert sum(row.n for row in counts) == c_entries, counts
                return elapsed

            def driver_c(i):
                branch = f"stage-driver-{i}"
                client.create_branch(repo, branch, "main")
                entries = (
                    {
                        "path": f"staged/p{k // C_ENTRIES_PER_TASK:03d}/"
                        f"e{k % C_ENTRIES_PER_TASK:06d}",
                        "physical_address": f"data/staged/{k}",
                        "size_bytes": 1000 + k,
                    }
                    for k in range(c_entries)
                )
                start = time.perf_counter()
                count = client.put_objects(repo, branch, entries)
                elapsed = time.perf_counter() - start
                assert count == c_entries, count
                return elapsed

            executor_times, driver_times = [], []
            for round_ in range(ROUNDS + 1):
                e, d = executors_c(round_), driver_c(round_)
                if round_:
                    executor_times.append(e)
                    driver_times.append(d)
            executors_time = statistics.median(executor_times)
            driver_time = statistics.median(driver_times)

        total = time.perf_counter() - started
        print(
            f"  Spark writes on local[2], services in-process (median of {ROUNDS}, "
            f"after one warm-up each; {total:.0f}s in all)"
        )
        print(f"  {'':<40}{'seconds':>9}{'rows/s':>12}{'files/s':>10}{'vs plain':>10}")

        def line(label, seconds, rows, files, baseline):
            print(
                f"  {label:<40}{seconds:>9.2f}{rows / seconds:>12,.0f}"
                f"{files / seconds:>10,.0f}{seconds / baseline:>9.2f}x"
            )

        writers = {"spark": "Spark's writer", "python": "Python workers' writer"}
        a_label = f"{A_FILES} files x {A_ROWS_PER_FILE:,} rows"
        line(f"A {a_label}: plain Spark", plain_a_time, a_rows, A_FILES, plain_a_time)
        line(f"A   Quarry ({writers[a_auto]})", quarry_a_time, a_rows, A_FILES, plain_a_time)
        line(f"A   Quarry, {writers[a_other]}", other_a_time, a_rows, A_FILES, plain_a_time)
        line("A   rows to Python workers only", floor_a_time, a_rows, A_FILES, plain_a_time)
        b_label = f"{b_files:,} files x {B_RECORDS_PER_FILE} rows"
        line(f"B {b_label}: plain Spark", plain_b_time, B_ROWS, b_files, plain_b_time)
        line(f"B   Quarry ({writers[b_auto]})", quarry_b_time, B_ROWS, b_files, plain_b_time)
        line(f"B   Quarry, {writers[b_other]}", other_b_time, B_ROWS, b_files, plain_b_time)
        print(f"  C staging {c_entries:,} synthetic entries (no data files):")
        for label, seconds in (
            (f"from {C_TASKS} executor tasks (one Spark job)", executors_time),
            ("from the driver (one PutObjects call)", driver_time),
        ):
            print(f"    {label:<38}{seconds:>9.2f}{c_entries / seconds:>12,.0f} entries/s")
        print(
            f"  Quarry / plain Spark time, large files: {quarry_a_time / plain_a_time:.2f} "
            f"({writers[a_auto]}, what write picks), {other_a_time / plain_a_time:.2f} "
            f"({writers[a_other]}); handing the rows to Python alone "
            f"{floor_a_time / plain_a_time:.2f}"
        )
        print(
            f"  Quarry / plain Spark time, small files: {quarry_b_time / plain_b_time:.2f} "
            f"({writers[b_auto]}, what write picks), {other_b_time / plain_b_time:.2f} "
            f"({writers[b_other]})"
        )
        for label, ratio, target in (
            ("large files", quarry_a_time / plain_a_time, TARGET_LARGE),
            ("small files", quarry_b_time / plain_b_time, TARGET_SMALL),
        ):
            print(
                f"  {label}: Quarry / plain Spark {ratio:.2f} "
                f"(target <= {target}: {'MET' if ratio <= target else 'MISSED'})"
            )
        print(
            f"  entries staged per second in a write (B): {b_files / quarry_b_time:,.0f}; "
            f"staging alone (C) {c_entries / executors_time:,.0f}/s from the executors = "
            f"{driver_time / executors_time:.2f}x the driver's one stream"
        )
    finally:
        spark.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
