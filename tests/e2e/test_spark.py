"""quarry.spark against a real local[2] Spark session and the services on loopback: the
executors are separate Python processes that reach branch-manager over gRPC, write real
Parquet files into the storage namespace, and the driver commits and merges.

Covered: append, overwrite, a failing task, retried tasks that staged before failing, a
merge conflict, concurrent jobs on one branch, reads by branch / commit / tag / `branch@`
with uncommitted changes, bad input, the ephemeral-branch sweep, trace propagation into
the executors' calls."""

from __future__ import annotations

import json
import os
import threading
import uuid

import grpc
import pytest

import quarry.spark as qs
from quarry import errors
from quarry.spark.common import EPHEMERAL_PREFIX, JOB_DATA_PREFIX
from quarry.v1 import types_pb2
from support.suite import running_suite, suite_fixture
from support.wait import wait_until

pytestmark = pytest.mark.timeout(600)


suite = suite_fixture()


@pytest.fixture(scope="module")
def client(suite):
    with suite.client() as c:
        yield c


@pytest.fixture
def conn(suite):
    return qs.Connection(suite.targets["branch-manager"], suite.targets["committer"])


@pytest.fixture
def repo(suite, client):
    name = f"sp-{uuid.uuid4().hex[:10]}"
    client.create_repository(name, suite.namespace(name))
    return name


@pytest.fixture
def spark_writer(spark):
    """Spark's own file writer wherever it can write (also for small files, which "auto"
    leaves to the Python workers)."""
    from quarry.spark.native import FILE_WRITER_CONF

    spark.conf.set(FILE_WRITER_CONF, "spark")
    yield
    spark.conf.unset(FILE_WRITER_CONF)


def numbers(spark, start: int, stop: int, partitions: int = 4):
    return spark.range(start, stop, numPartitions=partitions).selectExpr(
        "id", "id * 2 as doubled", "concat('row-', cast(id as string)) as label"
    )


def ids(frame) -> list[int]:
    return sorted(row.id for row in frame.select("id").collect())


def paths(client, repo: str, ref: str, prefix: str = "") -> list[str]:
    return [e.path for e in client.iter_objects(repo, ref, prefix=prefix)]


def namespace_keys(suite, repo: str, prefix: str) -> list[str]:
    from quarry.blob import open_blob_store

    with open_blob_store(suite.namespace(repo)) as store:
        return [o.key for o in store.list(prefix)]


def stray_job_files(suite, client, repo: str) -> set[str]:
    """Data files of Spark jobs that did not land on main."""
    landed = {c.metadata.get("quarry.spark.job") for c in client.iter_log(repo, "main")}
    return {
        key
        for key in namespace_keys(suite, repo, JOB_DATA_PREFIX)
        if key.split("/")[2] not in landed
    }


def no_ephemeral_branches(client, repo: str) -> bool:
    return not [b.name for b in client.iter_branches(repo) if b.name.startswith(EPHEMERAL_PREFIX)]


# ---- writes ---------------------------------------------------------------------------


def test_append_is_one_commit_on_the_target_and_reads_back(spark, suite, client, conn, repo):
    before = client.get_branch(repo, "main").commit_id
    commit = qs.write(
        numbers(spark, 0, 1000),
        f"quarry://{repo}/main/tables/numbers",
        message="load numbers",
        metadata={"source": "test"},
        connection=conn,
    )

    head = client.get_branch(repo, "main")
    assert head.commit_id == commit.id and commit.parents[0] == before
    assert commit.message == "load numbers"
    assert commit.committer == "admin"  # the authenticated user (the suite's, by its key)
    assert commit.metadata["source"] == "test"
    assert commit.metadata["quarry.spark.rows"] == "1000"
    assert commit.metadata["quarry.spark.files"] == "4"
    files = list(client.iter_objects(repo, "main", prefix="tables/numbers/"))
    assert len(files) == 4
    assert all(
        f.content_type == "application/vnd.apache.parquet"
        and f.size_bytes > 0
        and f.physical_address.startswith(suite.namespace(repo) + "/" + JOB_DATA_PREFIX)
        for f in files
    )
    assert not head.dirty and no_ephemeral_branches(client, repo)

    back = qs.read(spark, f"quarry://{repo}/main/tables/numbers", connection=conn)
    assert ids(back) == list(range(1000))
    assert back.where("doubled != id * 2").count() == 0


def test_a_write_leaves_one_commit_per_message_the_users_on_the_merge(spark, client, conn, repo):
    """A full log shows the job's own commit and the merge commit: never one message twice.
    The user's message (or the default) is on the merge commit, the one `write` returns."""
    named = qs.write(
        numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", message="load", connection=conn
    )
    unnamed = qs.write(numbers(spark, 100, 130, 3), f"quarry://{repo}/main/u", connection=conn)

    log = list(client.iter_log(repo, "main"))
    messages = [c.message for c in log]
    assert len(messages) == len(set(messages)), messages
    for commit, files, message in (
        (named, 2, "load"),
        (unnamed, 3, "Spark append of u/ (parquet)"),
    ):
        job = commit.metadata["quarry.spark.job"]
        of_job = [c for c in log if c.metadata.get("quarry.spark.job") == job]
        assert sorted(c.id for c in of_job) == sorted([commit.id, commit.parents[1]])
        assert commit.message == message
        (files_commit,) = [c for c in of_job if c.id == commit.parents[1]]
        assert files_commit.message == f"Files of Spark job {job} ({files} files): {message}"
    assert [c.id for c in client.iter_log(repo, "main", first_parent=True)][:2] == [
        unnamed.id,
        named.id,
    ]


def test_second_append_adds_files_and_keeps_the_first(spark, client, conn, repo):
    uri = f"quarry://{repo}/main/t"
    qs.write(numbers(spark, 0, 100, 2), uri, connection=conn)
    qs.write(numbers(spark, 100, 300, 3), uri, connection=conn)
    assert len(paths(client, repo, "main", "t/")) == 5
    assert ids(qs.read(spark, uri, connection=conn)) == list(range(300))


def test_overwrite_replaces_the_folder_in_one_commit_and_time_travel_sees_the_old(
    spark, client, conn, repo
):
    uri = f"quarry://{repo}/main/t"
    first = qs.write(numbers(spark, 0, 100), uri, connection=conn)
    client.put_object(
        repo, "main", path="other/keep.txt", physical_address="s3://b/elsewhere", size_bytes=1
    )
    client.commit(repo, "main", "unrelated")
    second = qs.write(
        numbers(spark, 500, 550, 2), uri, mode="overwrite", message="replace", connection=conn
    )

    assert ids(qs.read(spark, uri, connection=conn)) == list(range(500, 550))
    assert len(paths(client, repo, "main", "t/")) == 2
    assert paths(client, repo, "main", "other/") == ["other/keep.txt"]
    changes = list(client.iter_diff(repo, second.parents[0], second.id))
    kinds = sorted(types_pb2.ChangeType.Name(c.type) for c in changes)
    assert kinds == ["CHANGE_TYPE_ADDED"] * 2 + ["CHANGE_TYPE_REMOVED"] * 4
    # The previous commit still reads the previous data.
    assert ids(qs.read(spark, f"quarry://{repo}/{first.id}/t", connection=conn)) == list(range(100))


