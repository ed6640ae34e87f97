"""quarry.spark on a repository whose storage namespace is S3 (a real moto_server): the
executors write data files into the bucket, range files and Parquet data files are read by
executors through the object store (Spark has no S3 connector here), and GC lists, reports
and sweeps the bucket."""

from __future__ import annotations

import datetime as dt
import io

import pyarrow.parquet as pq
import pytest

import quarry.spark as qs
from quarry.blob import open_blob_store
from quarry.retention import RetentionRules
from quarry.spark.gc import collect_garbage
from support.suite import running_suite

pytestmark = pytest.mark.timeout(600)


def test_write_entries_and_gc_on_an_s3_namespace(spark, tmp_path, moto_endpoint, s3_bucket):
    namespace = f"s3://{s3_bucket}/lake/sparky"
    with running_suite(tmp_path, s3_endpoint_url=moto_endpoint) as suite, suite.client() as client:
        client.create_repository("sparky", namespace)
        conn = qs.Connection(
            suite.targets["branch-manager"],
            suite.targets["committer"],
            s3_endpoint_url=moto_endpoint,
        )
        frame = spark.range(0, 300, numPartitions=3).selectExpr("id", "id + 1 as next")
        first = qs.write(frame, "quarry://sparky/main/t", connection=conn)
        qs.write(
            frame.where("id % 3 = 0"), "quarry://sparky/main/t", mode="overwrite", connection=conn
        )

        listed = {e.path: e for e in client.iter_objects("sparky", "main", prefix="t/")}
        rows = {
            r.path: r
            for r in qs.entries(spark, "quarry://sparky/main/t/", connection=conn).collect()
        }
        assert set(rows) == set(listed) and len(rows) == 3
        store = open_blob_store(namespace, conn)
        total = 0
        for entry in listed.values():
            assert entry.physical_address.startswith(namespace + "/data/spark/")
            data = store.get(entry.physical_address[len(namespace) + 1 :])
            assert len(data) == entry.size_bytes
            total += pq.read_table(io.BytesIO(data)).num_rows
        assert total == 100
        back = qs.read(spark, "quarry://sparky/main/t", connection=conn)
        assert sorted(r.id for r in back.collect()) == list(range(0, 300, 3))
        assert back.where("next != id + 1").count() == 0
        assert qs.read(spark, f"quarry://sparky/{first.id}/t", connection=conn).count() == 300
        old = {
            r.path
            for r in qs.entries(spark, f"quarry://sparky/{first.id}/t/", connection=conn).collect()
        }
        assert len(old) == 3 and not old & set(rows)

        later = dt.datetime.now(dt.UTC) + dt.timedelta(days=30)
        report = collect_garbage(
            spark,
            "sparky",
            rules=RetentionRules(7),
            now=later,
            grace=dt.timedelta(0),
            connection=conn,
        )
        assert report.collectable["data"].count == 3  # the first write's files
        swept = collect_garbage(
            spark,
            "sparky",
            rules=RetentionRules(7),
            now=later,
            grace=dt.timedelta(0),
            sweep=True,
            connection=conn,
        )
        assert swept.deleted == report.collectable_count
        for entry in listed.values():  # the head's files are all still there
            assert store.exists(entry.physical_address[len(namespace) + 1 :])
        assert len(list(store.list("data/spark/"))) == 3
        assert qs.entries(spark, "quarry://sparky/main/t/", connection=conn).count() == 3
        # A later file without a column of the first one reads it as null (was a KeyError in
        # a Python worker); a hidden file (`_SUCCESS`) is not read as data.
        wide = spark.range(0, 2).selectExpr("id", "id + 1 as next")
        qs.write(wide, "quarry://sparky/main/w/a", connection=conn)
        qs.write(spark.range(2, 4).selectExpr("id"), "quarry://sparky/main/w/b", connection=conn)
        client.put_object("sparky", "main", path="w/_SUCCESS", physical_address=f"{namespace}/x")
        mixed = qs.read(spark, "quarry://sparky/main/w", connection=conn)
        assert sorted((r.id, r.next) for r in mixed.collect()) == [
            (0, 1),
            (1, 2),
            (2, None),
            (3, None),
        ]
