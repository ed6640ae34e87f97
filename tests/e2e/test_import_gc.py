"""GC never deletes imported objects: they live outside the repository's namespace. A real
local Spark session sweeps a repository whose imported objects are referenced only by
expired commits (the import was replaced by a second one and deleted from the branch), the
case where GC would collect them if they were Quarry's."""

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