@pytest.mark.parametrize("when", ["before the check", "between the check and the merge"])
def test_an_overwrite_never_keeps_a_concurrent_writes_files(
    spark, client, conn, repo, monkeypatch, when
):
    """Two overwrites of 100 rows racing left 200 rows: each deleted the files of the HEAD
    it started from, and the merge kept the other's. Another write landing under the path
    while the overwrite runs now fails it (CONCURRENT_OVERWRITE, ABORTED) with nothing
    merged, whether it lands before the overwrite checks the target or after the check,
    before its merge (the merge is conditioned on the HEAD checked)."""
    from quarry.client.committer import CommitterCalls
    from quarry.spark.writer import ConcurrentOverwrite, _Job

    uri = f"quarry://{repo}/main/t"
    qs.write(numbers(spark, 0, 100), uri, connection=conn)

    def other_write():
        client.put_object(repo, "main", path="t/other-writer.parquet", physical_address="s3://b/o")
        client.commit(repo, "main", "another writer")

    if when == "before the check":
        real = _Job._merge_overwrite

        def racing(self, *args, **kwargs):
            other_write()
            return real(self, *args, **kwargs)

        monkeypatch.setattr(_Job, "_merge_overwrite", racing)
    else:
        real_merge = CommitterCalls.merge
        raced = []

        def racing_merge(self, *args, **kwargs):
            if not raced:
                raced.append(True)
                other_write()
            return real_merge(self, *args, **kwargs)

        monkeypatch.setattr(CommitterCalls, "merge", racing_merge)
    head = client.get_branch(repo, "main").commit_id
    with pytest.raises(ConcurrentOverwrite):
        qs.write(numbers(spark, 500, 600, 2), uri, mode="overwrite", connection=conn)
    monkeypatch.undo()
    after = client.get_branch(repo, "main").commit_id
    assert client.get_commit(repo, after).parents[0] == head  # only the other write landed
    assert "t/other-writer.parquet" in paths(client, repo, "main", "t/")
    assert no_ephemeral_branches(client, repo)
    # Run again, it replaces everything there now.
    qs.write(numbers(spark, 500, 600, 2), uri, mode="overwrite", connection=conn)
    assert ids(qs.read(spark, uri, connection=conn)) == list(range(500, 600))


def test_empty_append_commits_nothing(spark, client, conn, repo):
    head = client.get_branch(repo, "main").commit_id
    commit = qs.write(numbers(spark, 0, 0, 2), f"quarry://{repo}/main/t", connection=conn)
    assert commit.id == head == client.get_branch(repo, "main").commit_id
    assert no_ephemeral_branches(client, repo)


def test_csv_and_json_formats(spark, client, conn, repo):
    qs.write(numbers(spark, 0, 50, 2), f"quarry://{repo}/main/csv", format="csv", connection=conn)
    qs.write(numbers(spark, 0, 50, 2), f"quarry://{repo}/main/json", format="json", connection=conn)
    # A round trip with no options: write's header line is read as the header (it came
    # back as rows, with columns _c0, _c1).
    as_csv = qs.read(spark, f"quarry://{repo}/main/csv", format="csv", connection=conn)
    as_json = qs.read(spark, f"quarry://{repo}/main/json", format="json", connection=conn)
    assert as_csv.count() == 50 and "id" in as_csv.columns
    assert ids(as_csv) == ids(as_json) == list(range(50))
    raw = qs.read(spark, f"quarry://{repo}/main/csv", format="csv", connection=conn, header=False)
    assert raw.count() > 50  # the caller's option wins: header lines read as rows
    # Quotes and commas in text round-trip (`say "hi"` came back as `"say ""hi"""`).
    texts = ['say "hi"', "a,b", 'both, "and"']
    frame = spark.createDataFrame([(i, t) for i, t in enumerate(texts)], "id long, text string")
    qs.write(frame, f"quarry://{repo}/main/quoted", format="csv", connection=conn)
    back = qs.read(spark, f"quarry://{repo}/main/quoted", format="csv", connection=conn)
    assert [r.text for r in back.orderBy("id").collect()] == texts
    assert {e.content_type for e in client.iter_objects(repo, "main", prefix="csv/")} == {
        "text/csv"
    }


def test_max_records_per_file_splits_task_output(spark, client, conn, repo):
    commit = qs.write(
        numbers(spark, 0, 100, 2),
        f"quarry://{repo}/main/t",
        max_records_per_file=20,
        connection=conn,
    )
    assert commit.metadata["quarry.spark.files"] == "6"  # 50 rows a task → 20+20+10
    assert len(paths(client, repo, "main", "t/")) == 6
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(range(100))


def test_partition_by_makes_hive_folders_and_reads_back_with_the_columns(spark, client, conn, repo):
    frame = numbers(spark, 0, 300, 2).selectExpr(
        "id",
        "label",
        "cast(id % 3 as int) as k",
        "case when id % 10 = 0 then null else concat('g/', cast(id % 2 as string)) end as g",
    )
    uri = f"quarry://{repo}/main/t"
    commit = qs.write(frame, uri, partition_by=["k", "g"], max_records_per_file=40, connection=conn)
    files = paths(client, repo, "main", "t/")
    assert int(commit.metadata["quarry.spark.files"]) == len(files)
    assert {f.rsplit("/", 1)[0] for f in files} == {
        f"t/k={k}/g={g}" for k in range(3) for g in ("g%2F0", "g%2F1", "__HIVE_DEFAULT_PARTITION__")
    }

    back = qs.read(spark, uri, connection=conn)
    assert back.count() == 300 and {"k", "g"} <= set(back.columns)
    assert back.where("k != id % 3 or (g is null) != (id % 10 = 0)").count() == 0
    one = qs.read(spark, f"quarry://{repo}/main/t/k=1", connection=conn)
    assert ids(one) == [i for i in range(300) if i % 3 == 1]
    cell = qs.read(spark, f"quarry://{repo}/main/t/k=2/g=g%252F1", connection=conn)
    assert ids(cell) == [i for i in range(300) if i % 3 == 2 and i % 2 == 1 and i % 10]
    assert {(r.k, r.g) for r in cell.select("k", "g").collect()} == {(2, "g/1")}
    # An overwrite of the partitioned folder replaces every partition.
    qs.write(frame.where("id < 30"), uri, mode="overwrite", partition_by="k", connection=conn)
    assert {f.rsplit("/", 1)[0] for f in paths(client, repo, "main", "t/")} == {
        "t/k=0",
        "t/k=1",
        "t/k=2",
    }
    assert ids(qs.read(spark, uri, connection=conn)) == list(range(30))
    # Dynamic partition overwrite (Spark's setting): only the partitions written change.
    spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    try:
        replaced = numbers(spark, 100, 110, 2).selectExpr("id", "label", "1 as k", "'' as g")
        qs.write(replaced, uri, mode="overwrite", partition_by="k", connection=conn)
    finally:
        spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
    assert ids(qs.read(spark, uri, connection=conn)) == [i for i in range(30) if i % 3 != 1] + list(
        range(100, 110)
    )


def _fail_after_partition_zero_wrote(namespace: str, earlier_jobs: set[str]):
    """Partition 1 fails for good, but only once this job's partition 0 file is in the
    namespace, so the job fails after another task wrote a file (the cleanup removes it)."""

    def run(batches):
        import glob
        import os
        import time

        from pyspark import TaskContext

        def written() -> bool:
            return any(
                os.path.basename(os.path.dirname(f)) not in earlier_jobs
                for f in glob.glob(f"{namespace}/data/spark/*/part-00000-*")
            )

        if TaskContext.get().partitionId() == 1:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not written():
                time.sleep(0.02)
            raise RuntimeError("injected task failure")
        yield from batches

    return run


