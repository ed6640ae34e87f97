"""Imports and Spark (a real local Spark session, the suite as processes):

* GC never deletes imported objects: they live outside the repository's namespace. The
  session sweeps a repository whose imported objects are referenced only by expired commits
  (the import was replaced by a second one and deleted from the branch), the case where GC
  would collect them if they were Quarry's.
* An imported Parquet dataset reads back through quarry.spark at once (issue 26's "Spark
  read of the destination"), from the source's own files."""

from __future__ import annotations

import datetime as dt

import pytest

import quarry.spark as qs
from quarry.retention import RetentionRules
from quarry.spark.gc import collect_garbage
from quarry.v1 import committer_pb2 as cm
from support.suite import running_suite
from support.wait import wait_until

pytestmark = pytest.mark.timeout(600)


def _import(client, repo, source, path):
    started = client.start_import(repo, "main", [(str(source), path)])

    def done():
        status = client.get_import_status(repo, started.id)
        return status if status.state != cm.IMPORT_STATE_RUNNING else None

    status = wait_until(done, timeout=60, what="the import")
    assert status.state == cm.IMPORT_STATE_COMPLETED, status.error
    return status


def test_gc_sweep_never_deletes_imported_objects(spark, tmp_path):
    first, second = tmp_path / "lake-v1", tmp_path / "lake-v2"
    for root, n in ((first, 30), (second, 5)):
        (root / "part=0").mkdir(parents=True)
        for i in range(n):
            (root / "part=0" / f"f{i:03d}.csv").write_bytes(b"%d\n" % i)
    files = sorted(p for root in (first, second) for p in root.rglob("*") if p.is_file())
    with running_suite(tmp_path / "suite") as suite, suite.client() as client:
        repo = "imported"
        client.create_repository(repo, suite.namespace(repo))
        _import(client, repo, first, "t")
        # The second import owns t/ now: the first one's objects are referenced only by
        # the first import's commit, expired below; then t/ is deleted from the branch.
        _import(client, repo, second, "t")
        client.delete_objects(repo, "main", [o.path for o in client.iter_objects(repo, "main")])
        client.commit(repo, "main", "drop the import")
        connection = qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])
        report = collect_garbage(
            spark,
            repo,
            rules=RetentionRules(1),
            sweep=True,
            now=dt.datetime.now(dt.UTC) + dt.timedelta(days=30),
            grace=dt.timedelta(0),
            connection=connection,
        )
        assert report.commits_expired > 0  # the imports' commits are past retention
    survivors = [p for p in files if p.exists()]
    assert survivors == files, f"GC deleted imported objects: {set(files) - set(survivors)}"


def test_spark_reads_an_imported_parquet_dataset(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lake = tmp_path / "lake" / "events"
    for part, start in (("day=1", 0), ("day=2", 50)):
        (lake / part).mkdir(parents=True)
        ids = list(range(start, start + 50))
        table = pa.table({"id": ids, "user": [f"u{i % 7}" for i in ids]})
        pq.write_table(table, lake / part / "part-0.parquet")
    with running_suite(tmp_path / "suite") as suite, suite.client() as client:
        repo = "imported-parquet"
        client.create_repository(repo, suite.namespace(repo))
        status = _import(client, repo, lake, "tables/events")
        assert status.objects_listed == 2
        connection = qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])
        frame = qs.read(spark, f"quarry://{repo}/main/tables/events", connection=connection)
        assert sorted(row.id for row in frame.select("id").collect()) == list(range(100))
        assert frame.where("user is null").count() == 0
        # Read from the source's files (nothing was copied into the namespace).
        addresses = {e.physical_address for e in client.iter_objects(repo, "main")}
        assert addresses == {str(p) for p in lake.rglob("*.parquet")}


def test_gc_of_a_reused_namespace_never_deletes_what_its_deleted_owner_left(spark, tmp_path):
    """A deleted repository's folder is imported into another repository, then a new
    repository claims that folder (README: a namespace left by a deleted repository may be
    reused). Its GC must not delete the files the deleted repository left -- the other
    repository's entries point at them -- while it still collects its own orphans."""
    import os
    import time

    from quarry.blob import open_blob_store

    with running_suite(tmp_path / "suite") as suite, suite.client() as client:
        namespace = suite.namespace("old")
        client.create_repository("old", namespace)
        with open_blob_store(namespace) as store:
            for i in range(3):
                store.put(f"data/{i:032x}", b"left by old %d" % i)
        # Written an hour before the deletion, as a deleted repository's files are.
        hour_ago = time.time() - 3600
        for i in range(3):
            os.utime(os.path.join(namespace, "data", f"{i:032x}"), (hour_ago, hour_ago))
        client.delete_repository("old")
        client.create_repository("keeper", suite.namespace("keeper"))
        _import(client, "keeper", f"{namespace}/data", "recovered")
        client.create_repository("new", namespace)
        with open_blob_store(namespace) as store:
            store.put("data/" + "f" * 32, b"an orphan of new")
        connection = qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])
        report = collect_garbage(
            spark,
            "new",
            sweep=True,
            now=dt.datetime.now(dt.UTC) + dt.timedelta(days=30),
            grace=dt.timedelta(0),
            connection=connection,
        )
        assert report.objects_inherited >= 3
        assert len(list(client.iter_objects("keeper", "main", prefix="recovered/"))) == 3
        with open_blob_store(namespace) as store:
            kept = {o.key for o in store.list("data/")}
        assert {f"data/{i:032x}" for i in range(3)} <= kept
        assert "data/" + "f" * 32 not in kept  # its own orphan went