def test_a_task_failing_for_good_leaves_the_target_unchanged(
    spark, suite, client, conn, repo, python_writer
):
    qs.write(numbers(spark, 0, 10, 1), f"quarry://{repo}/main/t", connection=conn)
    head = client.get_branch(repo, "main")
    frame = numbers(spark, 0, 400, 2).mapInArrow(
        _fail_after_partition_zero_wrote(
            suite.namespace(repo),
            {key.split("/")[2] for key in namespace_keys(suite, repo, JOB_DATA_PREFIX)},
        ),
        "id long, doubled long, label string",
    )
    with pytest.raises(Exception, match="injected task failure"):
        qs.write(frame, f"quarry://{repo}/main/t", connection=conn)

    after = client.get_branch(repo, "main")
    assert after.commit_id == head.commit_id and not after.dirty
    assert len(paths(client, repo, "main", "t/")) == 1
    assert no_ephemeral_branches(client, repo)
    # The file partition 0 wrote before the job failed is deleted with the job.
    assert len(namespace_keys(suite, repo, JOB_DATA_PREFIX)) == 1
    assert stray_job_files(suite, client, repo) == set()


def _fewer_rows_on_retry(fail_partition: int, branch_manager: str, repo: str):
    """Attempt 0 of one task leaves on the job's ephemeral branch what a write attempt that
    staged its first batch of 100 one-row files and then died leaves there (Spark runs this
    function to completion before the write task of the same attempt sees any row, so the
    staging is done here), and fails; the retry sends only the first 40 rows."""

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from quarry.client import Client

        context = TaskContext.get()
        mine = context.partitionId() == fail_partition
        table = pa.Table.from_batches(list(batches))
        if mine and context.attemptNumber() == 0:
            with Client(branch_manager, "127.0.0.1:1") as c:
                (branch,) = [
                    b.name for b in c.iter_branches(repo) if b.name.startswith("_quarry-spark-")
                ]
                job = branch[len("_quarry-spark-") :]
                c.put_objects(
                    repo,
                    branch,
                    [
                        {
                            "path": f"t/part-{job}-{fail_partition:05d}-c{i:03d}.snappy.parquet",
                            "physical_address": f"s3://b/dead/attempt/{i}",
                            "size_bytes": 1,
                        }
                        for i in range(100)
                    ],
                )
            raise RuntimeError("task died after staging")
        yield from (table.slice(0, 40) if mine else table).to_batches()

    return run


def test_retried_tasks_never_leave_duplicate_or_stray_entries(spark, client, conn, repo):
    frame = numbers(spark, 0, 300, 2).mapInArrow(
        _fewer_rows_on_retry(1, conn.branch_manager, repo), "id long, doubled long, label string"
    )
    commit = qs.write(frame, f"quarry://{repo}/main/t", max_records_per_file=1, connection=conn)
    files = paths(client, repo, "main", "t/")
    # Partition 0: 150 files; partition 1's retry: 40, which replaced 40 of the dead
    # attempt's entries; its other 60 were discarded before the commit.
    assert len(files) == len(set(files)) == 190 == int(commit.metadata["quarry.spark.files"])
    assert not [
        e
        for e in client.iter_objects(repo, "main", prefix="t/")
        if e.physical_address.startswith("s3://b/dead/")
    ]
    back = ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn))
    assert back == list(range(150)) + list(range(150, 190))


def _commit_on_target_from_an_executor(branch_manager: str, committer: str, repo: str, path: str):
    """A concurrent writer: while the job runs, someone changes `path` on main."""

    def run(batches):
        from pyspark import TaskContext

        from quarry.client import Client

        context = TaskContext.get()
        if context.partitionId() == 0 and context.attemptNumber() == 0:
            with Client(branch_manager, committer) as c:
                c.put_object(
                    repo, "main", path=path, physical_address="s3://b/changed", size_bytes=7
                )
                c.commit(repo, "main", "concurrent change")
        yield from batches

    return run


def test_a_concurrent_change_leaves_the_target_as_the_other_writer_left_it(
    spark, suite, client, conn, repo
):
    """An executor commits a change to the file the overwrite replaces: the overwrite
    fails (CONCURRENT_OVERWRITE; a merge conflict before the overwrite checked the target
    itself), the target keeps the other writer's commit, and the job leaves nothing."""
    first = qs.write(numbers(spark, 0, 10, 1), f"quarry://{repo}/main/t", connection=conn)
    (old_path,) = paths(client, repo, "main", "t/")
    frame = numbers(spark, 100, 200, 2).mapInArrow(
        _commit_on_target_from_an_executor(conn.branch_manager, conn.committer, repo, old_path),
        "id long, doubled long, label string",
    )
    with pytest.raises(errors.Aborted) as failure:
        qs.write(frame, f"quarry://{repo}/main/t", mode="overwrite", connection=conn)
    assert failure.value.reason == "CONCURRENT_OVERWRITE"

    head = client.get_branch(repo, "main")
    assert client.get_commit(repo, head.commit_id).message == "concurrent change"
    assert client.get_commit(repo, head.commit_id).parents[0] == first.id
    assert paths(client, repo, "main", "t/") == [old_path]
    assert no_ephemeral_branches(client, repo)
    assert stray_job_files(suite, client, repo) == set()


def test_two_jobs_on_one_branch_at_once_both_land(spark, client, conn, repo):
    results, failures = {}, []

    def job(name: str, start: int):
        try:
            results[name] = qs.write(
                numbers(spark, start, start + 200),
                f"quarry://{repo}/main/{name}",
                message=name,
                connection=conn,
            )
        except Exception as exc:  # reported below
            failures.append(exc)

    threads = [
        threading.Thread(target=job, args=(name, start))
        for name, start in (("left", 0), ("right", 1000))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert ids(qs.read(spark, f"quarry://{repo}/main/left", connection=conn)) == list(range(200))
    assert ids(qs.read(spark, f"quarry://{repo}/main/right", connection=conn)) == list(
        range(1000, 1200)
    )
    messages = [c.message for c in client.iter_log(repo, "main", first_parent=True)]
    assert sorted(messages[:2]) == ["left", "right"]
    assert no_ephemeral_branches(client, repo)


def test_a_merge_whose_answer_is_lost_still_succeeds_and_keeps_its_files(
    spark, suite, client, conn, repo, monkeypatch
):
    from quarry.client import Client

    real_merge = Client.merge

    def merge_then_lose_the_answer(self, *args, **kwargs):
        real_merge(self, *args, **kwargs)
        raise errors.Unavailable("connection reset after the merge landed")

    monkeypatch.setattr(Client, "merge", merge_then_lose_the_answer)
    commit = qs.write(numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", connection=conn)
    monkeypatch.undo()
    head = client.get_branch(repo, "main")
    assert commit.id == head.commit_id and len(commit.parents) == 2
    assert stray_job_files(suite, client, repo) == set()
    assert len(namespace_keys(suite, repo, JOB_DATA_PREFIX)) == 2
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(range(100))
    assert no_ephemeral_branches(client, repo)


def test_a_merge_answer_lost_on_the_wire_is_retried_with_the_same_id_and_merges_once(
    spark, suite, client, conn, repo, monkeypatch
):
    """The committer merges, the answer is lost on the way back (UNAVAILABLE), and the
    client's own retry resends the merge: its job-derived request id makes the committer
    answer with the first merge instead of merging again (allow_empty would otherwise make
    a second, empty merge commit)."""
    import quarry.client.client as client_module
    from support.lossy import DropAnswers

    dropper = DropAnswers("/quarry.v1.Committer/Merge")
    real_open = client_module.open_channel

    def open_lossy(target, **options):
        channel = real_open(target, **options)
        if target == suite.targets["committer"]:
            return grpc.intercept_channel(channel, dropper)
        return channel

    monkeypatch.setattr(client_module, "open_channel", open_lossy)
    before = client.get_branch(repo, "main").commit_id
    commit = qs.write(numbers(spark, 0, 50, 2), f"quarry://{repo}/main/t", connection=conn)
    monkeypatch.undo()
    assert dropper.dropped == 1 and len(dropper.requests) == 2
    assert dropper.requests[0].request_id == dropper.requests[1].request_id != ""
    first_parents = [c.id for c in client.iter_log(repo, "main", first_parent=True)]
    assert first_parents[:2] == [commit.id, before]  # one merge commit, not two
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(range(50))


# ---- reads ----------------------------------------------------------------------------


def test_entries_and_reads_by_branch_commit_tag_and_committed_state(spark, client, conn, repo):
    first = qs.write(numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", connection=conn)
    client.create_tag(repo, "v1", first.id)
    qs.write(numbers(spark, 100, 200, 2), f"quarry://{repo}/main/t", connection=conn)
    # Uncommitted on main: one entry removed, one added.
    removed = paths(client, repo, "main", "t/")[0]
    client.delete_object(repo, "main", removed)
    client.put_object(
        repo, "main", path="t/extra.txt", physical_address="s3://b/x", size_bytes=3, checksum="abc"
    )

    on_branch = {
        r.path: r for r in qs.entries(spark, f"quarry://{repo}/main/t/", connection=conn).collect()
    }
    committed = {
        r.path for r in qs.entries(spark, f"quarry://{repo}/main@/t/", connection=conn).collect()
    }
    listed = {e.path: e for e in client.iter_objects(repo, "main", prefix="t/")}
    assert set(on_branch) == set(listed)
    assert removed not in on_branch and "t/extra.txt" in on_branch
    assert on_branch["t/extra.txt"].size_bytes == 3 and on_branch["t/extra.txt"].checksum == "abc"
    some = next(p for p in listed if p != "t/extra.txt")
    assert on_branch[some].physical_address == listed[some].physical_address
    assert on_branch[some].metadata == dict(listed[some].metadata)
    assert committed == {e.path for e in client.iter_objects(repo, "main@", prefix="t/")}
    assert removed in committed and "t/extra.txt" not in committed

    assert ids(qs.read(spark, f"quarry://{repo}/v1/t", connection=conn)) == list(range(100))
    assert ids(qs.read(spark, f"quarry://{repo}/{first.id[:12]}/t", connection=conn)) == list(
        range(100)
    )
    assert len(ids(qs.read(spark, f"quarry://{repo}/main@/t", connection=conn))) == 200
    assert qs.entries(spark, f"quarry://{repo}/v1/nothing/", connection=conn).count() == 0


def test_a_reader_must_be_allowed_every_object_it_reads(spark, suite, client, conn, repo):
    """Spark reads range files and objects with the storage's own access, where per-object
    policies cannot act: a user with a Deny on part of what a read covers is refused before
    anything is read, and reads what the Deny cannot reach (tester hAK); a reader of a tag
    needs no fs:ReadBranch on a branch of the tag's name (it was PERMISSION_DENIED)."""
    from quarry.client.credentials import Credentials

    first = qs.write(numbers(spark, 0, 50, 2), f"quarry://{repo}/main/t", connection=conn)
    client.create_tag(repo, "v1", first.id)
    qs.write(numbers(spark, 100, 110, 1), f"quarry://{repo}/main/secret", connection=conn)
    deny = {
        "Effect": "Deny",
        "Action": ["fs:ReadObject"],
        "Resource": f"arn:quarry:fs:::repository/{repo}/object/secret/*",
    }
    tag_reads = {
        "Effect": "Allow",
        "Action": [
            "fs:ReadRepository",
            "fs:ReadCommit",
            "fs:ReadTag",
            "fs:ReadObject",
            "fs:ListObjects",
        ],
        "Resource": f"arn:quarry:fs:::repository/{repo}*",
    }

    def user_connection(name: str, statement: dict, viewer: bool) -> qs.Connection:
        client.create_user(name)
        if viewer:
            client.add_group_member("Viewers", name)
        client.create_policy(name, json.dumps({"Statement": [statement]}))
        client.attach_policy(name, user=name)
        made = client.create_credentials(name)
        key = Credentials(made.credentials.access_key_id, made.secret_access_key)
        return qs.Connection(conn.branch_manager, conn.committer, credentials=key)

    denied = user_connection(f"{repo}-denied", deny, viewer=True)
    assert sorted(ids(qs.read(spark, f"quarry://{repo}/main/t", connection=denied))) == list(
        range(50)
    )
    for uri in (f"quarry://{repo}/main/secret", f"quarry://{repo}/main/"):
        with pytest.raises(errors.PermissionDenied):
            qs.read(spark, uri, connection=denied)
        with pytest.raises(errors.PermissionDenied):
            qs.entries(spark, uri, connection=denied)
    tagged = user_connection(f"{repo}-tags", tag_reads, viewer=False)
    assert sorted(ids(qs.read(spark, f"quarry://{repo}/v1/t", connection=tagged))) == list(
        range(50)
    )
    # A branch it may not read is refused, never read as its last commit without its
    # uncommitted changes (tester hAN); a tag beside a branch of its name is read at the
    # tag's own commit, not the branch's (tester hAP).
    qs.write(numbers(spark, 50, 60, 1), f"quarry://{repo}/main/t", connection=conn)
    client.create_branch(repo, "v1", "main")
    client.put_object(repo, "main", path="t/staged.txt", physical_address="s3://b/x")
    with pytest.raises(errors.PermissionDenied):
        qs.entries(spark, f"quarry://{repo}/main/t/", connection=tagged)
    assert sorted(ids(qs.read(spark, f"quarry://{repo}/v1/t", connection=tagged))) == list(
        range(50)
    )


def test_a_developer_writes_and_the_commit_is_theirs(spark, client, conn, repo):
    """A write by a user without auth:CommitAsOtherUser (a Developer) is committed as that
    user: the Spark user (an OS account) was the default committer, refused for them once
    the driver called with the Connection's credentials (tester hAN)."""
    from quarry.client.credentials import Credentials

    user = f"{repo}-dev"
    client.create_user(user)
    client.add_group_member("Developers", user)
    made = client.create_credentials(user)
    key = Credentials(made.credentials.access_key_id, made.secret_access_key)
    developer = qs.Connection(conn.branch_manager, conn.committer, credentials=key)
    commit = qs.write(numbers(spark, 0, 20, 1), f"quarry://{repo}/main/dev", connection=developer)
    assert commit.committer == user
    assert client.get_branch(repo, "main").commit_id == commit.id


def test_entries_of_a_large_committed_listing_prune_ranges_by_prefix(spark, client, conn, repo):
    # Range files hold about 1024 entries (the committed format's target): a/ and b/ each
    # span several.
    client.put_objects(
        repo,
        "main",
        (
            {"path": f"a/{i:06d}", "physical_address": f"s3://b/p/{i}", "size_bytes": i}
            for i in range(5000)
        ),
    )
    client.put_objects(
        repo,
        "main",
        (
            {"path": f"b/{i:06d}", "physical_address": f"s3://b/q/{i}", "size_bytes": i}
            for i in range(1500)
        ),
    )
    client.commit(repo, "main", "many")
    frame = qs.entries(spark, f"quarry://{repo}/main/b/", connection=conn)
    assert frame.count() == 1500
    assert frame.agg({"size_bytes": "sum"}).collect()[0][0] == sum(range(1500))
    assert qs.entries(spark, f"quarry://{repo}/main/", connection=conn).count() == 6500


# ---- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("uri", ["s3://bucket/x", "quarry://", "quarry://repo-only"])
def test_a_bad_uri_is_invalid_argument(spark, conn, uri):
    with pytest.raises(errors.InvalidArgument) as failure:
        qs.write(numbers(spark, 0, 1, 1), uri, connection=conn)
    assert failure.value.reason == "INVALID_QUARRY_URI"


def test_bad_options_and_missing_branch(spark, client, conn, repo):
    frame = numbers(spark, 0, 1, 1)
    with pytest.raises(errors.InvalidArgument) as failure:
        qs.write(frame, f"quarry://{repo}/main/t", mode="upsert", connection=conn)
    assert failure.value.reason == "INVALID_WRITE_OPTIONS"
    with pytest.raises(errors.InvalidArgument):
        qs.write(frame, f"quarry://{repo}/main/t", format="avro", connection=conn)
    for columns in (["nope"], ["id", "id"], ["id", "doubled", "label"]):
        with pytest.raises(errors.InvalidArgument) as failure:
            qs.write(frame, f"quarry://{repo}/main/t", partition_by=columns, connection=conn)
        assert failure.value.reason == "INVALID_WRITE_OPTIONS"
    with pytest.raises(errors.NotFound) as failure:
        qs.write(frame, f"quarry://{repo}/nope/t", connection=conn)
    assert failure.value.reason == "BRANCH_NOT_FOUND"
    with pytest.raises(errors.NotFound) as failure:
        qs.read(spark, f"quarry://{repo}/main/empty", connection=conn)
    assert failure.value.reason == "NO_OBJECTS_UNDER_PATH"
    with pytest.raises(errors.InvalidArgument) as failure:
        qs.write(frame, f"quarry://{repo}/main/", mode="overwrite", connection=conn)
    assert failure.value.reason == "INVALID_WRITE_OPTIONS"
    # CSV cannot hold nested columns: refused before the job (a worker traceback after it).
    nested = frame.selectExpr("id", "array(id, id) as pair")
    jobs = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(errors.InvalidArgument) as failure:
        qs.write(nested, f"quarry://{repo}/main/n", format="csv", connection=conn)
    assert failure.value.reason == "INVALID_WRITE_OPTIONS" and "pair" in failure.value.message
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs
    # Uncommitted changes on the target: refused before any task runs.
    client.put_object(repo, "main", path="pending", physical_address="s3://b/p", size_bytes=1)
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup(None)
    with pytest.raises(errors.FailedPrecondition) as failure:
        qs.write(frame, f"quarry://{repo}/main/t", connection=conn)
    assert failure.value.reason == "DIRTY_BRANCH"
    assert spark.sparkContext.statusTracker().getJobIdsForGroup(None) == jobs_before
    assert no_ephemeral_branches(client, repo)


# ---- sweep of a dead driver's branch --------------------------------------------------


def test_sweep_drops_only_stale_ephemeral_branches(spark, client, conn, repo):
    stale = f"{EPHEMERAL_PREFIX}20200101T000000-0123456789ab"
    client.create_branch(repo, stale, "main")
    client.put_object(repo, stale, path="t/orphan", physical_address="s3://b/o", size_bytes=1)
    from quarry.spark.common import ephemeral_branch, new_job_id

    young = ephemeral_branch(new_job_id())
    client.create_branch(repo, young, "main")
    assert qs.sweep_ephemeral_branches(client, repo, dry_run=True) == [stale]
    assert stale in [b.name for b in client.iter_branches(repo)]
    assert qs.sweep_ephemeral_branches(client, repo) == [stale]
    names = [b.name for b in client.iter_branches(repo)]
    assert stale not in names and young in names


# ---- tracing --------------------------------------------------------------------------


def test_one_trace_covers_the_driver_and_the_executors_calls(spark, tmp_path, python_writer):
    from quarry import telemetry

    exporter = telemetry.use_in_memory_exporter()
    with running_suite(tmp_path) as traced:  # created after tracing is on: interceptors
        with traced.client() as c:
            c.create_repository("traced", traced.namespace("traced"))
        connection = qs.Connection(traced.targets["branch-manager"], traced.targets["committer"])
        exporter.clear()
        qs.write(numbers(spark, 0, 100, 2), "quarry://traced/main/t", connection=connection)
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "quarry.spark.write"]
    trace_id = root.context.trace_id
    puts = [
        s for s in spans if s.name.endswith("BranchManager/PutObjects") and s.kind.name == "SERVER"
    ]
    assert len(puts) == 2  # one stream per task
    assert all(s.context.trace_id == trace_id for s in puts)
    # Their parents are the executors' task spans (exported in the executor processes),
    # not any span of this process.
    local_ids = {s.context.span_id for s in spans}
    assert all(s.parent is not None and s.parent.span_id not in local_ids for s in puts)
    merges = [s for s in spans if s.name.endswith("Committer/Merge") and s.kind.name == "SERVER"]
    assert merges and all(s.context.trace_id == trace_id for s in merges)


# ---- cost of entries() and a cancelled job --------------------------------------------


def test_entries_cost_one_metarange_read_and_the_same_rpcs_whatever_the_size(
    spark, suite, client, conn, monkeypatch
):
    """The driver reads the ref (a fixed number of RPCs) and one metarange file; the range
    files are read by Spark's executors. Nothing grows with the number of entries."""
    import quarry.blob
    from quarry.blob.counting import CountingBlobStore
    from quarry.client import Client

    calls: list[str] = []
    stores: list[CountingBlobStore] = []
    real_unary, real_open = Client._unary, quarry.blob.open_blob_store

    def counting_unary(self, stub_method, name, request, before_retry=None):
        calls.append(name)
        return real_unary(self, stub_method, name, request, before_retry)

    def counting_open(namespace, settings=None):
        stores.append(CountingBlobStore(real_open(namespace, settings)))
        return stores[-1]

    monkeypatch.setattr(Client, "_unary", counting_unary)
    monkeypatch.setattr(quarry.blob, "open_blob_store", counting_open)
    costs = []
    for size in (1_000, 6_000):  # one range file, then six (1024 entries a range)
        repo = f"sp-{uuid.uuid4().hex[:10]}"
        client.create_repository(repo, suite.namespace(repo))
        client.put_objects(
            repo,
            "main",
            (
                {"path": f"p/{i:06d}", "physical_address": f"s3://b/a/{i}", "size_bytes": 1}
                for i in range(size)
            ),
        )
        client.commit(repo, "main", "load")
        calls.clear()
        stores.clear()
        assert qs.entries(spark, f"quarry://{repo}/main/p/", connection=conn).count() == size
        costs.append((sorted(calls), sum(s.counts.get("get", 0) for s in stores)))
    assert costs[0] == costs[1]
    assert costs[0][1] == 1  # the metarange


def _slow():
    # A closure, so cloudpickle ships it by value (executors cannot import this module).
    def run(batches):
        import time

        for batch in batches:
            time.sleep(30)
            yield batch

    return run


def test_a_cancelled_job_leaves_the_target_unchanged(spark, suite, client, conn, repo):
    head = client.get_branch(repo, "main").commit_id
    frame = numbers(spark, 0, 100, 2).mapInArrow(_slow(), "id long, doubled long, label string")
    outcome: list = []

    def run():
        try:
            qs.write(frame, f"quarry://{repo}/main/t", connection=conn)
            outcome.append(None)
        except Exception as exc:  # inspected below
            outcome.append(exc)

    writer = threading.Thread(target=run)
    writer.start()
    wait_until(
        lambda: [b for b in client.iter_branches(repo) if b.name.startswith(EPHEMERAL_PREFIX)],
        timeout=60,
        interval=0.05,
        what="the job's ephemeral branch",
    )
    tracker = spark.sparkContext.statusTracker()

    def tasks_running() -> bool:
        stages = (tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds())
        return any(stage is not None and stage.numActiveTasks > 0 for stage in stages)

    wait_until(tasks_running, timeout=60, interval=0.05, what="the write's tasks to run")
    spark.sparkContext.cancelAllJobs()
    writer.join(60)
    assert not writer.is_alive()
    assert outcome and outcome[0] is not None and "cancel" in str(outcome[0]).lower()
    assert client.get_branch(repo, "main").commit_id == head
    assert no_ephemeral_branches(client, repo)
    assert paths(client, repo, "main") == []


# ---- a driver that dies ---------------------------------------------------------------

DOOMED_DRIVER = """
import sys
import threading

import quarry.spark as qs
from quarry.spark.session import local_session

branch_manager, committer = sys.argv[1:3]
jobs = [arg.split("=", 1) for arg in sys.argv[3:]]  # WRITER=URI
# A task slot for each task: every job's second partition hangs, and its first must run.
spark = local_session(f"local[{2 * len(jobs)}]", "doomed-driver")
spark.sparkContext.setLogLevel("ERROR")

def second_partition_hangs(batches):
    import time
    from pyspark import TaskContext
    if TaskContext.get().partitionId() == 1:
        time.sleep(600)
    yield from batches

def write(writer, uri):
    session = spark.newSession()  # a SQL conf of its own: this job's file writer
    session.conf.set("spark.quarry.fileWriter", writer)
    frame = session.range(0, 100, numPartitions=2).mapInArrow(second_partition_hangs, "id long")
    qs.write(frame, uri, connection=qs.Connection(branch_manager, committer))

threads = [threading.Thread(target=write, args=job) for job in jobs]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


@pytest.fixture(scope="module")
def killed_driver(suite, client, tmp_path_factory):
    """A Spark driver process killed (SIGKILL, with its JVM and workers: its own session
    group) in the middle of two writes of 2 partitions each into REPOS[writer]/main/t, the
    second partition of which never ends; one driver for both tests (a driver JVM costs
    ~20 CPU-s to start). spark.quarry.fileWriter of each write:
    "python": the Python workers' writer, whose first task stages its file while the job
    runs (STAGED, seen on the job's ephemeral branch before the kill);
    "auto": Spark's writer, which stages nothing before the job commits (the kill comes once
    partition 0's committed task file is under the job's _temporary/).
    HEADS: main's commit of each repository before the writes."""
    import os
    import signal
    import subprocess
    import sys
    from types import SimpleNamespace

    repos = {}
    for writer in ("python", "auto"):
        repos[writer] = f"sp-{uuid.uuid4().hex[:10]}"
        client.create_repository(repos[writer], suite.namespace(repos[writer]))
    heads = {writer: client.get_branch(repo, "main").commit_id for writer, repo in repos.items()}
    script = tmp_path_factory.mktemp("driver") / "driver.py"
    script.write_text(DOOMED_DRIVER)
    driver = subprocess.Popen(
        [
            sys.executable,
            str(script),
            suite.targets["branch-manager"],
            suite.targets["committer"],
            *(f"{writer}=quarry://{repo}/main/t" for writer, repo in repos.items()),
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def staged_on_the_ephemeral_branch() -> list:
            repo = repos["python"]
            ephemeral = [
                b.name for b in client.iter_branches(repo) if b.name.startswith(EPHEMERAL_PREFIX)
            ]
            return list(client.iter_uncommitted(repo, ephemeral[0])) if ephemeral else []

        staged = wait_until(
            staged_on_the_ephemeral_branch,
            timeout=300,  # the driver's JVM starts first: a minute on a busy machine
            interval=0.2,
            what="the python writer's first task to stage its file",
        )
        assert staged, "the python writer's first task never staged its file"
        wait_until(
            lambda: [
                k
                for k in namespace_keys(suite, repos["auto"], JOB_DATA_PREFIX)
                if "/_temporary/0/task_" in k
            ],
            timeout=300,
            interval=0.2,
            what="Spark's writer's partition 0 committed task file under the job's _temporary/",
        )
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and its workers
        driver.wait(30)
    return SimpleNamespace(repos=repos, heads=heads, staged=staged)


def test_a_killed_driver_leaves_the_target_unchanged_and_a_sweep_and_gc_clean_up(
    spark, suite, client, conn, killed_driver
):
    import datetime as dt

    from quarry.retention import RetentionRules
    from quarry.spark.gc import collect_garbage

    repo, head = killed_driver.repos["python"], killed_driver.heads["python"]
    staged = killed_driver.staged
    # The target is untouched; the dead job's branch and file are left behind...
    assert client.get_branch(repo, "main").commit_id == head
    assert not list(client.iter_uncommitted(repo, "main"))
    (left,) = [b.name for b in client.iter_branches(repo) if b.name.startswith(EPHEMERAL_PREFIX)]
    dead_file = staged[0].entry.physical_address[len(suite.namespace(repo)) + 1 :]
    # ...GC keeps the file while the branch stages it (the job might still be running)...
    report = collect_garbage(
        spark, repo, rules=RetentionRules(7), grace=dt.timedelta(0), connection=conn
    )
    assert dead_file not in report.collectable["data"].sample
    # ...the sweep drops the stale branch, and then GC collects the file.
    assert qs.sweep_ephemeral_branches(client, repo, older_than=dt.timedelta(0)) == [left]
    swept = collect_garbage(
        spark, repo, rules=RetentionRules(7), grace=dt.timedelta(0), sweep=True, connection=conn
    )
    assert dead_file in swept.collectable["data"].sample
    assert dead_file not in namespace_keys(suite, repo, JOB_DATA_PREFIX)


# ---- Spark's own file writer (quarry.spark.native) ----------------------------------
# On a local namespace, Parquet files are written by Spark's writer (the rows never reach
# Python); `spark.quarry.fileWriter=python` forces the Python workers' writer.


def spark_written(address: str) -> bool:
    """A physical address of Spark's writer (its file names carry the write's UUID), not of
    the Python workers' (`-t<task attempt>` names)."""
    import re

    from quarry.spark.executor import SPARK_WRITER_FILE_NAME

    return re.search("/" + SPARK_WRITER_FILE_NAME + "$", address) is not None


def job_folder_keys(suite, repo: str, job: str) -> list[str]:
    return namespace_keys(suite, repo, f"{JOB_DATA_PREFIX}{job}/")


def test_spark_writes_the_files_and_its_job_folder_holds_exactly_the_committed_ones(
    spark, suite, client, conn, repo
):
    import hashlib

    from quarry.blob import read_object

    commit = qs.write(numbers(spark, 0, 1000), f"quarry://{repo}/main/t", connection=conn)
    job = commit.metadata["quarry.spark.job"]
    files = list(client.iter_objects(repo, "main", prefix="t/"))
    assert len(files) == 4 and all(spark_written(f.physical_address) for f in files)
    assert sorted(f.path for f in files) == [
        f"t/part-{job}-{p:05d}-c000.snappy.parquet" for p in range(4)
    ]
    # No _temporary/, _SUCCESS, .crc or summary file: the folder holds the entries' files.
    root = suite.namespace(repo) + "/"
    assert job_folder_keys(suite, repo, job) == sorted(
        f.physical_address[len(root) :] for f in files
    )
    for f in files:  # the entry describes the file's bytes
        data = read_object(f.physical_address)
        assert f.size_bytes == len(data) and f.checksum == hashlib.sha256(data).hexdigest()
        assert f.content_type == "application/vnd.apache.parquet"
    assert sum(int(f.metadata["quarry.spark.rows"]) for f in files) == 1000
    assert commit.metadata["quarry.spark.rows"] == "1000"
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(range(1000))


def test_both_writers_give_the_same_paths_rows_and_partition_folders(spark, client, conn, repo):
    from quarry.spark.native import FILE_WRITER_CONF

    frame = numbers(spark, 0, 300, 3).selectExpr(
        "id", "label", "cast(id % 3 as int) as k", "concat('g/', cast(id % 2 as string)) as g"
    )
    written = {}
    for writer in ("spark", "python"):
        spark.conf.set(FILE_WRITER_CONF, writer)
        try:
            commit = qs.write(
                frame,
                f"quarry://{repo}/main/{writer}",
                partition_by=["k", "g"],
                max_records_per_file=10,
                connection=conn,
            )
        finally:
            spark.conf.unset(FILE_WRITER_CONF)
        job = commit.metadata["quarry.spark.job"]
        entries = list(client.iter_objects(repo, "main", prefix=f"{writer}/"))
        assert {spark_written(e.physical_address) for e in entries} == {writer == "spark"}
        written[writer] = {
            e.path.removeprefix(f"{writer}/").replace(job, "JOB"): int(
                e.metadata["quarry.spark.rows"]
            )
            for e in entries
        }
        back = qs.read(spark, f"quarry://{repo}/main/{writer}/k=1/g=g%252F0", connection=conn)
        assert ids(back) == [i for i in range(300) if i % 3 == 1 and i % 2 == 0]
        assert {(r.k, r.g) for r in back.select("k", "g").collect()} == {(1, "g/0")}
    assert written["spark"] == written["python"]
    assert len(written["spark"]) == 3 * 6 * 2  # 3 tasks x 6 folders x (10 + 6 or 7 rows)


def test_csv_odd_partition_types_and_small_files_go_to_the_python_writer(spark, client, conn, repo):
    from quarry.spark.native import SPARK_WRITER_MIN_RECORDS_PER_FILE

    qs.write(numbers(spark, 0, 20, 2), f"quarry://{repo}/main/csv", format="csv", connection=conn)
    small = SPARK_WRITER_MIN_RECORDS_PER_FILE - 1
    qs.write(
        numbers(spark, 0, 20, 2),
        f"quarry://{repo}/main/s",
        max_records_per_file=small,
        connection=conn,
    )
    frame = numbers(spark, 0, 20, 2).selectExpr("id", "cast(id % 2 as double) as x")
    qs.write(frame, f"quarry://{repo}/main/x", partition_by="x", connection=conn)
    qs.write(
        numbers(spark, 0, 20, 2),
        f"quarry://{repo}/main/large",
        max_records_per_file=small + 1,
        connection=conn,
    )
    # A column named like Spark's writer's hidden partition columns is never replaced.
    hidden = numbers(spark, 0, 20, 2).selectExpr(
        "id", "id % 2 as k", "'mine' as __quarry_partition_0"
    )
    qs.write(hidden, f"quarry://{repo}/main/h", partition_by="k", connection=conn)
    back = qs.read(spark, f"quarry://{repo}/main/h", connection=conn)
    assert {r[0] for r in back.select("__quarry_partition_0").collect()} == {"mine"}
    entries = list(client.iter_objects(repo, "main"))
    assert {e.path.split("/")[0] for e in entries if spark_written(e.physical_address)} == {"large"}
    assert len(entries) == 2 + 2 + 4 + 2 + 4  # csv, s, x (2 tasks x 2 folders), large, h
    assert {e.path.split("/")[1] for e in entries if e.path.startswith("x/")} == {
        "x=0.0",
        "x=1.0",
    }


def test_spark_written_overwrite_replaces_the_folder_and_keeps_the_old_in_history(
    spark, suite, client, conn, repo
):
    first = qs.write(numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", connection=conn)
    second = qs.write(
        numbers(spark, 500, 530, 3), f"quarry://{repo}/main/t", mode="overwrite", connection=conn
    )
    entries = list(client.iter_objects(repo, "main", prefix="t/"))
    assert len(entries) == 3 and all(spark_written(e.physical_address) for e in entries)
    assert all(second.metadata["quarry.spark.job"] in e.path for e in entries)
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(range(500, 530))
    assert ids(qs.read(spark, f"quarry://{repo}/{first.id}/t", connection=conn)) == list(range(100))
    assert stray_job_files(suite, client, repo) == set()


def _fail_once_partition_zero_committed(namespace: str):
    """Partition 1 fails for good, but only once partition 0's task attempt has committed
    its file (into the job folder's _temporary/), so the job fails with a committed task's
    file on disk."""

    def run(batches):
        import glob
        import time

        from pyspark import TaskContext

        if TaskContext.get().partitionId() == 1:
            deadline = time.monotonic() + 60
            pattern = f"{namespace}/data/spark/*/_temporary/*/task_*/part-00000-*"
            while time.monotonic() < deadline and not glob.glob(pattern):
                time.sleep(0.02)
            raise RuntimeError("injected task failure")
        yield from batches

    return run


def test_a_failing_spark_written_job_leaves_the_target_no_entry_and_no_file(
    spark, suite, client, conn, repo
):
    qs.write(numbers(spark, 0, 10, 1), f"quarry://{repo}/main/t", connection=conn)
    head = client.get_branch(repo, "main")
    before = namespace_keys(suite, repo, JOB_DATA_PREFIX)
    frame = numbers(spark, 0, 400, 2).mapInArrow(
        _fail_once_partition_zero_committed(suite.namespace(repo)),
        "id long, doubled long, label string",
    )
    with pytest.raises(Exception, match="injected task failure"):
        qs.write(frame, f"quarry://{repo}/main/t", connection=conn)

    after = client.get_branch(repo, "main")
    assert after.commit_id == head.commit_id and not after.dirty
    assert len(paths(client, repo, "main", "t/")) == 1 and no_ephemeral_branches(client, repo)
    assert namespace_keys(suite, repo, JOB_DATA_PREFIX) == before


def test_a_failure_after_spark_committed_its_files_deletes_them(
    spark, suite, client, conn, repo, monkeypatch
):
    import quarry.spark.native as native

    before = namespace_keys(suite, repo, JOB_DATA_PREFIX)
    seen: list[str] = []

    def describe_then_fail(spec, root, key):
        seen.append(key)
        raise OSError("disk went away while describing")

    monkeypatch.setattr(native, "describe_file", describe_then_fail)
    with pytest.raises(OSError, match="disk went away"):
        qs.write(numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", connection=conn)
    assert seen and all(spark_written("/" + key) for key in seen)  # Spark had committed them
    assert namespace_keys(suite, repo, JOB_DATA_PREFIX) == before
    assert paths(client, repo, "main") == [] and no_ephemeral_branches(client, repo)


def _partial_first_attempt(fail_partition: int):
    """Attempt 0 of one task hands Spark's writer some rows and then dies (its attempt file
    is half written); the retry sends only the first 40 rows."""

    def run(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        mine = context.partitionId() == fail_partition
        table = pa.Table.from_batches(list(batches))
        if mine and context.attemptNumber() == 0:
            yield from table.slice(0, 100).to_batches()
            raise RuntimeError("task died while writing")
        yield from (table.slice(0, 40) if mine else table).to_batches()

    return run


def test_only_the_committed_task_attempts_files_become_entries(
    spark, suite, client, conn, repo, spark_writer
):
    frame = numbers(spark, 0, 300, 2).mapInArrow(
        _partial_first_attempt(1), "id long, doubled long, label string"
    )
    commit = qs.write(frame, f"quarry://{repo}/main/t", max_records_per_file=30, connection=conn)
    entries = list(client.iter_objects(repo, "main", prefix="t/"))
    # Partition 0: 150 rows in 5 files; partition 1's retry: 40 rows in 2.
    assert len(entries) == 7 == int(commit.metadata["quarry.spark.files"])
    assert all(spark_written(e.physical_address) for e in entries)
    assert ids(qs.read(spark, f"quarry://{repo}/main/t", connection=conn)) == list(
        range(150)
    ) + list(range(150, 190))
    job = commit.metadata["quarry.spark.job"]
    assert len(job_folder_keys(suite, repo, job)) == 7  # the dead attempt's file is gone


def test_many_files_are_described_on_the_executors_alike(
    spark, suite, client, conn, repo, monkeypatch, spark_writer
):
    import quarry.spark.native as native

    frame = numbers(spark, 0, 200, 2)
    on_driver = qs.write(frame, f"quarry://{repo}/main/d", max_records_per_file=10, connection=conn)
    monkeypatch.setattr(native, "DESCRIBE_ON_EXECUTORS_FILES", 1)
    jobs: list = []
    real = native._describe_on_executors
    monkeypatch.setattr(native, "_describe_on_executors", lambda *a: jobs.append(1) or real(*a))
    on_executors = qs.write(
        frame, f"quarry://{repo}/main/e", max_records_per_file=10, connection=conn
    )
    assert jobs == [1]

    def described(prefix: str, commit) -> dict:
        job = commit.metadata["quarry.spark.job"]
        return {
            e.path.removeprefix(prefix).replace(job, "JOB"): (
                e.size_bytes,
                e.metadata["quarry.spark.rows"],
                spark_written(e.physical_address),
            )
            for e in client.iter_objects(repo, "main", prefix=prefix)
        }

    assert described("d/", on_driver) == described("e/", on_executors)
    assert len(described("e/", on_executors)) == 20
    assert ids(qs.read(spark, f"quarry://{repo}/main/e", connection=conn)) == list(range(200))


def test_a_killed_driver_of_a_spark_written_job_leaves_files_that_sweep_and_gc_clean(
    spark, suite, client, conn, killed_driver
):
    import datetime as dt

    from quarry.retention import RetentionRules
    from quarry.spark.gc import collect_garbage

    repo, head = killed_driver.repos["auto"], killed_driver.heads["auto"]
    left = namespace_keys(suite, repo, JOB_DATA_PREFIX)
    assert left and all("/_temporary/" in k for k in left)
    assert client.get_branch(repo, "main").commit_id == head
    # While the job's branch is there (it might still be running) GC keeps its files, though
    # nothing stages them yet...
    report = collect_garbage(
        spark, repo, rules=RetentionRules(7), grace=dt.timedelta(0), connection=conn
    )
    assert not set(left) & set(report.collectable["data"].sample)
    # ...the sweep drops the stale branch, and then GC collects them.
    assert qs.sweep_ephemeral_branches(client, repo, older_than=dt.timedelta(0))
    swept = collect_garbage(
        spark, repo, rules=RetentionRules(7), grace=dt.timedelta(0), sweep=True, connection=conn
    )
    assert set(left) <= set(swept.collectable["data"].sample)
    assert namespace_keys(suite, repo, JOB_DATA_PREFIX) == []


def test_leftovers_of_sparks_protocol_are_deleted_and_foreign_files_left_alone(
    spark, suite, client, conn, repo, monkeypatch
):
    """What Spark's protocol might leave in the job's folder (a task attempt's file under
    _temporary/) never becomes an entry and is deleted; a file of any other shape there is
    neither an entry nor deleted (Quarry deletes only what it writes)."""
    import quarry.spark.native as native

    planted: list = []
    real = native.describe_files

    def plant_then_describe(spark_, spec, root):
        folder = f"{root}/{JOB_DATA_PREFIX}{spec.job_id}"
        (name,) = [n for n in os.listdir(folder) if n.startswith("part-00000-")]
        for relative in (f"_temporary/0/task_20261126_0001_m_000000/{name}", "notes.txt"):
            os.makedirs(os.path.dirname(f"{folder}/{relative}"), exist_ok=True)
            with open(f"{folder}/{relative}", "wb") as fh:
                fh.write(b"x")
            planted.append(f"{JOB_DATA_PREFIX}{spec.job_id}/{relative}")
        return real(spark_, spec, root)

    monkeypatch.setattr(native, "describe_files", plant_then_describe)
    commit = qs.write(numbers(spark, 0, 100, 2), f"quarry://{repo}/main/t", connection=conn)
    leftover, foreign = planted
    keys = job_folder_keys(suite, repo, commit.metadata["quarry.spark.job"])
    assert leftover not in keys and foreign in keys
    entries = list(client.iter_objects(repo, "main", prefix="t/"))
    assert len(entries) == 2 and all(spark_written(e.physical_address) for e in entries)


def test_an_unknown_file_writer_setting_is_refused_before_anything_is_written(
    spark, client, conn, repo
):
    from quarry.spark.native import FILE_WRITER_CONF

    head = client.get_branch(repo, "main").commit_id
    spark.conf.set(FILE_WRITER_CONF, "jvm")
    try:
        with pytest.raises(errors.InvalidArgument) as refused:
            qs.write(numbers(spark, 0, 10, 1), f"quarry://{repo}/main/t", connection=conn)
    finally:
        spark.conf.unset(FILE_WRITER_CONF)
    assert refused.value.reason == "INVALID_WRITE_OPTIONS"
    assert FILE_WRITER_CONF in str(refused.value)
    assert client.get_branch(repo, "main").commit_id == head and no_ephemeral_branches(client, repo)


def test_a_namespace_with_glob_characters_reads_back(spark, client, conn, suite):
    """Hadoop reads `[`, `{`, `*`, `?` in a path as a glob pattern: a namespace holding them
    was written to, then every read and entries listing said PATH_NOT_FOUND."""
    name = f"sp-{uuid.uuid4().hex[:10]}"
    namespace = suite.namespace(name) + "-[x]{y}"
    client.create_repository(name, namespace)
    uri = f"quarry://{name}/main/t"
    qs.write(numbers(spark, 0, 20, 2), uri, connection=conn)
    assert ids(qs.read(spark, uri, connection=conn)) == list(range(20))
    assert qs.entries(spark, uri + "/", connection=conn).count() == 2


def test_partition_column_names_are_escaped_in_folder_names_by_both_writers(
    spark, client, conn, repo
):
    """A column `a/b` made folders `a/b=x/` (and `k=v` made `k=v=y/`); Spark writes
    `a%2Fb=x/`. Both file writers now escape names as values are escaped."""
    from quarry.spark.native import FILE_WRITER_CONF

    frame = numbers(spark, 0, 4, 1).selectExpr("id", "cast(id % 2 as int) as `a/b`")
    folders = {}
    for writer in ("spark", "python"):
        spark.conf.set(FILE_WRITER_CONF, writer)
        try:
            qs.write(frame, f"quarry://{repo}/main/{writer}", partition_by="a/b", connection=conn)
        finally:
            spark.conf.unset(FILE_WRITER_CONF)
        folders[writer] = {
            e.path.split("/")[1] for e in client.iter_objects(repo, "main", prefix=f"{writer}/")
        }
    assert folders["spark"] == folders["python"] == {"a%2Fb=0", "a%2Fb=1"}
